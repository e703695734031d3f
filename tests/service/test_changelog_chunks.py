"""Changelog records over the message limit, in chunks: split below the limit and joined
back exactly, a shrinking or deleted record tombstones the chunk keys it no longer uses,
compaction (whole or up to any offset) keeps the committed state, an incomplete chunk
set after the last marker is repaired like any uncommitted tail, and a missing or corrupt
chunk is a ``ChangelogError`` naming its key."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flows.service.instances.resting import Entry
from flows.service.shards.changelog import (
    MARKER_KEY,
    ChangelogError,
    Marker,
    MemoryChangelog,
    encode,
    replay,
)
from flows.service.shards.changelog_chunks import Assembler, ChunkedMirror, base_key, join, split
from tests.service.test_changelog import SHARD, build, events_of, held, run

LIMIT = 256  # bytes a value may hold in these tests' changelogs
KEY = "e\x1fu1"


def entry(size: int, key: str = KEY) -> Entry:
    return Entry(key, "e", "state", {"blob": "x" * size})


def commit(changelog, *entries, deleted=()):
    """One epoch: ``entries`` and tombstones of ``deleted`` sent, marked, acknowledged."""
    mirror = changelog.mirror(SHARD)
    for each in entries:
        mirror.append(each.key, encode([each]))
    for key in deleted:
        mirror.append(key, None)
    mirror.mark(Marker(len(changelog.logs.get(SHARD, [])) + 1))
    return mirror.acknowledged()


def live_keys(changelog):
    """The keys whose newest record is not a tombstone."""
    newest = {key: value for _, key, value in changelog.read(SHARD)}
    return {key for key, value in newest.items() if value is not None and key != MARKER_KEY}


@given(value=st.binary(max_size=600), limit=st.integers(25, 200))
def test_split_records_fit_the_limit_and_join_back_exactly(value, limit):
    records = split(KEY, value, limit)
    assert all(len(each) <= limit for _, each in records)
    assert {base_key(key) for key, _ in records} == {KEY} and records[-1][0] == KEY
    reader = Assembler()
    assert [reader.read(key, each) for key, each in records][-1] == (KEY, value)


def test_split_refuses_a_limit_without_room_and_a_key_holding_nul():
    with pytest.raises(ValueError, match="limit of 24 bytes"):
        split(KEY, b"x" * 100, 24)
    with pytest.raises(ValueError, match="'a\\\\x00b' holds a NUL"):
        split("a\x00b", b"x" * 100, 40)


def test_a_corrupt_whole_is_refused_naming_its_key():
    (_, first), (_, last) = split(KEY, bytes(range(50)), 49)
    with pytest.raises(ValueError, match="'e\\\\x1fu1': its 2 chunks join to 49 bytes"):
        join(KEY, last, {0: first[:-1]})


def test_a_large_entry_goes_in_chunks_and_is_read_back_exactly():
    changelog = MemoryChangelog(max_bytes=LIMIT)
    big = entry(2000)
    commit(changelog, big, entry(1, "e\x1fu2"))
    keys = [key for _, key, _ in changelog.read(SHARD)]
    assert len(keys) > 5 and all(base_key(k) == KEY for k in keys[:-3])
    assert all(len(v) <= LIMIT for _, _, v in changelog.read(SHARD))
    assert replay(changelog.read(SHARD)).entries == {KEY: big, "e\x1fu2": entry(1, "e\x1fu2")}


def test_unchunked_the_limit_is_refused_as_a_broker_would():
    changelog = MemoryChangelog(max_bytes=LIMIT)
    with pytest.raises(RuntimeError, match="bytes: over 256"):
        changelog.mirror(SHARD).mirror.append(KEY, encode([entry(2000)]))


def test_a_shrinking_then_deleted_entry_tombstones_the_chunk_keys_it_no_longer_uses():
    changelog = MemoryChangelog(max_bytes=LIMIT)
    commit(changelog, entry(2000))
    many = live_keys(changelog)
    commit(changelog, entry(600))
    fewer = live_keys(changelog)
    assert KEY in fewer and 1 < len(fewer) < len(many)
    changelog.compact()
    assert replay(changelog.read(SHARD)).entries == {KEY: entry(600)}
    commit(changelog, deleted=[KEY])
    assert live_keys(changelog) == set()
    changelog.compact()
    assert replay(changelog.read(SHARD)).entries == {}


@pytest.mark.parametrize("sizes", [(2000, 2000), (2000, 600), (600, 2000), (2000, 10)])
def test_compaction_up_to_any_offset_keeps_the_committed_entry(sizes):
    """Kafka's cleaner may stop anywhere: an older version whose chunks a newer one
    replaced no longer joins, and is no error once superseded."""
    changelog = MemoryChangelog(max_bytes=LIMIT)
    for size in sizes:
        commit(changelog, entry(size))
    records = changelog.read(SHARD)
    for upto in range(len(records)):
        each = MemoryChangelog()
        each.logs = {SHARD: list(records)}
        each.compact(upto)
        assert replay(each.read(SHARD)).entries == {KEY: entry(sizes[-1])}, upto


def test_an_incomplete_chunk_set_after_the_last_marker_is_repaired(tmp_path):
    """A big instance's epoch cut off mid-record: its chunks reached the changelog, its
    completing record did not; the committed state stands, and the rebuild repairs it."""
    changelog = MemoryChangelog(max_bytes=LIMIT)
    events = events_of([("request", 1, 0.0), ("request", 2, 0.0), ("feedback", 1, 1.0)])
    first = build(tmp_path / "first", changelog)
    run(first, events, {len(events) - 1}, set())
    committed = held(first)
    key, inner = KEY, changelog.mirror(SHARD).mirror
    assert key in committed
    for chunk, value in split(key, b"y" * 1600, LIMIT)[:-1]:
        inner.append(chunk, value)
    changelog.deliver()
    found = replay(changelog.read(SHARD))
    assert found.tail == [key] and {k: (e.kind, e.data) for k, e in found.entries.items()} == (
        committed
    )
    rebuilt = build(tmp_path / "lost", changelog)
    assert held(rebuilt) == committed
    changelog.compact()
    again = replay(changelog.read(SHARD))
    assert again.tail == [] and {k: (e.kind, e.data) for k, e in again.entries.items()} == (
        committed
    )


def test_a_shard_of_large_instances_rebuilds_from_its_chunked_changelog(tmp_path):
    changelog = MemoryChangelog(max_bytes=LIMIT)
    events = events_of([("request", u % 4, 0.0) for u in range(12)] + [("feedback", 1, 1.0)])
    first = build(tmp_path / "first", changelog)
    run(first, events, {5, len(events) - 1}, {3})
    assert any(base_key(k) != k for _, k, _ in changelog.read(SHARD))  # chunked
    changelog.compact()
    assert held(build(tmp_path / "lost", changelog)) == held(first)


def test_a_missing_or_corrupt_chunk_is_an_error_naming_the_key():
    changelog = MemoryChangelog(max_bytes=LIMIT)
    commit(changelog, entry(2000))
    records = changelog.read(SHARD)
    missing = [r for r in records if r[1] != f"{KEY}\x002"]
    with pytest.raises(ChangelogError, match=r"'e\\x1fu1': chunk 2 of .* is missing"):
        replay(missing)
    corrupt = [(o, k, v[:-1] + b"?" if k == f"{KEY}\x001" else v) for o, k, v in records]
    with pytest.raises(ChangelogError, match=r"'e\\x1fu1': its .* chunks join to"):
        replay(corrupt)


@given(
    st.lists(
        st.tuples(st.sampled_from("abcd"), st.binary(min_size=0, max_size=120)),
        min_size=1,
        max_size=12,
    )
)
def test_extend_sends_what_append_sends_record_by_record(records):
    """Many records at once (``extend``: the whole ones in one call of the mirror) leave
    the changelog exactly as appending them one by one does, chunks and the tombstones
    of chunk keys a key no longer uses included."""

    class Log:
        def __init__(self):
            self.sent = []

        def append(self, key, value):
            self.sent.append((key, value))

        def extend(self, many):
            self.sent.extend(many)

    one, many = Log(), Log()
    one_counts, many_counts = {}, {}
    single = ChunkedMirror(one, 40, one_counts)
    batched = ChunkedMirror(many, 40, many_counts)
    for key, value in records:
        single.append(key, value)
    batched.extend(records)
    assert many.sent == one.sent and many_counts == one_counts
