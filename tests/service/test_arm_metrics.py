"""Metrics by arm: selections, applied and default losses, their sums and IPS sums, and
the q of shared instances (by context too), checked against what the flow emitted and the
losses sent."""

import time
from collections import defaultdict

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY as METRICS

from flows.service.instances.registry import Registry
from flows.service.observe.arm_metrics import CONTEXT_SHARE_LIMIT, context_labels
from flows.service.shards.logic import logic_builder
from flows.service.wire.events import Origin, parse_feedback
from tests.service.test_metrics import Delta, feedback, item, msg, request, run_events

REGISTRY = Registry.from_toml(
    """
[experiments.m]
arms = ["a", "b", "c"]

[experiments.d]
arms = ["a", "b"]
feedback_ttl = 5
default_loss = 0.5
"""
)


@settings(max_examples=8, deadline=None)
@given(st.lists(st.floats(-3, 3, allow_nan=False), min_size=1, max_size=30))
def test_counts_and_sums_by_arm_match_the_selections_and_the_losses(losses):
    events = [msg("ev", i, type="request", experiment="m", request_id=f"r{i}") for i in
              range(len(losses))]  # fmt: skip
    events += [msg("ev", 100, type="request", experiment="m", request_id="r0")]  # a retry
    events += [
        msg("ev", 200 + i, type="feedback", experiment="m", request_id=f"r{i}", loss=x)
        for i, x in enumerate(losses)
    ]
    delta = Delta()
    selections, dead = run_events(events, registry=REGISTRY)
    assert not dead
    want = defaultdict(lambda: [0, 0, 0.0, 0.0, 0.0])
    for s in {s["request_id"]: s for s in selections}.values():
        x = losses[int(s["request_id"][1:])]
        w = want[s["arm_name"]]
        w[0] += 1
        w[1] += 1
        w[2] += x
        w[3] += x * x
        w[4] += x / s["prob"]
    for arm in ("a", "b", "c"):
        got = [
            delta(name, experiment="m", arm=arm)
            for name in (
                "tsi_arm_selections_total",
                "tsi_arm_feedback_total",
                "tsi_arm_loss_sum",
                "tsi_arm_loss_squares_sum",
                "tsi_arm_ips_loss_sum",
            )
        ]
        assert got[:2] == want[arm][:2]
        assert got[2:] == [pytest.approx(v, abs=1e-9) for v in want[arm][2:]]


def test_default_losses_count_by_arm_when_windows_close():
    now = [100.0]
    logic = logic_builder(REGISTRY, clock=lambda: now[0])(None)
    delta = Delta()
    served = [logic.handle(item(logic, "d", request(f"r{i}", "d")))[0] for i in range(6)]
    logic.handle(item(logic, "d", feedback("r0", "d", loss=2.0)))
    now[0] = 200.0
    logic.wake()
    arms = [s.arm_name for s in served]
    for arm in ("a", "b"):
        fed = arms[0] == arm
        assert delta("tsi_arm_feedback_total", experiment="d", arm=arm) == fed
        assert delta("tsi_arm_defaulted_total", experiment="d", arm=arm) == arms[1:].count(arm)
        assert delta("tsi_arm_loss_sum", experiment="d", arm=arm) == pytest.approx(
            2.0 * fed + 0.5 * arms[1:].count(arm)
        )


def test_the_share_of_a_shared_instance_is_its_q_as_last_read():
    logic = logic_builder(REGISTRY, clock=lambda: 1000.0)(None)
    for i in range(20):
        logic.handle(item(logic, "m", request(f"s{i}")))
    for i in range(19):
        logic.handle(item(logic, "m", feedback(f"s{i}", loss=float(i % 3))))
    time.sleep(1.1)  # deliberate: past metrics.SHARE_EVERY of wall time on any host
    logic.handle(item(logic, "m", feedback("s19", loss=0.0)))
    q = logic.store.instances["m"].bandit.policy().tolist()
    shares = Delta.__new__(Delta)
    shares.before = {}
    assert [shares("tsi_arm_share", experiment="m", arm=a) for a in "abc"] == q
    assert [shares("tsi_arm_served_share", experiment="m", arm=a) for a in "abc"] == q  # plain
    assert abs(sum(q) - 1.0) < 1e-9


FLOORED = Registry.from_toml('[experiments.floor]\narms = ["good", "bad"]\nmin_share = 0.3\n')


def test_the_served_share_is_what_a_min_share_floor_serves_while_q_reads_lower():
    logic = logic_builder(FLOORED, clock=lambda: 1000.0)(None)
    for i in range(60):
        [answer] = logic.handle(item(logic, "floor", request(f"f{i}", "floor")))
        loss = 1.0 if answer.arm_name == "bad" else 0.0
        logic.handle(item(logic, "floor", feedback(f"f{i}", "floor", loss=loss)))
    time.sleep(1.1)  # arm_metrics.SHARE_EVERY
    logic.handle(item(logic, "floor", request("last", "floor")))
    bandit = logic.store.instances["floor"].bandit
    shares = Delta.__new__(Delta)
    shares.before = {}
    q = [shares("tsi_arm_share", experiment="floor", arm=a) for a in ("good", "bad")]
    served = [shares("tsi_arm_served_share", experiment="floor", arm=a) for a in ("good", "bad")]
    assert q == bandit.policy().tolist() and served == bandit.probabilities().tolist()
    assert q[1] < 0.3 <= served[1] + 1e-12  # the floor serves "bad" above what q gives it


def test_feedback_given_as_a_reward_is_counted_apart():
    logic = logic_builder(REGISTRY, clock=lambda: 1000.0)(None)
    delta = Delta()
    for i in range(5):
        logic.handle(item(logic, "m", request(f"w{i}")))
    for i in range(3):
        raw = orjson.dumps({"experiment": "m", "request_id": f"w{i}", "reward": 1.0})
        logic.handle(item(logic, "m", parse_feedback(raw, Origin("t", 0, 3))))
    logic.handle(item(logic, "m", feedback("w3", loss=0.5)))
    assert delta("tsi_feedback_given_total", experiment="m", field="reward") == 3
    assert delta("tsi_feedback_given_total", experiment="m", field="loss") == 1
    assert delta("tsi_feedback_total", experiment="m", outcome="applied") == 4


CONTEXTUAL = Registry.from_toml(
    """
[experiments.named]
arms = ["a", "b", "c"]
contexts = { country = ["de", "fr"], device = ["mobile"] }

[experiments.numbered]
arms = ["a", "b"]
competition = { kind = "contextual", n_contexts = 3 }

[experiments.user]
arms = ["a", "b"]
per_unit = true
contexts = { device = ["ios"] }
"""
)


def _samples(name: str, experiment: str) -> dict[tuple[str, str], float]:
    """(context, arm) -> value of one experiment's samples of ``name``."""
    return {
        (s.labels["context"], s.labels["arm"]): s.value
        for family in METRICS.collect()
        for s in family.samples
        if s.name == name and s.labels["experiment"] == experiment
    }


def test_the_context_shares_of_a_shared_contextual_instance_are_its_q_by_context():
    logic = logic_builder(CONTEXTUAL, clock=lambda: 1000.0)(None)
    named = [{"country": c, "device": d} for c in ("de", "fr", "it") for d in ("mobile", "tv")]
    units = [f"u{i}" for i in range(4)]
    for i in range(30):
        logic.handle(item(logic, "named", request(f"n{i}", "named", context=named[i % 6])))
        logic.handle(item(logic, "numbered", request(f"k{i}", "numbered", context=i % 3)))
        unit = units[i % 4]
        key = CONTEXTUAL["user"].instance_key(unit)
        logic.handle(item(logic, key, request(f"p{i}", "user", unit=unit, context=named[0])))
    for i in range(29):
        # losses that vary within each context (i % 6): a context's own level teaches nothing
        logic.handle(item(logic, "named", feedback(f"n{i}", "named", loss=float(i % 5))))
        logic.handle(item(logic, "numbered", feedback(f"k{i}", "numbered", loss=float(i % 2))))
    time.sleep(1.1)  # deliberate: past arm_metrics.SHARE_EVERY of wall time on any host
    logic.handle(item(logic, "named", feedback("n29", "named", loss=0.0)))
    logic.handle(item(logic, "numbered", feedback("k29", "numbered", loss=0.0)))
    labels = {
        "named": [
            f"country={c},device={d}" for c in ("de", "fr", "other") for d in ("mobile", "other")
        ],
        "numbered": ["0", "1", "2"],
    }
    for name, contexts in labels.items():
        bandit = logic.store.instances[name].bandit
        arms = CONTEXTUAL[name].arms
        want = {
            (label, arm): q
            for i, label in enumerate(contexts)
            for arm, q in zip(arms, bandit.policy(i).tolist(), strict=True)
        }
        assert _samples("tsi_arm_context_share", name) == want
        assert len({round(sum(bandit.policy(i)), 9) for i in range(len(contexts))}) == 1
        assert not _samples("tsi_arm_share", name)
    assert len(set(_samples("tsi_arm_context_share", "named").values())) > 3  # they moved
    assert not _samples("tsi_arm_context_share", "user")  # per-unit: never
    assert not _samples("tsi_arm_share", "user")


@settings(max_examples=20, deadline=None)
@given(st.integers(2, 8), st.integers(2, 700), st.booleans())
def test_contexts_times_arms_above_the_limit_export_none(n_arms, n_contexts, per_unit):
    arms = ", ".join(f'"a{i}"' for i in range(n_arms))
    toml = (
        f"[experiments.e]\narms = [{arms}]\nper_unit = {str(per_unit).lower()}\n"
        f'competition = {{ kind = "contextual", n_contexts = {n_contexts} }}'
    )
    labels = context_labels(Registry.from_toml(toml)["e"])
    if per_unit or n_arms * n_contexts > CONTEXT_SHARE_LIMIT:
        assert labels is None
    else:
        assert labels == tuple(str(i) for i in range(n_contexts))


def test_named_contexts_whose_labels_collide_are_labelled_by_index():
    toml = '[experiments.e]\narms = ["a", "b"]\ncontexts = { d = ["x", "other"] }'
    assert context_labels(Registry.from_toml(toml)["e"]) == ("0", "1", "2")


def test_an_experiment_at_the_limit_exports_every_series_one_above_none():
    toml = "\n".join(
        f'[experiments.{name}]\narms = ["a", "b"]\n'
        f'competition = {{ kind = "contextual", n_contexts = {n} }}'
        for name, n in (("at", CONTEXT_SHARE_LIMIT // 2), ("above", CONTEXT_SHARE_LIMIT // 2 + 1))
    )
    registry = Registry.from_toml(toml)
    logic = logic_builder(registry, clock=lambda: 1000.0)(None)
    for name in ("at", "above"):
        logic.handle(item(logic, name, request(f"{name}0", name, context=0)))
    assert len(_samples("tsi_arm_context_share", "at")) == CONTEXT_SHARE_LIMIT
    assert not _samples("tsi_arm_context_share", "above")
