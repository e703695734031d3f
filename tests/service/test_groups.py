"""Key groups: one Bytewax key holds several shards, serves them in one call, closes them
with one changelog wait, and takes over the state of a key of one shard (a store from
before groups)."""

import orjson
import pytest
from bytewax.operators import StatefulBatchLogic

from flows.service.instances.registry import Registry
from flows.service.shards.changelog import MARKER_KEY, MemoryChangelog
from flows.service.shards.deadlines import WakeUpScheduler
from flows.service.shards.group_logic import GroupLogic, Retired, group_builder
from flows.service.shards.logic import flow_context, logic_builder
from flows.service.wire._records import selection_json
from flows.service.wire.events import Origin, parse_request
from flows.service.wire.keys import group_of, instance_key, shard_of

REGISTRY = Registry.from_toml('[experiments.e]\narms = ["a", "b", "c"]\nper_unit = true\n')
SHARDS = 16  # eight groups of two shards
UNITS = ("u1", "u35")  # shards 9 and 1 of 16: both of group 1
KEYS = [instance_key("e", unit) for unit in UNITS]
NOW = 1_000.0


def routed(unit, rid, offset=0):
    body = orjson.dumps({"experiment": "e", "unit": unit, "request_id": rid})
    event = parse_request(body, Origin("in", 0, offset, NOW))
    return (instance_key("e", unit), REGISTRY["e"], event)


def parts(*units, rid="r1"):
    """One group's item: (shard, [its event]) for each unit."""
    return [(shard_of(instance_key("e", u), SHARDS), [routed(u, rid)]) for u in units]


def context(**kwargs):
    return flow_context(REGISTRY, clock=lambda: NOW, shards=SHARDS, **kwargs)


def test_the_units_fall_in_two_shards_of_one_group():
    shards = [shard_of(key, SHARDS) for key in KEYS]
    assert shards[0] != shards[1]
    assert group_of(shards[0], SHARDS) == group_of(shards[1], SHARDS) == "group-001-of-008"


def test_one_call_serves_several_shards_and_each_store_holds_only_its_own():
    group = group_builder(context())(None)
    [(selections, dead)], keep = group.on_batch([parts(*UNITS)])
    assert keep is StatefulBatchLogic.RETAIN and not dead
    assert [key for key, _ in selections] == KEYS
    for key in KEYS:
        store = group.shards[shard_of(key, SHARDS)].store
        assert list(store.instances) == [key] and store.shard == shard_of(key, SHARDS)
    assert group.group == "group-001-of-008"


def test_a_group_resumes_every_shard_from_its_snapshot():
    group = GroupLogic(context())
    group.handle(parts(*UNITS))
    state = group.snapshot()
    assert state["group"] == "group-001-of-008"
    assert sorted(state["shards"]) == sorted(shard_of(key, SHARDS) for key in KEYS)
    again = group_builder(context())(state)
    out = again.handle(parts(*UNITS, rid="r2"))
    assert [orjson.loads(selection_json(o))["round"] for o in out] == [2, 2]  # each went on


def test_a_group_close_waits_once_for_all_its_shards(tmp_path):
    changelog = MemoryChangelog()
    group = GroupLogic(context(store=tmp_path, changelog=changelog, rest_after=0.0))
    group.handle(parts(*UNITS))
    state = group.snapshot()
    assert changelog.waits == 1  # one wait, two shards' epochs
    for shard, held in state["shards"].items():
        assert held["changelog"]["seq"] == 1
        [marker] = [offset for offset, key, _ in changelog.read(shard) if key == MARKER_KEY]
        assert held["changelog"]["offset"] == marker
    group.handle(parts(*UNITS, rid="r2"))
    group.snapshot()
    assert changelog.waits == 2


def test_a_close_with_nothing_sent_waits_for_nothing(tmp_path):
    changelog = MemoryChangelog()
    group = GroupLogic(context(store=tmp_path, changelog=changelog))
    group.handle(parts(*UNITS))
    group.snapshot()
    group.snapshot()  # nothing new since
    assert changelog.waits == 1


def test_a_resumed_state_of_neither_kind_is_refused_by_name():
    with pytest.raises(ValueError, match=r"neither a key group's nor a shard's: keys \['x'\]"):
        group_builder(context())({"x": 1})


def test_a_key_of_one_shard_hands_its_state_to_its_group_and_then_goes():
    """A store from before groups: the resumed key of one shard hands its state over, the
    group takes it at its next call (an event of another shard), and once the group has
    snapshotted it the old key discards itself."""
    [old, other] = [shard_of(key, SHARDS) for key in KEYS]
    before = logic_builder(REGISTRY, clock=lambda: NOW, shards=SHARDS)(None)
    before.on_batch([[routed(UNITS[0], "r1")]])
    old_state = before.snapshot()
    assert old_state["shard"] == old

    shared = context(wake_ups=WakeUpScheduler())
    build = group_builder(shared)
    retired = build(old_state)
    assert isinstance(retired, Retired) and shared.handover == {old: old_state}
    assert shared.wake_ups.queue().due(NOW) == [old]  # its group is woken to take it
    assert retired.on_notify() == ([], StatefulBatchLogic.RETAIN)  # not taken yet
    group = build(None)
    group.handle(parts(UNITS[1]))  # another shard's event: the group takes the old one
    assert shared.handover == {} and sorted(group.shards) == sorted([old, other])
    assert retired.on_notify() == ([], StatefulBatchLogic.RETAIN)  # not snapshotted yet
    assert retired.snapshot() is old_state  # kept as it was meanwhile
    state = group.snapshot()
    assert sorted(state["shards"]) == sorted([old, other])
    assert retired.on_notify() == ([], StatefulBatchLogic.DISCARD)
    [answer] = group.handle(parts(UNITS[0], rid="r2"))
    assert orjson.loads(selection_json(answer))["round"] == 2  # the old shard's instance went on


def test_a_group_holding_the_shard_keeps_its_own_state_over_a_stale_handover():
    """A restart before the old key's discard was committed: the group's own state of
    the shard is the newer, and the stale one is dropped."""
    [old, _] = [shard_of(key, SHARDS) for key in KEYS]
    before = logic_builder(REGISTRY, clock=lambda: NOW, shards=SHARDS)(None)
    before.on_batch([[routed(UNITS[0], "r1")]])
    stale = before.snapshot()
    group = GroupLogic(context())
    group.handle(parts(UNITS[0]))
    group.handle(parts(UNITS[0], rid="r2"))
    newer = group.snapshot()

    shared = context()
    build = group_builder(shared)
    resumed, retired = build(newer), build(stale)
    [answer] = resumed.handle(parts(UNITS[0], rid="r3"))
    assert orjson.loads(selection_json(answer))["round"] == 3 and shared.handover == {}
    resumed.snapshot()
    assert retired.on_eof() == ([], StatefulBatchLogic.DISCARD)
    assert old in shared.adopted
