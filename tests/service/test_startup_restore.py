"""A start restores every shard it holds at once, before ``/ready``: the first worker's
wake-up source wakes each of them as the flow starts (``WakeUpScheduler.first``), a shard
woken so starts from its changelog there and then (not at its first event), and each
notes itself restored (``observe.restoring``)."""

import orjson

from flows.service.observe import restoring
from flows.service.observe.restoring import Restoring
from flows.service.shards.changelog import MemoryChangelog
from flows.service.shards.deadlines import WAKE_UP, WakeUps, WakeUpScheduler
from flows.service.shards.logic import logic_builder
from flows.service.wire.events import Origin, parse_request
from flows.service.wire.keys import shard_name, shard_of
from tests.service.test_wake_ups import REGISTRY

SHARDS = 4


def test_the_first_workers_source_wakes_the_starts_shards_once_and_no_other_does():
    scheduler = WakeUpScheduler(["shard-000-of-002", "shard-001-of-002"])
    source = WakeUps(scheduler, lambda: False, lambda: 0.0)
    first, other = source.build("wake_ups", 0, 2), source.build("wake_ups", 1, 2)
    assert first.next_batch() == [("shard-000-of-002", WAKE_UP), ("shard-001-of-002", WAKE_UP)]
    assert first.next_batch() == [] and other.next_batch() == []


def test_a_lost_directory_rebuilds_each_shard_at_its_start_wake_up(tmp_path, monkeypatch):
    """State mirrored to the changelog by one store directory; a new directory's shards,
    woken once each (no event), are rebuilt from it and all count as restored."""
    watch = Restoring()
    monkeypatch.setattr(restoring, "RESTORING", watch)
    monkeypatch.setattr("flows.service.shards.shard_store.RESTORING", watch)
    changelog = MemoryChangelog()
    before = logic_builder(REGISTRY, lambda: 0.0, store=tmp_path / "a", changelog=changelog,
                           shards=SHARDS, rest_after=0.0)  # fmt: skip
    units = [f"u{i}" for i in range(12)]
    by_shard = {}
    for unit in units:
        key = f"e\x1f{unit}"
        by_shard.setdefault(shard_of(key, SHARDS), []).append(key)
    for keys in by_shard.values():
        logic = before(None)
        experiment = logic.store.context.registry.current["e"]
        for key in keys:
            body = {"experiment": "e", "unit": key.split("\x1f")[1], "request_id": key}
            event = parse_request(orjson.dumps(body), Origin("t", 0, len(key)))
            logic.handle([(key, experiment, event)])
        assert logic.snapshot()["changelog"]["offset"] is not None
    names = [shard_name(i, SHARDS) for i in range(SHARDS)]
    watch.expect(names)
    after = logic_builder(REGISTRY, lambda: 0.0, store=tmp_path / "b", changelog=changelog,
                          shards=SHARDS)  # fmt: skip
    logics = {name: after(None) for name in names}
    for name, logic in logics.items():
        assert watch.problem() is not None
        logic.handle([(name, None, WAKE_UP)])
        assert logic.store.shard == name
    assert watch.counts() == (SHARDS, SHARDS) and watch.problem() is None
    for shard, keys in by_shard.items():
        store = logics[shard].store
        held = set(store.instances) | {entry.key for entry in store.resting.entries()}
        assert held == set(keys)
