"""Guardrail values sent with feedback: read when valid, a dead letter naming the bad one."""

from __future__ import annotations

import pickle

import orjson
import pytest

from flows.service.wire.events import DeadLetter, Feedback, Origin, parse_feedback

ORIGIN = Origin("tsi.feedback", 0, 3)


def _feedback(**extra) -> bytes:
    return orjson.dumps({"experiment": "e", "request_id": "r1", "loss": 0.5, **extra})


def test_guardrails_are_read_in_order():
    got = parse_feedback(_feedback(guardrails={"latency_ms": 120.5, "error": 1}), ORIGIN)
    assert isinstance(got, Feedback)
    assert got.guardrails == (("latency_ms", 120.5), ("error", 1.0))


def test_feedback_without_guardrails_has_none():
    assert parse_feedback(_feedback(), ORIGIN).guardrails is None


@pytest.mark.parametrize(
    "guardrails, reason, named",
    [
        ({"latency ms": 1}, "bad_value", "'latency ms'"),
        ({"x": "slow"}, "bad_value", "'slow'"),
        ({"x": True}, "bad_value", "True"),
        ({"x": 1e300}, "bad_value", "1e+300"),
        ([1, 2], "wrong_type", "[1, 2]"),
        ({}, "wrong_type", "{}"),
        ({f"m{i}": 1 for i in range(33)}, "wrong_type", "1 to 32"),
    ],
)
def test_a_bad_guardrail_is_a_dead_letter_naming_it(guardrails, reason, named):
    got = parse_feedback(_feedback(guardrails=guardrails), ORIGIN)
    assert isinstance(got, DeadLetter)
    assert got.reason == reason
    assert named in got.detail


def test_guardrails_cross_processes():
    got = parse_feedback(_feedback(guardrails={"error": 1}), ORIGIN)
    assert pickle.loads(pickle.dumps(got)) == got
