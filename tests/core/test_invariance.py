"""Decisions do not change when losses are shifted or rescaled (α·l + β, α > 0), for every
variant: bit for bit under 2^k scaling, and under integer shifts of integer losses too
where the baseline is the running minimum (the mean baseline divides, so a shift agrees to
rounding)."""

import os

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tsi_core import VARIANTS, Bandit, Contextual, Fixed, Markov, Switching

COMPETITIONS = {
    "fixed": lambda: Fixed(),
    "switching": lambda: Switching(rate=0.02),
    "decaying": lambda: Switching(),
    "contextual": lambda: Contextual(2),
    "markov": lambda: Markov([[0.8, 0.2, 0.0], [0.0, 0.7, 0.3], [0.25, 0.0, 0.75]], [0, 1, 1]),
}


def run(table, transform, competition, draws, contexts, variant=None):
    """Arms chosen and q's of a bandit fed transform(table[t, arm])."""
    b = Bandit(
        table.shape[1], COMPETITIONS[competition](), seed=0, instance_id="x", variant=variant
    )
    arms, qs = [], []
    for t, u in enumerate(draws):
        ctx = int(contexts[t]) if competition == "contextual" else None
        qs.append(b.probabilities(ctx))
        ticket = b.select(context=ctx, u=u)
        arms.append(ticket.arm)
        b.update(ticket, transform(table[t, ticket.arm]))
    return arms, np.array(qs)


tables = st.integers(0, 2**32 - 1).map(
    lambda s: np.random.default_rng(s).integers(-50, 50, size=(120, 3)).astype(float)
)


@settings(max_examples=int(os.environ.get("TSI_HYPOTHESIS_EXAMPLES", 40)), deadline=None)
@given(
    table=tables,
    k=st.integers(-30, 30),
    shift=st.integers(-1000, 1000),
    competition=st.sampled_from(sorted(COMPETITIONS)),
    variant=st.sampled_from(sorted(VARIANTS)),
    seed=st.integers(0, 2**32 - 1),
)
def test_power_of_two_scale_and_integer_shift_give_identical_bits(
    table, k, shift, competition, variant, seed
):
    """Bits under 2^k·(l + shift) with the minimum baseline, under 2^k·l with the mean; the
    mean with a shift chooses the same arms with q equal to rounding."""
    rng = np.random.default_rng(seed)
    draws, contexts = rng.random(len(table)), rng.integers(0, 2, len(table))
    exact_shift = VARIANTS[variant].baseline == "min"
    arms, qs = run(table, float, competition, draws, contexts, variant)
    scaled_arms, scaled_qs = run(
        table,
        lambda x: float(np.ldexp(x + (shift if exact_shift else 0), k)),
        competition,
        draws,
        contexts,
        variant,
    )
    assert arms == scaled_arms
    assert np.array_equal(qs, scaled_qs)
    if not exact_shift:
        shifted_arms, shifted_qs = run(
            table, lambda x: x + shift, competition, draws, contexts, variant
        )
        assert shifted_arms == arms
        np.testing.assert_allclose(shifted_qs, qs, rtol=1e-9, atol=0)


@settings(max_examples=int(os.environ.get("TSI_HYPOTHESIS_EXAMPLES", 40)), deadline=None)
@given(
    table=tables,
    alpha=st.floats(1e-3, 1e3),
    shift=st.floats(-1e3, 1e3),
    competition=st.sampled_from(sorted(COMPETITIONS)),
    variant=st.sampled_from(sorted(VARIANTS)),
    seed=st.integers(0, 2**32 - 1),
)
def test_any_affine_map_keeps_probabilities_to_rounding(
    table, alpha, shift, competition, variant, seed
):
    """β = α·shift: the map α·l + β itself rounds each loss by about ulp(β)/α in units of the
    loss scale; keeping |β|/α <= 1e3 keeps that input error near 1e-13, so a disagreement
    beyond 1e-9 would be the algorithm's own."""
    beta = alpha * shift
    rng = np.random.default_rng(seed)
    draws, contexts = rng.random(len(table)), rng.integers(0, 2, len(table))
    table = table + rng.random(table.shape)  # non-integer losses
    arms, qs = run(table, float, competition, draws, contexts, variant)
    mapped_arms, mapped_qs = run(
        table, lambda x: alpha * x + beta, competition, draws, contexts, variant
    )
    assert arms == mapped_arms
    np.testing.assert_allclose(mapped_qs, qs, rtol=1e-9, atol=0)


def test_exp3_style_learning_rate_is_not_invariant():
    """Control: the same check fails for a bandit that uses the raw loss scale."""
    table = np.random.default_rng(3).integers(0, 10, size=(120, 3)).astype(float)
    draws = np.random.default_rng(4).random(120)

    def exp3(scale):
        logw, arms = np.zeros(3), []
        for t, u in enumerate(draws):
            p = np.exp(logw - logw.max())
            p /= p.sum()
            arm = int(np.searchsorted(np.cumsum(p), u, side="right"))
            arms.append(arm)
            logw[arm] -= 0.1 * scale * table[t, arm] / p[arm]
        return arms

    assert exp3(1.0) != exp3(1024.0)
