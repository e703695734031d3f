"""A shard's log mirrored to its changelog: read back to its last marker, the changelog
rebuilds the instances the local log holds (the same packed bytes), whatever was written
after that marker is dropped and repaired, a rebuilt shard drops the input it already
holds, and a changelog that cannot be read is a dead letter, never a crash."""

import copy

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flows.service.instances.registry import Registry
from flows.service.instances.resting import state_of
from flows.service.shards.changelog import (
    MARKER_KEY,
    ChangelogError,
    MemoryChangelog,
    replay,
)
from flows.service.shards.logic import logic_builder
from flows.service.wire.events import Origin, Request, parse_feedback, parse_request
from flows.service.wire.keys import instance_key, shard_of

REGISTRY = Registry.from_toml(
    '[experiments.e]\narms = ["a", "b", "c"]\nper_unit = true\nfeedback_ttl = 50\n'
    "retry_window = 100\n"
)
SHARD = shard_of(instance_key("e", "u0"), shards=1)  # these tests' logics: one shard
NOW = [1_000.0]  # the clock: each event's own time (``feed``), the same in a replay
STEP = 20.0  # seconds between two events: tickets expire and kept answers go


def build(store, changelog, resume=None):
    """A shard's logic; without ``resume`` (Bytewax holds nothing of it), started as its
    first event would start it."""
    logic = logic_builder(
        REGISTRY, clock=lambda: NOW[0], store=store, rest_after=0.0, changelog=changelog, shards=1
    )(resume)
    if resume is None:
        logic.store._start(SHARD, None)
    return logic


def events_of(ops):
    """Routed events of ``ops``: (kind, unit, loss); each from input partition unit % 2,
    with its own offset there."""
    offsets, asked, out = [0, 0], {}, []
    for kind, unit, loss in ops:
        part = unit % 2
        origin = Origin("in", part, offsets[part], 1_000.0 + STEP * len(out))  # its Kafka time
        offsets[part] += 1
        asked[unit] = asked.get(unit, 0) + (kind == "request")
        body = {"experiment": "e", "unit": f"u{unit}", "request_id": f"r{asked[unit]}"}
        if kind == "request":
            event = parse_request(orjson.dumps(body), origin)
        else:
            event = parse_feedback(orjson.dumps({**body, "loss": loss}), origin)
        out.append((instance_key("e", f"u{unit}"), REGISTRY["e"], event))
    return out


def states(logic):
    """{key: Instance.to_dict()} of every instance a shard holds: what it holds, however
    it holds it (a retry answered builds a kept answer into an entry, the same answer)."""
    return {e.key: state_of(e) for e in logic.store._all_entries()}


def held(logic):
    """{key: (kind, data)} of every instance a shard holds, as entries (packed bytes)."""
    return {e.key: (e.kind, e.data) for e in logic.store._all_entries()}


def feed(logic, events, first=0):
    """Handle each event at its own time (its index from ``first``), then what is due;
    {(instance, request_id): (arm, prob)} of the selections."""
    answers = {}
    for at, routed in enumerate(events, first):
        answers.update(step(logic, at, routed))
    return answers


def step(logic, at, routed):
    NOW[0] = 1_000.0 + STEP * at
    out = logic.handle([routed]) + logic.wake()
    return {(o.instance, o.request_id): (o.arm, o.prob) for o in out if hasattr(o, "arm")}


def run(logic, events, closes, turns):
    """Feed ``events``; an epoch closes after those at ``closes`` (their snapshots, with the
    index of the event after each), generations turn after those at ``turns``."""
    snapshots = []
    for at, routed in enumerate(events):
        logic.answers = {**getattr(logic, "answers", {}), **step(logic, at, routed)}
        if at in turns:
            logic.store.generations.turned = float("-inf")
            logic.handle([])
        if at in closes:
            snapshots.append((logic.snapshot(), at + 1))
    return snapshots


OPS = st.lists(
    st.tuples(
        st.sampled_from(["request", "request", "feedback"]),
        st.integers(0, 7),
        st.sampled_from([0.0, 1.0, 3.0]),
    ),
    min_size=5,
    max_size=80,
)
PLACES = st.sets(st.integers(0, 79), max_size=12)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=OPS, closes=PLACES, turns=PLACES, compacted=st.booleans())
def test_the_changelog_to_its_last_marker_rebuilds_what_the_local_log_holds(
    tmp_path_factory, ops, closes, turns, compacted
):
    """A shard's local log and its changelog, each read back to the last marker, give
    the same instances; what the changelog holds after that marker (an epoch never
    closed, delivered before a crash) counts for neither, even once compacted."""
    events = events_of(ops)
    changelog = MemoryChangelog()
    logic = build(tmp_path_factory.mktemp("local"), changelog)
    snapshots = run(logic, events, closes | {len(events) // 2}, turns)
    last, _ = snapshots[-1]
    feed(logic, events[: len(events) // 3], len(events))  # after the last marker: dropped
    logic.store.generations.turned = float("-inf")
    logic.handle([])  # written ahead of a close that never comes
    changelog.deliver()
    if compacted:  # what follows the last marker is younger than min.compaction.lag.ms
        changelog.compact(last["changelog"]["offset"])
    rebuilt = build(tmp_path_factory.mktemp("lost"), copy.deepcopy(changelog))
    local = build(logic.store.log.directory, changelog, last)  # repairs the changelog
    assert held(rebuilt) == held(local)
    assert rebuilt.handle([]) == [] and local.handle([]) == []  # nothing lost
    changelog.compact()  # what the repair wrote keeps the committed values
    assert held(build(tmp_path_factory.mktemp("again"), changelog)) == held(local)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=OPS, closes=PLACES, turns=PLACES, crash=st.integers(0, 79), disk=st.booleans())
def test_a_crash_with_or_without_its_disk_applies_every_event_once(
    tmp_path_factory, ops, closes, turns, crash, disk
):
    """A crash anywhere, then a restart: from the local log at the epoch Bytewax committed
    (one before the last the changelog marked), the input read again from there; or, the
    disk lost, rebuilt from the changelog, the input read again from its start. Either
    way the state ends as an uninterrupted run's."""
    events = events_of(ops)
    crash = min(crash, len(events))
    oracle = build(None, None)
    feed(oracle, events)
    changelog = MemoryChangelog()
    store = tmp_path_factory.mktemp("local")
    first = build(store, changelog)
    snapshots = run(first, events[:crash], closes, turns)
    changelog.deliver()  # what was sent when it was killed
    committed, resumed_at = snapshots[-2] if len(snapshots) > 1 else (None, 0)
    committed_at = resumed_at
    if disk:
        restarted = build(store, changelog, committed)
    else:
        restarted, resumed_at = build(tmp_path_factory.mktemp("lost"), changelog), 0
    again = feed(restarted, events[resumed_at:], resumed_at)
    assert states(restarted) == states(oracle)
    # what the epochs after the committed one answered (perhaps never written) is answered
    # again, the same, disk or no disk
    marked = 1_000.0 + STEP * (snapshots[-1][1] - 1) if snapshots else 0.0  # the last marker
    uncommitted = {  # those the changelog holds an answer of still, if it holds them
        (key, e.request_id)
        for key, _, e in events[committed_at:crash]
        if isinstance(e, Request) and e.origin.time + REGISTRY["e"].retry_window >= marked
    }
    asked = uncommitted & set(getattr(first, "answers", {}))
    assert {rid: again.get(rid) for rid in asked} == {rid: first.answers[rid] for rid in asked}
    restarted.snapshot()
    assert states(build(tmp_path_factory.mktemp("later"), changelog)) == states(oracle)


def test_a_shard_another_process_served_since_is_rebuilt_from_the_changelog(tmp_path):
    """A local log older than the changelog's markers of another lineage (the shard moved
    to another process and back): the changelog wins."""
    changelog = MemoryChangelog()
    events = events_of([("request", u, 0.0) for u in range(6)])
    here = build(tmp_path / "here", changelog)
    run(here, events[:3], {2}, set())
    mine = here.snapshot()
    there = build(tmp_path / "there", changelog)  # the other process: rebuilt, then serves
    run(there, events, {len(events) - 1}, set())
    back = build(tmp_path / "here", changelog, mine)
    assert held(back) == held(there) and back.handle([]) == []


def test_a_damaged_local_log_with_a_good_changelog_is_rebuilt_without_a_dead_letter(tmp_path):
    changelog = MemoryChangelog()
    logic = build(tmp_path, changelog)
    run(logic, events_of([("request", u, 0.0) for u in range(9)]), {8}, set())
    marker = logic.snapshot()
    path = tmp_path / f"{SHARD}.{marker['store']['gen']}.log"
    path.write_bytes(path.read_bytes()[:-5])
    resumed = build(tmp_path, changelog, marker)
    assert resumed.handle([]) == [] and held(resumed) == held(logic)
    assert resumed.store.changelog.guard
    assert resumed.handle([(SHARD, None, NOW[0])]) == []  # a wake-up


class Unreadable(MemoryChangelog):
    def read(self, shard, after=-1):
        raise ChangelogError("the broker did not answer")


def test_a_changelog_that_cannot_be_read_is_a_dead_letter_and_the_shard_serves_on(tmp_path):
    logic = build(tmp_path, Unreadable())
    [letter] = logic.handle([])
    assert letter.reason == "state_lost" and "the broker did not answer" in letter.detail
    [selection] = logic.handle(events_of([("request", 1, 0.0)]))
    assert selection.request_id == "r1"


def test_markers_end_each_epoch_and_only_epochs_that_changed_something():
    changelog = MemoryChangelog()
    logic = build(None, changelog)  # no store: nothing mirrored
    logic.handle(events_of([("request", 1, 0.0)]))
    logic.snapshot()
    assert changelog.logs == {}


def test_an_epoch_close_marks_after_its_records_and_an_idle_close_marks_nothing(tmp_path):
    changelog = MemoryChangelog()
    logic = build(tmp_path, changelog)
    logic.handle(events_of([("request", 1, 0.0), ("request", 2, 0.0)]))
    first = logic.snapshot()["changelog"]
    keys = [key for _, key, _ in changelog.read(SHARD)]
    assert keys[-1] == MARKER_KEY and set(keys[:-1]) == {instance_key("e", f"u{u}") for u in (1, 2)}
    assert first["seq"] == 1 and first["seen"] == {("in", 0): 0, ("in", 1): 0}
    assert logic.snapshot()["changelog"] == first and len(changelog.read(SHARD)) == len(keys)
    assert replay(changelog.read(SHARD)).marker.seen == first["seen"]


def test_a_shard_of_another_shard_count_leaves_the_changelog_alone(tmp_path):
    """Its index names another shard's partition: it neither reads nor writes it."""
    changelog = MemoryChangelog()
    run(build(tmp_path / "a", changelog), events_of([("request", 1, 0.0)]), {0}, set())
    before = copy.deepcopy(changelog.logs)
    foreign = logic_builder(REGISTRY, store=tmp_path / "b", changelog=changelog, shards=1)(
        {"shard": "shard-000-of-002", "store": {"gen": 1, "end": 0}}
    )
    assert "foreign_shard" in [letter.reason for letter in foreign.handle([])]
    foreign.snapshot()
    assert changelog.logs == before and changelog.sent == {}


def test_a_shard_another_member_holds_lies_dormant_and_is_rebuilt_when_held_again(tmp_path):
    """A member's store resumes a shard another member now holds (an earlier layout): it
    reads and writes nothing of the changelog, wants no wake-up and snapshots its resume
    state unchanged; held again after the other member served it, it is rebuilt."""
    changelog = MemoryChangelog()
    events = events_of([("request", u, 0.0) for u in range(6)])
    here = build(tmp_path / "here", changelog)
    run(here, events[:3], {2}, set())
    mine = here.snapshot()
    there = build(tmp_path / "there", changelog)  # the other member: rebuilt, then serves
    run(there, events, {len(events) - 1}, set())
    written = copy.deepcopy(changelog.logs)
    dormant = logic_builder(
        REGISTRY, store=tmp_path / "here", changelog=changelog, holds=bool, shards=1
    )(
        copy.deepcopy(mine)  # holds(0) is False: shard 0 is not this member's
    )
    assert dormant.store.wake_at() is None and dormant.notify_at() is None
    assert dormant.wake() == [] and dormant.snapshot() == mine
    assert changelog.logs == written and changelog.sent == {}
    back = build(tmp_path / "here", changelog, mine)
    assert held(back) == held(there) and back.handle([]) == []


def test_a_request_read_again_is_dropped_where_feedback_waits_under_its_id(tmp_path):
    """Rebuilt from the changelog, a shard reads its input again from the start: a request
    whose instance holds only early feedback for the same request id (a second feedback,
    after the first took the ticket) is applied already and dropped, not served again."""
    ops = [("request", 0, 0.0)] * 2 + [("request", 1, 0.0), ("feedback", 1, 0.0)]
    events = events_of(ops + [("request", 0, 0.0)] * 5 + [("feedback", 1, 0.0)])
    oracle = build(None, None)
    feed(oracle, events)
    changelog = MemoryChangelog()
    first = build(tmp_path / "first", changelog)
    run(first, events, {len(events) - 1}, set())
    changelog.deliver()
    rebuilt = build(tmp_path / "lost", changelog)
    assert rebuilt.store.changelog.guard  # it drops what it holds
    again = feed(rebuilt, events)
    assert states(rebuilt) == states(oracle)
    assert again.items() <= first.answers.items()  # answered again, if at all, the same
