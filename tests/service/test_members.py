"""Members (``flows.service.connectors.members``): one home for every partition, each shard's
copies in one internal partition, and the settings members refuse."""

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flows.service.connectors.members import Members, MembersError
from flows.service.runtime.options import ConfigError
from flows.service.runtime.settings import Settings
from flows.service.wire._records import internal_copy
from flows.service.wire.events import Origin
from flows.service.wire.keys import DEFAULT_SHARDS, shard_index, shard_of

TAGS = {"tsi.requests": b"r", "tsi.feedback": b"f"}
KEYS = st.text(min_size=1, max_size=20)


@given(count=st.integers(1, 16), partition=st.integers(0, 10_000))
def test_every_partition_has_exactly_one_member(count, partition):
    owners = [k for k in range(count) if Members(count, k).owns(partition)]
    assert owners == [partition % count]


@given(count=st.integers(1, 8), partitions=st.integers(1, 40))
def test_the_members_split_a_topics_partitions_the_others_lying_dormant(count, partitions):
    """Each member lists every partition (a store of an earlier layout resumes), reads its
    own and builds the others dormant: each partition read by exactly one member, a dormant
    one reading nothing and keeping its state as it was."""
    from flows.service.connectors.kafka_partition import DormantPartition
    from flows.service.connectors.kafka_source import ObservedKafkaSource
    from flows.service.connectors.stopping import Stop

    parts = [f"{p}-tsi.requests" for p in range(partitions)]
    read = []
    for k in range(count):
        source = ObservedKafkaSource(["b:9092"], ["tsi.requests"], members=Members(count, k))
        source._owned_part = lambda step, part, state: part  # no consumer built here
        for part in parts:
            built = source.build_part("in", part, {"offset": 7})
            if isinstance(built, DormantPartition):
                assert built.next_batch() == [] and built.snapshot() == {"offset": 7}
            else:
                read.append(built)
    assert sorted(read) == sorted(parts)
    Stop.ask("a test's stop")
    try:  # a stop ends a dormant partition too: else the flow never ends cleanly
        with pytest.raises(StopIteration):
            DormantPartition(None).next_batch()
    finally:
        Stop.reset()


@pytest.mark.parametrize(("count", "index"), [(0, 0), (2, 2), (3, -1)])
def test_a_member_outside_its_count_is_refused_naming_both(count, index):
    with pytest.raises(MembersError, match=f"member {index} of {count}"):
        Members(count, index)


def test_a_topic_with_fewer_partitions_than_members_is_refused_by_name():
    Members(2, 0).check_partitions({"tsi.requests": 2, "tsi.events.internal": 32})
    with pytest.raises(MembersError, match=r"topic tsi\.feedback has 1 partitions"):
        Members(2, 1).check_partitions({"tsi.requests": 4, "tsi.feedback": 1})


@given(
    key=KEYS,
    partitions=st.integers(1, 64),
    offset=st.integers(0, 2**40),
    shards=st.integers(1, 1024),
)
def test_a_copy_goes_to_its_shards_internal_partition(key, partitions, offset, shards):
    routed = (key, b"{}", Origin("tsi.feedback", 3, offset, None))
    plain = internal_copy(routed, TAGS)
    placed = internal_copy(routed, TAGS, partitions)
    assert placed[:3] == plain
    assert placed[3] == shard_index(key, DEFAULT_SHARDS) % partitions
    assert (
        internal_copy(routed, TAGS, partitions, shards)[3] == shard_index(key, shards) % partitions
    )
    assert shard_of(key) == f"shard-{shard_index(key):03d}-of-{DEFAULT_SHARDS:03d}"


@given(keys=st.lists(KEYS, min_size=2, max_size=30), members=st.integers(1, 8))
def test_with_as_many_internal_partitions_as_shards_a_shard_is_one_partition(keys, members):
    """Internal partition i carries the shards s with s % P == i: with P == DEFAULT_SHARDS, one
    shard a partition, and so one member a shard."""
    for key in keys:
        partition = internal_copy((key, b"", Origin("tsi.requests", 0, 0)), TAGS, DEFAULT_SHARDS)[3]
        assert partition == shard_index(key)
        owner = [k for k in range(members) if Members(members, k).owns(partition)]
        assert len(owner) == 1


def settings(**env: str) -> Settings:
    return Settings.from_env({"TSI_REGISTRY": "r.toml", **env})


def test_members_default_to_one_process_alone():
    assert settings().membership == Members(1, 0)
    assert settings(TSI_MEMBERS="3", TSI_MEMBER="2").membership == Members(3, 2)


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"TSI_MEMBERS": "2", "TSI_MEMBER": "2"}, "member 2 of 2"),
        ({"TSI_MEMBER": "1"}, "member 1 of 1"),
        (
            {"TSI_MEMBERS": "2", "TSI_PROCESS_ID": "0", "TSI_ADDRESSES": "a:1;b:2"},
            "choose one",
        ),
        ({"TSI_MEMBERS": "2", "TSI_TOPIC_EVENTS": "events"}, "--events-topic"),
        ({"TSI_MEMBERS": "2", "TSI_TOPIC_INTERNAL": ""}, "--internal-topic ''"),
        ({"TSI_MEMBERS": "2", "TSI_STOP_AT_END": "1"}, "--stop-at-end"),
    ],
)
def test_member_settings_that_cannot_work_are_refused(env, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        settings(**env)


def test_one_member_keeps_every_other_way_of_running():
    assert settings(TSI_TOPIC_EVENTS="events", TSI_STOP_AT_END="1").members == 1
    assert settings(TSI_PROCESS_ID="0", TSI_ADDRESSES="a:1;b:2").processes == 2
    assert Settings(registry=Path("r.toml")).membership.owns(7)


@given(
    count=st.integers(1, 8), partitions=st.integers(1, 64), shard=st.integers(0, DEFAULT_SHARDS - 1)
)
def test_a_shard_is_held_by_exactly_the_owner_of_its_internal_partition(count, partitions, shard):
    key = next(f"k{i}" for i in range(10_000) if shard_index(f"k{i}") == shard)
    partition = internal_copy((key, b"", Origin("tsi.requests", 0, 0)), TAGS, partitions)[3]
    holders = [k for k in range(count) if Members(count, k).holds(shard, partitions)]
    assert holders == [k for k in range(count) if Members(count, k).owns(partition)]
    assert len(holders) == 1 and Members(count, holders[0]).holds(shard, 0)


def check_reset(tmp_path, monkeypatch, stored, committed, layout=None, holds=False, **env):
    """``check_no_silent_reset`` of a member whose store holds ``stored`` offsets and last
    served as ``layout`` (None: never as a member), the group at ``committed``, the
    changelog holding records or not (``holds``): the partitions to start from."""
    from flows.service.runtime import startup
    from flows.service.runtime.recovery import note_layout

    store = tmp_path / "rec"
    store.mkdir(parents=True, exist_ok=True)
    if layout is not None:
        note_layout(store, layout)
    monkeypatch.setattr(startup, "group_offsets", lambda *a: dict(committed))
    monkeypatch.setattr(startup, "store_offsets", lambda d: dict(stored))
    monkeypatch.setattr(startup, "_holds", lambda *a: holds)
    options = settings(TSI_RECOVERY_DIR=str(store), TSI_GROUP_ID="g", **env)
    return startup.check_no_silent_reset(options, {}, ["tsi.requests"], [store])


def test_a_store_behind_on_partitions_another_member_served_since_rescales_with_a_changelog(
    tmp_path, monkeypatch
):
    """Member 0 of 2 restarted alone: behind the group on member 1's partitions (member 1
    served them) is a rescale, taken with a changelog (their shards are rebuilt from it),
    refused without one; behind on its own partitions stays refused."""
    from flows.service.runtime.startup import StartupError

    committed = {("tsi.requests", 0): 5, ("tsi.requests", 1): 9}
    stored = {("tsi.requests", 0): 5, ("tsi.requests", 1): 3}
    check_reset(tmp_path, monkeypatch, stored, committed, Members(2, 0), TSI_TOPIC_CHANGELOG="c")
    with pytest.raises(StartupError, match=r"member 0 of 2: other members served tsi\.req"):
        check_reset(tmp_path, monkeypatch, stored, committed, Members(2, 0), TSI_NO_CHANGELOG="1")
    with pytest.raises(StartupError, match="is behind consumer group"):  # its own partition
        check_reset(
            tmp_path, monkeypatch, stored, committed, Members(2, 1), TSI_TOPIC_CHANGELOG="c"
        )  # and a changelog that holds nothing to stand in for the store
    with pytest.raises(StartupError, match="is behind consumer group"):  # never a member
        check_reset(tmp_path / "alone", monkeypatch, stored, committed, TSI_TOPIC_CHANGELOG="c")


@pytest.mark.parametrize("layout", [Members(2, 1), Members(3, 1), None])
def test_a_store_behind_the_group_with_a_changelog_that_holds_its_state_is_moved_aside(
    tmp_path, monkeypatch, caplog, layout
):
    """Behind the group on a partition it owns (another member served it while this one
    was away, or its latest snapshots are lost): with a changelog that holds records the
    store is moved aside, kept, and the start goes on from the changelog, never a refusal
    repeated at every restart; without a changelog it stays refused."""
    from flows.service.runtime.startup import StartupError

    committed = {("tsi.requests", 1): 9}
    stored = {("tsi.requests", 1): 3}
    parts = check_reset(
        tmp_path, monkeypatch, stored, committed, layout, holds=True, TSI_TOPIC_CHANGELOG="c"
    )
    assert parts == [] and not (tmp_path / "rec").exists()
    [moved] = tmp_path.glob("rec.behind-*")
    assert any(moved.rglob("*")) or layout is None  # kept as it was
    assert "is behind consumer group 'g' on tsi.requests[1] (offset 3 < 9)" in caplog.text
    assert "moved aside to" in caplog.text and "rebuilt from changelog c" in caplog.text
    with pytest.raises(StartupError, match="is behind consumer group"):
        check_reset(tmp_path / "no", monkeypatch, stored, committed, layout, TSI_NO_CHANGELOG="1")


@pytest.mark.parametrize("note", ["", "2", "two one\n", "\x00\x00"])
def test_a_damaged_member_note_never_refuses_a_start_on_its_own(
    tmp_path, monkeypatch, note, caplog
):
    """A layout note cut short (a kill -9 while it was written, before writes were atomic)
    or garbled is taken as a service alone, logged: a store behind the group is then
    judged as its own (moved aside with a changelog), and the note is written anew."""
    from flows.service.runtime.recovery import MEMBERS_LAYOUT, last_layout, note_layout

    store = tmp_path / "rec"
    note_layout(store, Members(3, 2))
    [path] = store.rglob(MEMBERS_LAYOUT)
    path.write_text(note)
    assert last_layout(store) == Members(1, 0)
    assert "is damaged" in caplog.text
    committed, stored = {("tsi.requests", 2): 9}, {("tsi.requests", 2): 3}
    parts = check_reset(
        tmp_path, monkeypatch, stored, committed, holds=True, TSI_TOPIC_CHANGELOG="c"
    )
    assert parts == [] and list(tmp_path.glob("rec.behind-*"))
    note_layout(store, Members(3, 2))
    assert last_layout(store) == Members(3, 2) and not list(path.parent.glob("*.tmp"))


def test_stored_positions_of_topics_not_read_are_refused_and_added_topics_pass(
    tmp_path, monkeypatch
):
    """``check_stored_inputs``: a directory holding positions of a topic this run does not
    read is refused naming it; one whose topics this run reads, or that holds no commit,
    passes."""
    from flows.service.runtime import startup

    (tmp_path / "part-0.sqlite3").write_bytes(b"")
    monkeypatch.setattr(startup, "store_offsets", lambda d: {("a.events", 0): 5})
    with pytest.raises(startup.StartupError, match=r"positions of a\.events, .*reads b\.events"):
        startup.check_stored_inputs(tmp_path, ["b.events"])
    startup.check_stored_inputs(tmp_path, ["a.events", "b.events"])
    monkeypatch.setattr(startup, "store_offsets", lambda d: None)  # nothing committed yet
    startup.check_stored_inputs(tmp_path, ["b.events"])
