"""The confidence sequence under continuous monitoring: few false breaches when nothing
differs, however often it is looked at; a real difference found."""

from __future__ import annotations

import math

import numpy as np
import pytest

from flows.guardrails.sequential import (
    Interval,
    Sums,
    breached,
    confidence_sequence,
    half_width,
    rho2,
)

STREAMS, LOOKS, PER_LOOK = 2000, 1000, 10
ALPHA, MIN_SAMPLES, HOLDOUT = 0.05, 50, 0.1


def _breach_rate(draw, shift: float, seed: int) -> tuple[float, np.ndarray]:
    """Simulate STREAMS streams of LOOKS looks, PER_LOOK samples each (a HOLDOUT share held
    out at random); the share of streams whose interval of treatment - holdout went wholly
    above 0 at some look, and the look each first did (LOOKS: never)."""
    rng = np.random.default_rng(seed)
    sums = np.zeros((6, STREAMS))  # n, sum, squares of treatment, then of the holdout
    first = np.full(STREAMS, LOOKS)
    rho_2 = rho2(ALPHA, MIN_SAMPLES / 2.0)
    for look in range(LOOKS):
        x = draw(rng, (STREAMS, PER_LOOK))
        held = rng.random((STREAMS, PER_LOOK)) < HOLDOUT
        x = np.where(held, x, x + shift)
        for base, mask in ((0, ~held), (3, held)):
            sums[base] += mask.sum(axis=1)
            sums[base + 1] += (x * mask).sum(axis=1)
            sums[base + 2] += (x * x * mask).sum(axis=1)
        n1, n2 = sums[0], sums[3]
        ready = np.minimum(n1, n2) >= MIN_SAMPLES
        m1, m2 = sums[1] / np.maximum(n1, 1), sums[4] / np.maximum(n2, 1)
        v1 = np.maximum(sums[2] / np.maximum(n1, 1) - m1 * m1, 0.0)
        v2 = np.maximum(sums[5] / np.maximum(n2, 1) - m2 * m2, 0.0)
        t = n1 * n2 / np.maximum(n1 + n2, 1)
        pooled = (n1 * v1 + n2 * v2) / np.maximum(n1 + n2, 1)
        v1, v2 = np.maximum(v1, pooled), np.maximum(v2, pooled)
        sigma2 = t * (v1 / np.maximum(n1, 1) + v2 / np.maximum(n2, 1))
        half = half_width(np.maximum(t, 1.0), sigma2, ALPHA, rho_2)
        hit = ready & (m1 - m2 - half > 0.0) & (first == LOOKS)
        first[hit] = look
    return float(np.mean(first < LOOKS)), first


def _binomial_margin(p: float, n: int) -> float:
    return 3.0 * math.sqrt(p * (1 - p) / n)


@pytest.mark.parametrize(
    "name, draw",
    [
        ("normal", lambda rng, shape: rng.normal(0.0, 1.0, shape)),
        ("errors", lambda rng, shape: (rng.random(shape) < 0.05).astype(float)),
        ("latency", lambda rng, shape: rng.exponential(120.0, shape)),
    ],
)
def test_no_difference_breaches_rarely_over_many_looks(name, draw):
    rate, _ = _breach_rate(draw, 0.0, seed=7)
    assert rate < ALPHA + _binomial_margin(ALPHA, STREAMS), (name, rate)


def test_a_real_difference_is_found():
    rate, first = _breach_rate(lambda rng, shape: rng.normal(0.0, 1.0, shape), 0.5, seed=11)
    assert rate > 0.95
    assert np.median(first) < LOOKS / 2


def test_the_module_agrees_with_the_vectorised_simulation():
    treated, held = Sums(900, 990.0, 2000.0), Sums(100, 100.0, 200.0)
    interval = confidence_sequence(treated, held, ALPHA, MIN_SAMPLES)
    t = 900 * 100 / 1000
    pooled = (900 * treated.variance + 100 * held.variance) / 1000
    sigma2 = t * (max(treated.variance, pooled) / 900 + max(held.variance, pooled) / 100)
    half = float(half_width(t, sigma2, ALPHA, rho2(ALPHA, MIN_SAMPLES / 2.0)))
    assert interval.estimate == pytest.approx(0.1)
    assert interval.high - interval.estimate == pytest.approx(half)


def test_the_interval_narrows_as_samples_come():
    widths = []
    for n in (100, 1000, 10000):
        i = confidence_sequence(Sums(n, n * 1.0, n * 2.0), Sums(n, 0.0, n * 1.0), ALPHA, 100)
        widths.append(i.high - i.low)
    assert widths[0] > widths[1] > widths[2]


def test_breach_is_the_worse_side_only():
    above = Interval(1.0, 0.5, 1.5)
    assert breached(above, "higher", 0.0)
    assert not breached(above, "higher", 0.6)  # within the margin tolerated
    assert not breached(above, "lower", 0.0)
    with pytest.raises(ValueError, match="'sideways'"):
        breached(above, "sideways", 0.0)
