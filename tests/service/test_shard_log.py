"""Shards and their logs: a snapshot appends what its epoch touched, a restart reads up to
the committed marker, compaction keeps the generation a lagging commit names, damage is
a dead letter and never a crash or a silent reset."""

import shutil

import orjson
import pytest

from flows.service.instances.registry import LiveRegistry, Registry
from flows.service.instances.resting import Entry, Resting, revive, state_of
from flows.service.shards.logic import logic_builder
from flows.service.shards.shard_log import read_payloads, read_records, write_seed
from flows.service.wire.events import Origin, parse_feedback, parse_request
from flows.service.wire.keys import instance_key, shard_of, split_key

REGISTRY = Registry.from_toml(
    '[experiments.e]\narms = ["a", "b", "c"]\nper_unit = true\nfeedback_ttl = 50\n'
)
SHARD = shard_of(instance_key("e", "u0"), shards=1)  # these tests' logics: one shard
NOW = [1_000.0]  # the tests' clock


def key(unit):
    return instance_key("e", unit)


def event(kind, unit, rid, **extra):
    body = {"experiment": "e", "unit": unit, "request_id": rid, **extra}
    parse = parse_request if kind == "request" else parse_feedback
    return instance_key("e", unit), REGISTRY["e"], parse(orjson.dumps(body), Origin("t", 0, 1))


def served(logic, unit, rid, loss=None):
    """Request (and, with ``loss``, its feedback) for one unit: the selections."""
    out = logic.handle([event("request", unit, rid)])
    if loss is not None:
        logic.handle([event("feedback", unit, rid, loss=loss)])
    return [(s.request_id, s.arm, s.prob) for s in out]


def build(store, resume=None, registry=REGISTRY, rest_after=1e9):
    return logic_builder(
        registry, clock=lambda: NOW[0], store=store, rest_after=rest_after, shards=1
    )(resume)


def later(logic, seconds=60.0):
    """Time passes beyond the retry window: kept answers go, the instances become idle."""
    NOW[0] += seconds
    logic.wake()


def test_a_snapshot_appends_only_what_its_epoch_touched(tmp_path):
    logic = build(tmp_path)
    for unit in range(2000):
        served(logic, f"u{unit}", "r0", loss=float(unit % 7))
    first = logic.snapshot()["store"]  # the first snapshot is a whole base
    served(logic, "u5", "r1", loss=1.0)
    second = logic.snapshot()["store"]
    # one instance (about 1 KB: its packed row, its kept answers) and the record's fixed
    # part (its experiment's packing, once a record): less than two records' worth
    appended = second["end"] - first["end"]
    assert second["gen"] == first["gen"] and appended < 1536 and appended < first["end"] / 100
    assert logic.snapshot()["store"] == second  # an untouched epoch appends nothing


def test_a_restart_resumes_at_the_marker_and_drops_uncommitted_epochs(tmp_path):
    logic = build(tmp_path)
    for unit in range(50):
        served(logic, f"u{unit}", "r0", loss=float(unit % 5))
    later(logic)
    served(logic, "open", "r0")  # a ticket still waiting at the marker
    committed = logic.snapshot()
    answers = [served(logic, f"u{unit}", "r1", loss=2.0) for unit in range(10)]
    logic.snapshot()  # an epoch Bytewax never committed: cut off on resume
    resumed = build(tmp_path, committed)
    assert (
        key("u3") in resumed.store.resting and key("u3") not in resumed.store.instances
    )  # idle: on demand
    again = [served(resumed, f"u{unit}", "r1", loss=2.0) for unit in range(10)]
    assert again == answers  # the same state: the same answers
    size = (tmp_path / f"{SHARD}.{committed['store']['gen']}.log").stat().st_size
    assert size == committed["store"]["end"]
    # waiting on its ticket, an instance rests too, by its deadline: it expires on time
    assert key("open") in resumed.store.resting and key("open") not in resumed.store.instances
    NOW[0] += 60.0
    assert [(d.reason, d.instance) for d in resumed.wake()] == [("ticket_expired", key("open"))]


def test_instances_written_within_an_epoch_count_once_a_marker_covers_them(tmp_path):
    """Instances put to rest before an epoch closes are written then; a restart from the
    marker before ignores them, one from the marker after has them, and that epoch's
    close writes nothing more for them."""
    store = tmp_path / "store"
    logic = build(store, rest_after=0.0)
    for unit in range(30):
        served(logic, f"u{unit}", "r0", loss=float(unit % 3))
    later(logic)
    committed = logic.snapshot()
    answers = [served(logic, f"u{unit}", "r1", loss=2.0) for unit in range(10)]
    later(logic)
    for _ in range(3):  # generations turn: the ten are written and put to rest
        logic.handle([])
    written = logic.store.log.end
    assert written > committed["store"]["end"] and key("u3") in logic.store.resting
    covering = logic.snapshot()
    assert covering["store"]["end"] == written  # nothing left to write at the close
    shutil.copytree(store, tmp_path / "copy")  # a restart cuts its log: one each
    before, after = build(store, committed), build(tmp_path / "copy", covering)
    assert [served(before, f"u{unit}", "r1", loss=2.0) for unit in range(10)] == answers
    probe = [served(logic, f"u{unit}", "r2", loss=1.0) for unit in range(10)]
    assert [served(after, f"u{unit}", "r2", loss=1.0) for unit in range(10)] == probe


def turn(logic):
    """A generation of changed keys turns at the shard's next call (REST_AFTER passed)."""
    logic.store.generations.turned = float("-inf")
    logic.handle([])


def test_a_close_only_writes_and_the_calls_after_it_put_to_rest(tmp_path):
    """An epoch's close writes what changed and leaves resting to the calls after it (the
    close is the tail of the decision latency): those rest without a second write, and
    one that changed after the close is written again with its new state, once its
    generation turns, and never put to rest with the close's state."""
    logic = build(tmp_path)  # generations turn only when the test says (turn)
    units = [f"u{unit}" for unit in range(300)]  # more than one call puts to rest
    for unit in units:
        served(logic, unit, "r0", loss=1.0)
    later(logic)  # kept answers go: every instance idle, changed in this generation
    closed = logic.snapshot()["store"]
    assert all(key(unit) in logic.store.instances for unit in units)  # written, not yet at rest
    last = logic.store.generations.saved[0]  # the last the calls after the close reach
    served(logic, split_key(last)[1], "r1")  # changed after the close: a ticket opens
    while logic.store.generations.saved:
        logic.handle([])
    assert last in logic.store.instances  # touched: not put to rest with the close's state
    turn(logic)  # its generation ends: written again by the calls
    turn(logic)  # and it settles, without a third write
    assert all(key(unit) in logic.store.resting for unit in units)
    path = logic.store.log.path(logic.store.log.gen)
    at_close = len(read_payloads(path, closed["end"])[0])
    records, _, problem = read_payloads(path, logic.store.log.end)
    assert problem is None and [[e.key for e in r] for r in records[at_close:]] == [[last]]
    assert records[-1][0].kind == "packed+"  # with its ticket


@pytest.mark.parametrize("near, written", [(10.0, ["u1"]), (100.0, [])])
def test_the_calls_leave_to_the_close_what_is_about_to_change(tmp_path, monkeypatch, near, written):
    """Keys whose next change is near, a ticket waiting for its feedback (u2) or a
    deadline within CHANGE_NEAR (u1 keeps its answer for 50 s), are not written ahead of
    the close: written now and again soon, they would cost twice the bytes."""
    monkeypatch.setattr("flows.service.shards.shard_store.CHANGE_NEAR", near)
    logic = build(tmp_path)
    served(logic, "u1", "r0", loss=1.0)
    served(logic, "u2", "r0")
    turn(logic)
    assert [unit for unit in ("u1", "u2") if key(unit) in logic.store.generations.clean] == written


def test_a_key_two_closes_wrote_rests_once(tmp_path):
    """A key changed again before the calls after a close put it to rest is saved by the
    next close too: it rests once, and nothing fails (a crash here would loop)."""
    logic = build(tmp_path)
    served(logic, "u1", "r0", loss=1.0)
    later(logic)  # idle: it can rest in the tables
    logic.snapshot()
    served(logic, "u1", "r1", loss=2.0)
    later(logic)
    logic.snapshot()
    saved = logic.store.generations.saved
    saved.insert(0, key("u1"))  # the first close's, not reached yet (a backlog)
    logic.handle([])
    assert key("u1") in logic.store.resting and key("u1") not in logic.store.instances
    assert served(logic, "u1", "r2", loss=1.0)  # built again from its resting entry


def test_the_close_writes_only_what_changed_since_the_calls_wrote_it(tmp_path):
    """The keys a generation changed are written a few per call once it turns, so the
    close has only the newest changes to write; a key changed again after its write is
    written again at the close, and a restart from its marker answers as if never
    interrupted."""
    straight, logic = build(None), build(tmp_path)
    units = [f"u{unit}" for unit in range(40)]
    for unit in units:
        assert served(straight, unit, "r0", 1.0) == served(logic, unit, "r0", 1.0)
    base = logic.snapshot()["store"]  # a whole base
    for unit in units[:10]:
        assert served(straight, unit, "r1", 2.0) == served(logic, unit, "r1", 2.0)
    assert served(straight, "u20", "r1") == served(logic, "u20", "r1")  # feedback to come
    turn(logic)  # the ten are written by the calls, not by the close
    written, clean = logic.store.log.end, logic.store.generations.clean
    assert written > base["end"] and all(key(unit) in clean for unit in units[:10])
    assert key("u20") not in clean  # its feedback is near: written once, later
    assert served(straight, "u3", "r2", 3.0) == served(logic, "u3", "r2", 3.0)
    closed = logic.snapshot()
    path = logic.store.log.path(logic.store.log.gen)
    last = read_payloads(path, closed["store"]["end"])[0][-1]
    assert sorted(entry.key for entry in last) == [key("u20"), key("u3")]  # what is left
    resumed = build(tmp_path, closed)
    for unit in [*units[:12], "u20"]:
        assert served(resumed, unit, "r3", 1.5) == served(straight, unit, "r3", 1.5)


def test_restored_instances_answer_as_if_never_interrupted(tmp_path):
    straight, interrupted = build(None), build(tmp_path)
    marker = None
    for step in range(30):
        units = [f"u{(step * 7 + k) % 23}" for k in range(5)]
        a = [
            served(straight, u, f"r{step}", loss=float((step + k) % 4)) for k, u in enumerate(units)
        ]
        b = [
            served(interrupted, u, f"r{step}", loss=float((step + k) % 4))
            for k, u in enumerate(units)
        ]
        assert a == b
        marker = interrupted.snapshot()
        if step % 4 == 3:
            interrupted = build(tmp_path, marker)
        if step % 5 == 4:
            later(straight, 20.0)
            later(interrupted, 0.0)


def test_compaction_keeps_the_generation_a_lagging_commit_names(tmp_path, monkeypatch):
    monkeypatch.setattr("flows.service.shards.shard_log.MIN_COMPACT_BYTES", 0)
    logic = build(tmp_path)
    markers = []
    for epoch in range(40):
        served(logic, "u0", f"x{epoch}", loss=1.0)
        later(logic)
        markers.append(logic.snapshot()["store"])
    gens = [m["gen"] for m in markers]
    assert gens[-1] >= 3  # compacted more than once
    last_of_previous = [m for m in markers if m["gen"] == gens[-1] - 1][-1]
    files = sorted(p.name for p in tmp_path.glob("*.log"))
    assert files == [f"{SHARD}.{gens[-1] - 1}.log", f"{SHARD}.{gens[-1]}.log"]
    # a commit that lags behind the compaction still resumes
    resumed = build(tmp_path, {"shard": SHARD, "store": last_of_previous})
    assert not resumed.store.problems and key("u0") in resumed.store.resting
    assert sorted(p.name for p in tmp_path.glob("*.log")) == [f"{SHARD}.{gens[-1] - 1}.log"]


@pytest.mark.parametrize("damage", ["flip", "cut", "missing"])
def test_a_damaged_log_is_a_dead_letter_not_a_crash_or_a_silent_reset(tmp_path, damage):
    logic = build(tmp_path)
    for unit in range(20):
        served(logic, f"u{unit}", "r0", loss=1.0)
    base = logic.snapshot()
    served(logic, "u1", "r1", loss=3.0)
    marker = logic.snapshot()
    path = tmp_path / f"{SHARD}.{marker['store']['gen']}.log"
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[base["store"]["end"] + 20] ^= 0xFF  # inside the second record
        path.write_bytes(bytes(data))
    elif damage == "cut":
        path.write_bytes(bytes(data[: marker["store"]["end"] - 5]))
    else:
        path.unlink()
    resumed = build(tmp_path, marker)
    out = resumed.handle([])
    [letter] = out
    assert letter.reason == "state_lost" and letter.instance == SHARD
    held = set(resumed.store.resting) | set(resumed.store.instances)
    assert held == (set() if damage == "missing" else {key(f"u{u}") for u in range(20)})
    assert resumed.handle([]) == []  # handed out once
    fresh = resumed.snapshot()["store"]
    assert fresh["gen"] == marker["store"]["gen"] + 1  # a clean generation, the old one kept
    assert read_records(tmp_path / f"{SHARD}.{fresh['gen']}.log", None)[2] is None


def test_a_shard_without_a_marker_starts_from_its_seed(tmp_path):
    logic = build(None)
    served(logic, "u1", "r0", loss=2.0)
    write_seed(tmp_path, SHARD, logic.snapshot()["entries"])
    (tmp_path / f"{SHARD}.1.log").write_bytes(b"an epoch never committed")
    started = build(tmp_path)
    assert served(started, "u1", "r1") == served(logic, "u1", "r1")
    assert key("u1") in started.store.instances
    # the epoch never committed is gone: the log starts again from the seed, a clean base
    [log] = tmp_path.glob("*.log")
    entries, _, problem = read_records(log, None)
    assert entries.keys() == {key("u1")} and problem is None


def test_a_packed_entry_follows_a_changed_definition():
    logic = build(None)
    for i in range(200):
        [(_, arm, _)] = served(logic, "u1", f"r{i}")
        logic.handle([event("feedback", "u1", f"r{i}", loss=0.0 if arm == 1 else 5.0)])
    later(logic)
    [entry] = [e for e in logic.snapshot()["entries"] if e.key == key("u1")]
    assert isinstance(entry, Entry) and entry.kind == "packed"
    grown = Registry.from_toml(
        '[experiments.e]\narms = ["a", "b", "c", "d"]\nper_unit = true\nfeedback_ttl = 50\n'
    )["e"]
    instance = revive(entry, grown)
    shares = instance.bandit.weight_shares()
    assert instance.bandit.n_updates == 200 and len(shares) == 4 and shares.argmax() == 1


def test_idle_instances_rest_as_bytes_and_follow_a_registry_change():
    live = LiveRegistry(REGISTRY)
    logic = logic_builder(live, clock=lambda: NOW[0], shards=1)(None)
    served(logic, "u1", "r0", loss=1.0)
    later(logic)
    logic.snapshot()
    assert (
        key("u1") in logic.store.resting and key("u1") not in logic.store.instances
    )  # bytes alone
    live.current = Registry.from_toml(
        '[experiments.e]\narms = ["a", "b", "c", "d"]\nper_unit = true\nfeedback_ttl = 50\n'
    )
    grown = live.current["e"]

    def routed(kind, unit, rid, **extra):  # as the flow routes it: the experiment in force
        return (*event(kind, unit, rid, **extra)[:1], grown, event(kind, unit, rid, **extra)[2])

    logic.handle([routed("request", "u2", "r0"), routed("feedback", "u2", "r0", loss=1.0)])
    later(logic)
    logic.snapshot()  # u2 rests under the new definition: u1's bytes are kept apart
    entries = {entry.key: entry for entry in logic.store.resting.entries()}
    assert entries[key("u1")].data[0] == ("a", "b", "c") and len(entries[key("u2")].data[0]) == 4
    [selection] = logic.handle([routed("request", "u1", "r1")])
    instance = logic.store.instances[key("u1")]
    assert instance.bandit.n_arms == 4 and instance.bandit.n_updates == 1
    assert selection.round == 2  # it went on from its first round


def _states(logic):
    """Every instance a shard holds, live or resting, as ``Instance.to_dict``."""
    live = {k: i.to_dict() for k, i in logic.store.instances.items()}
    return live | {e.key: state_of(e) for e in logic.store.resting.entries()}


def test_a_resting_answer_expires_in_its_record_as_if_the_instance_were_built(
    tmp_path, monkeypatch
):
    """A kept answer of an instance at rest is dropped in its record when it is due,
    without building the instance: the outputs, the states and the state a restart reads
    from the log are those of building it, expiring the answer and putting it to rest
    again (the Python path, with ``Resting.drop_answer`` doing nothing)."""
    dropped = []
    drop = Resting.drop_answer

    def counted(self, *args):
        entry = drop(self, *args)
        dropped.append(entry is not None)
        return entry

    def run(store):
        NOW[0] = 1_000.0
        logic, out, snapshot = build(store, rest_after=0.0), [], None
        for step in range(12):
            for unit in range(step % 4, 20, 3):
                loss = None if unit % 5 == 0 else float((unit * step) % 7) - 3.0
                out += served(logic, f"u{unit}", f"r{step}", loss=loss)
            logic.wake()  # the generation turns: what the calls changed goes to rest
            logic.wake()
            if step % 3 == 2:
                snapshot = logic.snapshot()
            NOW[0] += 20.0 if step % 2 else 35.0  # answers (retry window 50 s) come due
            out += [(d.reason, d.instance) for d in logic.wake()]
        return out, _states(logic), logic.snapshot(), snapshot

    monkeypatch.setattr(Resting, "drop_answer", counted)
    out, states, closed, _ = run(tmp_path / "dropped")
    resumed = build(tmp_path / "dropped", resume=closed)
    assert _states(resumed) == states  # the dropped answers were written, and the close covers them
    assert sum(dropped) >= 20  # answers were dropped in their records
    monkeypatch.setattr(Resting, "drop_answer", lambda *args: None)
    built_out, built_states, built_closed, _ = run(tmp_path / "built")
    assert out == built_out
    assert states == built_states
    assert _states(build(tmp_path / "built", resume=built_closed)) == states


@pytest.mark.parametrize("drops", [True, False])
def test_a_resting_answer_under_a_changed_definition_is_built_to_expire(
    tmp_path, monkeypatch, drops
):
    """Its record names the old arms: the instance is built and follows the definition in
    force before its answer is dropped, as it always was (dropping it in the record would
    leave the old arms for later, and a second change would then differ)."""
    if not drops:
        monkeypatch.setattr(Resting, "drop_answer", lambda *args: None)
    NOW[0] = 1_000.0
    live = LiveRegistry(REGISTRY)
    logic = logic_builder(live, clock=lambda: NOW[0], store=tmp_path, rest_after=0.0, shards=1)(
        None
    )
    served(logic, "u1", "r0", loss=1.0)
    logic.wake()
    logic.wake()
    assert (
        key("u1") in logic.store.resting and key("u1") not in logic.store.instances
    )  # with its answer
    live.current = Registry.from_toml(
        '[experiments.e]\narms = ["a", "b", "d"]\nper_unit = true\nfeedback_ttl = 50\n'
    )
    NOW[0] += 60.0
    assert logic.wake() == []
    assert key("u1") in logic.store.instances  # built, and following the new arms
    assert logic.store.instances[key("u1")].to_dict()["arms"] == ["a", "b", "d"]
    assert logic.store.instances[key("u1")].to_dict()["settled"] == []
