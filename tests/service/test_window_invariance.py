"""Decisions do not change when every loss and ``default_loss`` are mapped by the same
l -> a*l + b (a > 0): a few thousand events through the dataflow (the test path, event
time), with feedback for some requests only (``default_loss`` for the others), a floor, a
holdout, a burn-in, eligible arms and windows combining their feedback. ``aggregate =
"sum"`` adds b once per feedback: it is invariant under scaling alone (b = 0)."""

import random

import orjson
import pytest
from bytewax.testing import run_main

from flows.service.connectors.memory import memory_wiring
from flows.service.dataflow import build_flow
from flows.service.instances.registry import Registry
from flows.service.wire.events import Origin

ARMS = '["a", "b", "c", "d"]'
START = 1_700_000_000.0


def registry(default_loss, aggregate):
    return Registry.from_toml(
        f"""
[experiments.conv]
arms = {ARMS}
feedback_ttl = 30
default_loss = {default_loss!r}
min_share = 0.02
holdout = {{ arm = "a", share = 0.1 }}
burn_in = 40
aggregate = "{aggregate}"
"""
    )


def stream(n=2500, seed=5):
    """(ts, message fields, loss or None) in event time: requests, some with eligible
    arms; for about half of them one or two feedback events 5 and 6 s later, of losses 0
    or 1 (mapped by the caller)."""
    rng = random.Random(seed)
    out = []
    for k in range(n):
        fields = {"type": "request", "experiment": "conv", "request_id": f"r{k}"}
        eligible = rng.choice([None, None, ["b", "c"], ["a", "c", "d"]])
        if eligible is not None:
            fields["eligible"] = eligible
        out.append((START + k, fields, None))
        if rng.random() < 0.5:
            fb = {"type": "feedback", "experiment": "conv", "request_id": f"r{k}"}
            out.append((START + k + 5, fb, float(rng.random() < 0.3)))
            if rng.random() < 0.3:
                out.append((START + k + 6, fb, float(rng.random() < 0.6)))
    return sorted(out, key=lambda item: item[0])


def served(mapped, default_loss, aggregate, events):
    """The selections (request_id, arm, prob, why) of ``events`` with each loss l given
    as ``mapped(l)``, and the reasons of the dead letters."""
    messages = []
    for i, (ts, fields, loss) in enumerate(events):
        message = {**fields, "ts": ts}
        if loss is not None:
            message["loss"] = mapped(loss)
        messages.append((orjson.dumps(message), Origin("ev", 0, i)))
    selections, dead = [], []
    wiring = memory_wiring([], [], selections, dead, events=messages)
    run_main(build_flow(registry(default_loss, aggregate), wiring, event_time=True))
    answers = [orjson.loads(v) for _, v in selections]
    picked = [(s["request_id"], s["arm"], s["prob"], s["why"]) for s in answers]
    return picked, sorted({orjson.loads(v)["reason"] for _, v in dead})


@pytest.mark.parametrize(
    ("aggregate", "a", "b"),
    [("first", 3.0, -7.0), ("mean", 0.01, 100.0), ("max", 250.0, 1.0), ("sum", 40.0, 0.0)],
)
def test_decisions_do_not_change_under_an_affine_map_of_the_losses(aggregate, a, b):
    events = stream()
    base, reasons = served(lambda loss: loss, 1.0, aggregate, events)
    mapped, _ = served(lambda loss: a * loss + b, a * 1.0 + b, aggregate, events)
    assert len(base) == sum(1 for _, fields, loss in events if loss is None)
    assert set(reasons) <= {"duplicate_feedback"}
    assert [s[:2] + s[3:] for s in mapped] == [s[:2] + s[3:] for s in base]  # arms, whys
    assert [s[2] for s in mapped] == pytest.approx([s[2] for s in base], rel=1e-9)
    assert {why for *_, why in base} == {"burn_in", "holdout", "bandit"}


def test_a_map_that_is_not_affine_changes_decisions():
    """The test above could fail: losses 0 and 1 swapped (the default stays 1) serve
    other arms."""
    events = stream()
    base, _ = served(lambda loss: loss, 1.0, "first", events)
    swapped, _ = served(lambda loss: 1.0 - loss, 1.0, "first", events)
    assert [s[1] for s in swapped] != [s[1] for s in base]
