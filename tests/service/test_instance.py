"""Per-instance event handling: deterministic draws, tickets, buffers, expiry, refusals."""

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flows.service.instances.instance import Instance, uniform_draw
from flows.service.instances.registry import Registry
from flows.service.wire.events import DeadLetter, Origin, Selection, parse_feedback, parse_request

REGISTRY = Registry.from_toml(
    """
[experiments.home]
arms = ["a", "b", "c"]
feedback_ttl = 10
early_feedback_limit = 2
seed = 5

[experiments.ctx]
arms = ["a", "b"]
competition = { kind = "contextual", n_contexts = 3 }
"""
)


def request(rid, experiment="home", **extra):
    raw = orjson.dumps({"experiment": experiment, "request_id": rid, **extra})
    return parse_request(raw, Origin("tsi.requests", 0, 1))


def feedback(rid, loss=1.0, experiment="home", **extra):
    raw = orjson.dumps({"experiment": experiment, "request_id": rid, "loss": loss, **extra})
    return parse_feedback(raw, Origin("tsi.feedback", 0, 1))


def state(inst):
    return json.dumps(inst.to_dict(), sort_keys=True)


def fresh(name="home"):
    return Instance(REGISTRY[name], name)


def test_the_draw_depends_only_on_seed_instance_and_request_id():
    a, b = fresh(), fresh()
    for i in range(50):
        [sa], [sb] = a.on_request(request(f"r{i}"), 0.0), b.on_request(request(f"r{i}"), 5.0)
        assert sa == sb
    assert uniform_draw(5, "home", "r1") != uniform_draw(6, "home", "r1")
    assert 0.0 <= uniform_draw(5, "home", "r1") < 1.0


def test_retried_request_gets_the_same_selection_and_changes_nothing():
    inst = fresh()
    [first] = inst.on_request(request("r1"), 0.0)
    before = state(inst)
    assert inst.on_request(request("r1"), 1.0) == [first]
    assert state(inst) == before
    inst.on_feedback(feedback("r1"), 2.0)
    assert inst.on_request(request("r1"), 3.0) == [first]  # also after its feedback


def test_request_id_reused_with_another_context_is_refused():
    inst = fresh("ctx")
    inst.on_request(request("r1", "ctx", context=1), 0.0)
    before = state(inst)
    [dead] = inst.on_request(request("r1", "ctx", context=2), 1.0)
    assert isinstance(dead, DeadLetter) and dead.reason == "context_mismatch"
    assert state(inst) == before
    inst.on_feedback(feedback("r1", experiment="ctx"), 2.0)  # settled: a retry keeps its context
    before = state(inst)
    [dead] = inst.on_request(request("r1", "ctx", context=0), 3.0)
    assert isinstance(dead, DeadLetter) and dead.reason == "context_mismatch"
    assert state(inst) == before


@pytest.mark.parametrize(
    ("name", "extra", "reason"),
    [
        ("ctx", {}, "missing_field"),
        ("ctx", {"context": 3}, "context_out_of_range"),
        ("home", {"context": 0}, "context_out_of_range"),
    ],
)
def test_context_rules(name, extra, reason):
    inst = fresh(name)
    before = state(inst)
    [dead] = inst.on_request(request("r1", name, **extra), 0.0)
    assert dead.reason == reason and dead.instance == name
    assert state(inst) == before


def test_feedback_is_applied_exactly_once():
    inst = fresh()
    inst.on_request(request("r1"), 0.0)
    assert inst.on_feedback(feedback("r1", 3.0), 1.0) == []
    assert inst.bandit.n_updates == 1 and inst.bandit.psi == 3.0
    before = state(inst)
    [dead] = inst.on_feedback(feedback("r1", 3.0), 2.0)
    assert dead.reason == "duplicate_feedback"
    assert state(inst) == before


def test_feedback_naming_another_arm_is_refused_and_the_ticket_stays_open():
    inst = fresh()
    [sel] = inst.on_request(request("r1"), 0.0)
    before = state(inst)
    [dead] = inst.on_feedback(feedback("r1", arm=(sel.arm + 1) % 3), 1.0)
    assert dead.reason == "arm_mismatch" and state(inst) == before
    assert inst.on_feedback(feedback("r1", arm=sel.arm), 1.0) == []
    assert inst.bandit.n_updates == 1


def test_early_feedback_waits_in_a_bounded_buffer_and_applies_on_its_request():
    inst = fresh()
    assert inst.on_feedback(feedback("r1", 4.0), 0.0) == []
    assert inst.on_feedback(feedback("r2", 5.0), 0.0) == []
    [dup] = inst.on_feedback(feedback("r1", 4.0), 0.5)
    assert dup.reason == "duplicate_feedback"
    [full] = inst.on_feedback(feedback("r3", 6.0), 1.0)
    assert full.reason == "early_buffer_full"
    [sel] = inst.on_request(request("r1"), 2.0)
    assert isinstance(sel, Selection)
    assert inst.bandit.n_updates == 1 and inst.bandit.psi == 4.0 and "r1" not in inst.early


def test_expiry_reports_tickets_without_feedback_and_feedback_without_request():
    inst = fresh()
    [served] = inst.on_request(request("r1"), 0.0)
    inst.on_feedback(feedback("zz"), 3.0)
    assert inst.next_deadline() == 10.0
    assert inst.expire(9.9) == []
    [expired] = inst.expire(10.0)
    assert expired.reason == "ticket_expired"
    assert orjson.loads(expired.raw)["request_id"] == "r1"  # the original request bytes
    assert inst.bandit.pending == () and inst.open == {}
    [unknown] = inst.expire(13.0)
    assert unknown.reason == "unknown_ticket" and orjson.loads(unknown.raw)["request_id"] == "zz"
    # within the retry window (feedback_ttl by default) the expired answer is kept: a retry
    # gets it again, late feedback is named as such at once and applied to nothing
    assert list(inst.on_request(request("r1"), 14.0)) == [served]
    [late] = inst.on_feedback(feedback("r1"), 15.0)
    assert late.reason == "late_feedback" and inst.bandit.n_updates == 0
    assert inst.expire(20.0) == [] and inst.next_deadline() is None  # then forgotten
    assert list(inst.on_feedback(feedback("r1"), 21.0)) == []  # unknown: waits for a request
    assert [d.reason for d in inst.expire(31.0)] == ["unknown_ticket"]
    assert inst.bandit.n_updates == 0


def test_the_retry_window_is_a_setting_of_the_experiment():
    exp = Registry.from_toml(
        '[experiments.home]\narms = ["a", "b"]\nfeedback_ttl = 10\nretry_window = 0'
    )["home"]
    inst = Instance(exp, "home")
    inst.on_request(request("r1"), 0.0)
    [expired] = inst.expire(10.0)
    assert expired.reason == "ticket_expired" and inst.next_deadline() is None  # none kept
    [again] = inst.on_request(request("r1"), 11.0)  # a documented new draw
    assert again.round == 2


def test_settled_requests_are_forgotten_after_the_time_to_live():
    inst = fresh()
    inst.on_request(request("r1"), 0.0)
    inst.on_feedback(feedback("r1"), 1.0)
    assert "r1" in inst.settled
    inst.expire(11.0)
    assert "r1" not in inst.settled and inst.next_deadline() is None


def test_snapshot_round_trip_continues_identically():
    inst = fresh()
    for i in range(6):
        inst.on_request(request(f"r{i}"), float(i))
    for i in range(3):
        inst.on_feedback(feedback(f"r{i}", float(i)), 6.0)
    inst.on_feedback(feedback("early"), 6.0)
    copy = Instance.from_dict(REGISTRY["home"], json.loads(json.dumps(inst.to_dict())))
    assert state(copy) == state(inst)
    for target in (inst, copy):
        target.on_feedback(feedback("r4", 2.5), 7.0)
        target.on_request(request("early"), 7.5)
    assert state(copy) == state(inst)
    assert [d.reason for d in copy.expire(100.0)] == [d.reason for d in inst.expire(100.0)]


def _check_invariants(inst: Instance, pack: bool = True) -> None:
    """What the compact tables must keep true whatever the history."""
    entries = inst.entries()
    if pack:  # as the operator does at each epoch close
        inst.rest()
        if not inst.holding()["table"]:  # packed unless busy (before it unpacks)
            assert inst.holding()["bandit"] != "live"
    assert inst.holding()["n_early"] == len(inst.early)
    pending = inst.bandit.pending
    if pack:
        inst.rest()  # as it was before `bandit` unpacked it
    assert {t.round for t in pending} == {o.ticket.round for o in inst.open.values()}
    holding = inst.holding()
    if holding["table"]:
        heap = holding["deadlines"]
        assert len(entries) >= 2 and set(entries) <= {rid for _, rid in heap}
        live = {(e.deadline, e.rid) for e in entries.values()}
        assert live <= set(heap)
        assert inst.next_deadline() <= min(d for d, _ in live)
    else:
        assert holding["deadlines"] is None and len(entries) <= 1
        assert inst.next_deadline() == (
            None if not entries else next(iter(entries.values())).deadline
        )


OPS = st.lists(
    st.tuples(st.sampled_from(["request", "feedback", "expire", "snapshot"]), st.integers(0, 5)),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_any_history_keeps_the_tables_consistent_and_snapshots_exact(ops):
    """Random requests, feedback, expiries, packing and snapshot/restore cycles, against a
    twin that is never packed nor snapshotted: both emit the same outputs and end in the
    same state."""
    inst, twin = fresh(), fresh()
    now = 0.0
    for op, k in ops:
        now += 1.5
        rid = f"r{k}"
        if op == "snapshot":
            inst = Instance.from_dict(REGISTRY["home"], json.loads(json.dumps(inst.to_dict())))
            outs = twin_outs = []
        elif op == "request":
            outs, twin_outs = inst.on_request(request(rid), now), twin.on_request(request(rid), now)
        elif op == "feedback":
            fb = feedback(rid, float(k))
            outs, twin_outs = inst.on_feedback(fb, now), twin.on_feedback(fb, now)
        else:
            outs, twin_outs = inst.expire(now), twin.expire(now)
        assert outs == twin_outs
        _check_invariants(inst)
        _check_invariants(twin, pack=False)  # the twin's bandit is never packed
    assert state(inst) == state(twin)
    closing = inst.expire(now + 100.0)
    assert [d.reason for d in closing] == [d.reason for d in twin.expire(now + 100.0)]
    assert inst.bandit.pending == ()
    assert inst.expire(now + 200.0) == [] and inst.entries() == {}  # answers kept, then gone


def test_an_expired_ticket_is_reported_with_the_request_re_encoded_and_its_origin():
    inst = Instance(REGISTRY["ctx"], "ctx")
    inst.on_request(request("r1", experiment="ctx", context=2), 0.0)
    [dead] = inst.expire(REGISTRY["ctx"].feedback_ttl)
    assert orjson.loads(dead.raw) == {"experiment": "ctx", "request_id": "r1", "context": 2}
    assert dead.origin == Origin("tsi.requests", 0, 1) and dead.instance == "ctx"
    again = parse_request(dead.raw, Origin("replay"))
    assert (again.experiment, again.request_id, again.context) == ("ctx", "r1", 2)


@pytest.mark.parametrize(
    "definition",
    [
        'arms = ["a", "b", "c"]',
        'arms = ["a", "b"]\ncompetition = { kind = "switching", rate = 0.01 }\ngamma = 1.5',
        'arms = ["a", "b"]\ncompetition = { kind = "contextual", n_contexts = 3 }',
        'arms = ["a", "b", "c"]\nvariant = "paper"',
        'arms = ["a", "b", "c", "d"]\nvariant = "robust"',
    ],
)
def test_a_new_bandit_is_the_bandit_its_definition_builds(definition):
    """``Experiment.new_bandit`` unpacks a fresh state instead of building one: the same
    bandit, choosing the same arms."""
    from tsi_core import Bandit

    exp = Registry.from_toml(f"[experiments.home]\n{definition}\n")["home"]
    made = exp.new_bandit("home\x1fu1")
    built = Bandit(
        len(exp.arms), exp.competition, exp.gamma, instance_id="home\x1fu1", variant=exp.variant
    )
    assert made.to_dict() == built.to_dict()
    context = 2 if exp.n_contexts > 1 else None
    for i in range(50):
        a, b = made.select(context, u=(i * 0.377) % 1.0), built.select(context, u=(i * 0.377) % 1.0)
        assert a == b
        made.update(a, float(i % 7) - 3.0)
        built.update(b, float(i % 7) - 3.0)
    assert made.to_dict() == built.to_dict()
    assert exp.new_bandit("other").n_rounds == 0  # each new bandit starts fresh


def test_an_experiment_pickles_as_its_definition_once_it_has_built_bandits():
    """Routed events carry their experiment between Bytewax processes (pickled). Building
    bandits caches a template bandit on it, which does not pickle: the two-process cluster
    failed in its send threads. It pickles as its definition, the caches rebuilt after
    (where no flow of the process knows the definition: an uncommon seed)."""
    import pickle

    from flows.service.dataflow import route

    text = '[experiments.e]\narms = ["a", "b"]\nper_unit = true\nseed = 7341'
    exp = Registry.from_toml(text)["e"]
    built = exp.new_bandit("e\x1fu1")
    assert exp.packing  # the caches a shard builds as it puts instances to rest
    event = parse_request(b'{"experiment":"e","unit":"u1","request_id":"r"}', Origin("t"))
    _shard, (key, carried, _) = pickle.loads(pickle.dumps(route(Registry({"e": exp}), event)))
    assert carried == exp and "template" not in vars(carried)
    assert carried.new_bandit(key).to_dict() == built.to_dict()
    assert carried.packing == exp.packing
