"""A flood of new users: the live instances it leaves are bounded per flow (the shards
share ``NEW_LIVE``), and with recovery every one of them still reaches the shard's log
and its changelog."""

import orjson
import pytest

from flows.service.instances.registry import Registry
from flows.service.instances.resting import state_of
from flows.service.shards import shard_store as store_module
from flows.service.shards.changelog import MemoryChangelog, replay
from flows.service.shards.logic import logic_builder
from flows.service.wire.events import Origin, parse_request
from flows.service.wire.keys import instance_key, shard_of

REGISTRY = Registry.from_toml('[experiments.e]\narms = ["a", "b"]\nper_unit = true\n')


def new_users(first, n):
    """Routed requests of ``n`` new users, from unit ``first`` on, each at its own offset."""
    out = []
    for unit in range(first, first + n):
        body = {"experiment": "e", "unit": f"u{unit}", "request_id": "r1"}
        event = parse_request(orjson.dumps(body), Origin("in", 0, unit, 0.0))
        out.append((instance_key("e", f"u{unit}"), REGISTRY["e"], event))
    return out


def flood(logic, calls, per_call, close_every=None):
    """``calls`` calls of ``per_call`` new users each (an epoch's close after every
    ``close_every`` calls); the most instances live at once."""
    peak = 0
    for call in range(calls):
        out = logic.handle(new_users(call * per_call, per_call))
        assert len(out) == per_call
        peak = max(peak, len(logic.store.instances))
        if close_every and (call + 1) % close_every == 0:
            logic.snapshot()
    return peak


def test_the_live_new_instances_are_bounded_per_flow_not_per_shard(monkeypatch):
    """Each shard of a flow of many shards turns its generation after its share of new
    keys, so the flood's live instances over all the shards stay about the same whatever
    the shard count (a shard here stands for one of ``shards``, each flooded alike)."""
    monkeypatch.setattr(store_module, "NEW_LIVE", 400)
    monkeypatch.setattr(store_module, "NEW_MIN", 5)
    peaks = {}
    for shards in (1, 8, 80, 1000):
        build = logic_builder(
            REGISTRY, clock=lambda: 0.0, snapshots=False, rest_after=1e9, shards=shards
        )
        logic = build(None)
        assert logic.store.new_per_generation == max(5, 400 // shards)
        peaks[shards] = flood(logic, calls=60, per_call=5)
        held = len(logic.store.instances) + len(logic.store.resting)
        assert held == 300  # nothing lost
    assert peaks[1] == 300  # 300 new keys: a one-shard flow's share is never reached
    assert peaks[8] <= 4 * 50 and peaks[80] <= 4 * 5 + 5 and peaks[1000] <= 4 * 5 + 5


def test_a_flow_without_shards_is_refused():
    """A shard count under one names the bad value."""
    with pytest.raises(ValueError, match="at least one shard, got 0"):
        store_module.new_per_generation(0)


def test_a_flood_put_to_rest_early_is_all_in_the_log_and_the_changelog(monkeypatch, tmp_path):
    """With recovery and a changelog, the instances a flood puts to rest within an epoch
    are written first: after the close, the shard's log and its changelog (to its last
    marker) hold every user, in the state the shard holds."""
    monkeypatch.setattr(store_module, "NEW_LIVE", 20)
    changelog = MemoryChangelog()
    logic = logic_builder(
        REGISTRY,
        clock=lambda: 0.0,
        store=tmp_path,
        rest_after=1e9,
        changelog=changelog,
        shards=1,
    )(None)
    peak = flood(logic, calls=100, per_call=10, close_every=40)
    logic.snapshot()
    changelog.deliver()
    assert peak <= 4 * 20 and len(logic.store.resting) > 900  # rested within the epochs
    held = {e.key: state_of(e) for e in logic.store._all_entries()}
    assert len(held) == 1_000
    found = replay(changelog.read(shard_of(instance_key("e", "u0"), shards=1))).entries
    assert {key: state_of(entry) for key, entry in found.items()} == held
