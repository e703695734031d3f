"""An instance's attribution windows (``default_loss``, ``aggregate``), the arms a request
may get (``eligible``), named contexts, and what a selection says (``prob``, ``why``).

The oracle of each window is a bare ``tsi_core.Bandit`` updated once with the loss the
window should make: the instance's bandit must end bit for bit as it does.
"""

import functools
import operator
import pickle

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from flows.service.dataflow import Guards, parse_and_route
from flows.service.instances.instance import Instance, Open, compact_to_entries
from flows.service.instances.registry import LiveRegistry, Registry
from flows.service.instances.resting import entry_of, revive
from flows.service.observe.metrics import (
    APPLIED,
    COLLECTED,
    DEFAULTED,
    PENDING,
    thread_tally,
)
from flows.service.shards import _event_loop
from flows.service.shards.shard_store import FlowContext, ShardStore
from flows.service.wire._records import selection_json
from flows.service.wire.events import Origin, parse_feedback, parse_request

ARMS = '["control", "green", "blue"]'


def experiment(extra="", name="e"):
    text = f"[experiments.{name}]\narms = {ARMS}\nfeedback_ttl = 10\nretry_window = 5\n{extra}"
    return Registry.from_toml(text)[name]


def request(rid, experiment_name="e", **fields):
    raw = {"experiment": experiment_name, "request_id": rid, **fields}
    return parse_request(orjson.dumps(raw), Origin("t"))


def feedback(rid, loss, experiment_name="e"):
    raw = {"experiment": experiment_name, "request_id": rid, "loss": loss}
    return parse_feedback(orjson.dumps(raw), Origin("t"))


def oracle(exp, rid, loss):
    """The bandit a window of ``rid`` ending with ``loss`` applied once leaves."""
    inst = Instance(exp, "e")
    inst.on_request(request(rid), 0.0)
    ticket = inst.open[rid].ticket
    inst.bandit.update(ticket, loss)
    return inst.bandit.to_dict()


# -------------------------------------------------------------------- default_loss
def test_a_window_without_feedback_applies_the_default_loss():
    exp = experiment("default_loss = 1.5")
    inst = Instance(exp, "e")
    [sel] = inst.on_request(request("r1"), 0.0)
    assert inst.expire(9.9) == [] and inst.bandit.n_updates == 0
    assert inst.expire(10.0) == []  # no ticket_expired dead letter
    assert inst.take_closed() == (0, 1)
    assert inst.bandit.n_updates == 1
    assert inst.bandit.to_dict() == oracle(exp, "r1", 1.5)
    [late] = inst.on_feedback(feedback("r1", 0.0), 11.0)
    assert late.reason == "late_feedback"
    assert inst.on_request(request("r1"), 12.0) == [sel]  # a retry: the same answer


def test_without_default_loss_the_ticket_expires_as_before():
    inst = Instance(experiment(), "e")
    inst.on_request(request("r1"), 0.0)
    [letter] = inst.expire(10.0)
    assert letter.reason == "ticket_expired" and inst.bandit.n_updates == 0
    assert inst.take_closed() == (0, 0)


def test_feedback_within_the_window_is_applied_at_once_under_first():
    exp = experiment("default_loss = 1.0")
    inst = Instance(exp, "e")
    inst.on_request(request("r1"), 0.0)
    assert inst.on_feedback(feedback("r1", 0.25), 1.0).applied == 1
    [dup] = inst.on_feedback(feedback("r1", 3.0), 2.0)
    assert dup.reason == "duplicate_feedback"
    assert inst.expire(10.0) == [] and inst.take_closed() == (0, 0)
    assert inst.bandit.to_dict() == oracle(exp, "r1", 0.25)


# ----------------------------------------------------------------------- aggregate
@pytest.mark.parametrize(
    ("mode", "combined"), [("sum", 4.0), ("mean", 2.0), ("last", 3.0), ("max", 3.0)]
)
def test_each_aggregate_applies_its_combined_loss_once_at_the_windows_end(mode, combined):
    exp = experiment(f'aggregate = "{mode}"\ndefault_loss = 9.0')
    inst = Instance(exp, "e")
    inst.on_request(request("r1"), 0.0)
    for at, loss in ((1.0, 1.0), (2.0, 3.0)):
        done = inst.on_feedback(feedback("r1", loss), at)
        assert list(done) == [] and done.collected == 1 and done.applied == 0
    assert inst.bandit.n_updates == 0  # nothing applied before the window ends
    assert inst.expire(10.0) == [] and inst.take_closed() == (1, 0)
    assert inst.bandit.to_dict() == oracle(exp, "r1", combined)
    [late] = inst.on_feedback(feedback("r1", 5.0), 11.0)
    assert late.reason == "late_feedback"
    assert inst.expire(20.0) == [] and inst.bandit.n_updates == 1  # applied once


@pytest.mark.parametrize("mode", ["sum", "mean", "last", "max"])
def test_an_aggregating_window_without_feedback_gets_the_default_or_expires(mode):
    with_default = Instance(experiment(f'aggregate = "{mode}"\ndefault_loss = 2.0'), "e")
    with_default.on_request(request("r1"), 0.0)
    assert with_default.expire(10.0) == [] and with_default.take_closed() == (0, 1)
    plain = Instance(experiment(f'aggregate = "{mode}"'), "e")
    plain.on_request(request("r1"), 0.0)
    assert [d.reason for d in plain.expire(10.0)] == ["ticket_expired"]


AGGREGATES = {  # in arrival order, as the instance combines them (float addition)
    "sum": lambda xs: functools.reduce(operator.add, xs),
    "mean": lambda xs: functools.reduce(operator.add, xs) / len(xs),
    "last": lambda xs: xs[-1],
    "max": max,
}


def saved_and_back(inst, exp, how):
    """``inst`` through one of its saved forms."""
    if how == "pickle":  # an instance pickles at rest (its bandit packed)
        inst.rest()
        return pickle.loads(pickle.dumps(inst))
    if how == "to_dict":
        return Instance.from_dict(exp, orjson.loads(orjson.dumps(inst.to_dict())))
    return revive(pickle.loads(pickle.dumps(entry_of(inst))), exp)  # a resting entry


@settings(max_examples=60, deadline=None)
@given(
    mode=st.sampled_from(sorted(AGGREGATES)),
    losses=st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=6),
    cut=st.integers(0, 6),
    how=st.sampled_from(["pickle", "to_dict", "entry"]),
)
def test_a_half_collected_window_survives_every_saved_form(mode, losses, cut, how):
    exp = experiment(f'aggregate = "{mode}"')
    inst = Instance(exp, "e")
    inst.on_request(request("r1"), 0.0)
    cut = min(cut, len(losses))
    for i, loss in enumerate(losses[:cut]):
        inst.on_feedback(feedback("r1", loss), 1.0 + i * 0.1)
    inst = saved_and_back(inst, exp, how)
    for i, loss in enumerate(losses[cut:]):
        inst.on_feedback(feedback("r1", loss), 2.0 + i * 0.1)
    assert inst.expire(10.0) == [] and inst.take_closed() == (1, 0)
    assert inst.bandit.to_dict() == oracle(exp, "r1", AGGREGATES[mode](losses))


def test_the_compact_form_of_a_collecting_window_round_trips():
    exp = experiment('aggregate = "sum"')
    inst = Instance(exp, "e")
    inst.on_request(request("r1"), 0.0)
    inst.on_feedback(feedback("r1", 2.5), 1.0)
    [item] = inst.compact_entries()
    assert item[0] == "o" and item[-2:] == (1, 2.5)
    [entry] = compact_to_entries((item,))
    assert isinstance(entry, Open) and (entry.collected, entry.combined) == (1, 2.5)
    assert entry == inst.open["r1"]


# ------------------------------------------------------------------- prob and why
def test_selections_carry_prob_and_why_and_a_retry_gets_the_same():
    exp = experiment('holdout = { arm = "control", share = 0.5 }\nmin_share = 0.1')
    inst = Instance(exp, "e")
    whys = set()
    for i in range(200):
        [sel] = inst.on_request(request(f"r{i}"), 0.0)
        ticket = inst.get(f"r{i}").ticket
        assert (sel.prob, sel.why) == (ticket.prob, ticket.why)
        assert sel.prob >= 0.1 * 0.5  # the floor, on the bandit's half
        whys.add(sel.why)
        assert inst.on_request(request(f"r{i}"), 1.0) == [sel]
        wire = orjson.loads(selection_json(sel))
        assert (wire["prob"], wire["why"]) == (sel.prob, sel.why)
    assert whys == {"holdout", "bandit"}


def test_burn_in_serves_uniformly_first():
    inst = Instance(experiment("burn_in = 5"), "e")
    sels = [inst.on_request(request(f"r{i}"), 0.0)[0] for i in range(8)]
    assert [s.why for s in sels] == ["burn_in"] * 5 + ["bandit"] * 3
    assert all(s.prob == pytest.approx(1 / 3) for s in sels[:5])


# ------------------------------------------------------------------------ eligible
@pytest.mark.parametrize(
    ("eligible", "reason", "named"),
    [
        ([], "ineligible_arms", "[]"),
        (["green", "green"], "ineligible_arms", "['green', 'green']"),
        (["green", 1], "ineligible_arms", "['green', 1]"),  # arm 1 is green
        (["green", "red"], "unknown_arm", "['red']"),
        ([0, 7], "unknown_arm", "[7]"),
    ],
)
def test_a_bad_eligible_list_is_a_dead_letter_naming_the_arms(eligible, reason, named):
    inst = Instance(experiment(), "e")
    [letter] = inst.on_request(request("r1", eligible=eligible), 0.0)
    assert (letter.reason, named in letter.detail) == (reason, True)
    assert inst.bandit.n_rounds == 0 and inst.n_held() == 0  # nothing changed


@pytest.mark.parametrize("bad", ["green", [None], [True], [1.5], [""]])
def test_an_eligible_of_the_wrong_type_is_refused_by_the_parser(bad):
    assert request("r1", eligible=bad).reason == "wrong_type"


def test_the_served_arm_is_always_eligible():
    inst = Instance(experiment("min_share = 0.2"), "e")
    for i in range(300):
        allowed = [["green", "blue"], ["control"], [2, 0], ["blue"]][i % 4]
        [sel] = inst.on_request(request(f"r{i}", eligible=allowed), 0.0)
        assert sel.arm_name in allowed or sel.arm in allowed
        inst.on_feedback(feedback(f"r{i}", float(sel.arm)), 0.5)


def test_a_forced_arm_not_eligible_is_a_dead_letter():
    inst = Instance(experiment('force_arm = "blue"'), "e")
    [letter] = inst.on_request(request("r1", eligible=["green"]), 0.0)
    assert letter.reason == "ineligible_arms" and inst.n_held() == 0


# ------------------------------------------------------------------ named contexts
NAMED = 'contexts = { device = ["ios", "android"], plan = ["free", "pro"] }'


def test_a_named_context_is_served_by_its_combination():
    inst = Instance(experiment(NAMED), "e")
    [sel] = inst.on_request(request("r1", context={"device": "android", "plan": "pro"}), 0.0)
    assert inst.get("r1").ticket.context == 1 * 3 + 1
    again = request("r1", context={"plan": "pro", "device": "android"})
    assert inst.on_request(again, 1.0) == [sel]  # a retry, attributes in another order
    [other] = inst.on_request(request("r1", context={"device": "ios", "plan": "pro"}), 1.0)
    assert other.reason == "context_mismatch"
    assert not inst.on_request(request("r2", context=4), 1.0)[0].dead_letter  # an index works
    assert inst.get("r2").ticket.context == 4


@pytest.mark.parametrize(
    ("context", "reason", "named"),
    [
        ({"device": "ios"}, "missing_field", "'plan'"),
        ({"device": "ios", "plan": "pro", "os": "x"}, "unknown_context_attribute", "'os'"),
        (None, "missing_field", "context is required: an object of its attributes (device, plan)"),
        (9, "context_out_of_range", "an object of its attributes (device, plan), or an integer"),
    ],
)
def test_a_bad_named_context_is_a_dead_letter_naming_it(context, reason, named):
    inst = Instance(experiment(NAMED), "e")
    fields = {} if context is None else {"context": context}
    [letter] = inst.on_request(request("r1", **fields), 0.0)
    assert letter.reason == reason and named in letter.detail, letter
    assert inst.n_held() == 0


def test_a_named_context_for_an_experiment_without_contexts_is_refused():
    [letter] = Instance(experiment(), "e").on_request(request("r1", context={"device": "ios"}), 0.0)
    assert letter.reason == "context_out_of_range"


@pytest.mark.parametrize("bad", [{}, {"device": 1}, {"device": None}, {"": "x"}])
def test_a_context_object_of_the_wrong_type_is_refused_by_the_parser(bad):
    assert request("r1", context=bad).reason == "wrong_type"


def test_values_not_listed_go_to_other_and_are_counted():
    registry = Registry.from_toml(f"[experiments.named]\narms = {ARMS}\n{NAMED}\n")
    shard = ShardStore(FlowContext(LiveRegistry(registry)))
    exp = registry["named"]
    before = dict(_other_counts())
    events = [
        ("named", exp, request("r1", "named", context={"device": "tv", "plan": "pro"})),
        ("named", exp, request("r2", "named", context={"device": "tv", "plan": "team"})),
        ("named", exp, request("r3", "named", context={"device": "ios", "plan": "free"})),
    ]
    outs = _event_loop.handle(shard, events)
    assert [o.dead_letter for o in outs] == [False] * 3
    after = _other_counts()
    assert after[("named", "device")] - before.get(("named", "device"), 0) == 2
    assert after[("named", "plan")] - before.get(("named", "plan"), 0) == 1
    assert served_total("named", "bandit") >= 3


def served_total(experiment, why):
    for metric in REGISTRY.collect():
        if metric.name == "tsi_served":
            for sample in metric.samples:
                if sample.labels == {"experiment": experiment, "why": why}:
                    return sample.value
    return 0


def test_selections_are_counted_by_why():
    registry = Registry.from_toml(f"[experiments.whys]\narms = {ARMS}\nburn_in = 4\n")
    shard = ShardStore(FlowContext(LiveRegistry(registry)))
    exp = registry["whys"]
    _event_loop.handle(shard, [("whys", exp, request(f"r{i}", "whys")) for i in range(10)])
    _event_loop.handle(shard, [("whys", exp, request("r0", "whys"))])  # a retry
    assert (served_total("whys", "burn_in"), served_total("whys", "bandit")) == (5, 6)


def _other_counts():
    found = {}
    for metric in REGISTRY.collect():
        if metric.name == "tsi_context_other":
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    found[(sample.labels["experiment"], sample.labels["attribute"])] = sample.value
    return found


def test_the_shard_counts_defaulted_and_collected_outcomes():
    registry = Registry.from_toml(
        f"[experiments.w]\narms = {ARMS}\nfeedback_ttl = 10\ndefault_loss = 1.0\n"
        'aggregate = "sum"\n'
    )
    now = [0.0]
    shard = ShardStore(FlowContext(LiveRegistry(registry), lambda: now[0]))
    exp = registry["w"]
    counts = thread_tally().experiment("w")
    before = list(counts)
    _event_loop.handle(
        shard,
        [
            ("w", exp, request("r1", "w")),
            ("w", exp, request("r2", "w")),
            ("w", exp, feedback("r1", 2.0, "w")),
            ("w", exp, feedback("r1", 3.0, "w")),
        ],
    )
    now[0] = 11.0
    assert shard.expire_due() == []
    delta = [a - b for a, b in zip(counts, before, strict=True)]
    assert (delta[COLLECTED], delta[APPLIED], delta[DEFAULTED], delta[PENDING]) == (2, 1, 1, 0)


def test_eligible_and_named_contexts_come_through_the_parser_of_batches():
    """The compiled lane takes plain requests only; these go the general path, whole."""
    registry = Registry.from_toml(f"[experiments.e]\narms = {ARMS}\n{NAMED}\n")
    raw = [
        {"experiment": "e", "request_id": "r1", "eligible": ["green", 2]},
        {"experiment": "e", "request_id": "r2", "context": {"device": "ios", "plan": "pro"}},
        {"experiment": "e", "request_id": "r3", "context": 4},
    ]
    batch = [(orjson.dumps(m), Origin("t", 0, i)) for i, m in enumerate(raw)]
    routed, dead = parse_and_route(parse_request, Guards(), LiveRegistry(registry), batch, False)
    assert dead == []
    got = [(e.request_id, e.eligible, e.context) for _, _, e in routed]
    assert got == [
        ("r1", ("green", 2), None),
        ("r2", None, {"device": "ios", "plan": "pro"}),
        ("r3", None, 4),
    ]
