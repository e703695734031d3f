"""Constant feedback teaches nothing (docs/explanation/wire-protocol.md): under
translation invariance losses that are all -1 act as losses that are all 0. An
application that reports only conversions leaves the bandit where it started; reporting
the non-conversions too lets it learn."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tsi_core import Bandit, Fixed

ROUNDS = 5000
CONVERSION = (0.5, 0.1, 0.1)  # arm 0 converts five times as often


def served(variant: str, *, non_conversion: float | None, conversion: float = -1.0) -> Bandit:
    """A bandit after ``ROUNDS`` decisions whose conversions are reported as loss
    ``conversion`` and non-conversions as ``non_conversion`` (None: not reported, the
    ticket expires and is discarded)."""
    bandit = Bandit(n_arms=3, competition=Fixed(), seed=1, variant=variant)
    outcomes = random.Random(0)
    for _ in range(ROUNDS):
        ticket = bandit.select()
        if outcomes.random() < CONVERSION[ticket.arm]:
            bandit.update(ticket, loss=conversion)
        elif non_conversion is None:
            bandit.discard(ticket)
        else:
            bandit.update(ticket, loss=non_conversion)
    return bandit


@pytest.mark.parametrize("variant", ["robust", "paper"])
def test_conversions_alone_leave_the_bandit_uniform(variant):
    q = served(variant, non_conversion=None).probabilities()
    assert np.allclose(q, 1 / 3, atol=1e-9)
    shifted = served(variant, non_conversion=None, conversion=0.0).probabilities()
    assert np.array_equal(q, shifted)  # all -1 acts as all 0


@pytest.mark.parametrize("variant", ["robust", "paper"])
def test_non_conversions_sent_as_an_outcome_teach_the_best_arm(variant):
    q = served(variant, non_conversion=0.0).probabilities()
    assert q[0] > 0.95
