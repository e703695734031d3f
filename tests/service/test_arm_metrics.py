"""Metrics by arm: selections, applied and default losses, their sums and IPS sums, and
the q of shared instances, checked against what the flow emitted and the losses sent."""

import time
from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flows.service.instances.registry import Registry
from flows.service.shards.logic import logic_builder
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
    time.sleep(1.1)  # metrics.SHARE_EVERY
    logic.handle(item(logic, "m", feedback("s19", loss=0.0)))
    q = logic.store.instances["m"].bandit.policy().tolist()
    shares = Delta.__new__(Delta)
    shares.before = {}
    assert [shares("tsi_arm_share", experiment="m", arm=a) for a in "abc"] == q
    assert abs(sum(q) - 1.0) < 1e-9
