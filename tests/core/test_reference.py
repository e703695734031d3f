"""The fast implementation agrees with a direct transcription of the paper's formulas."""

import numpy as np
import pytest

from tests.core.paper_reference import PaperReference
from tsi_core import Bandit, Contextual, Fixed, Markov, Switching


def switching_kernel(m, rate):
    def kernel(k):
        a = 1.0 / (k + 1) if rate is None else rate
        return (1 - a) * np.eye(m) + a / (m - 1) * (1 - np.eye(m))

    return kernel


def random_chain(rng, k, m):
    t = rng.random((k, k)) * (rng.random((k, k)) < 0.6)
    t[np.arange(k), np.arange(k)] += 0.5  # every row keeps some mass
    t /= t.sum(axis=1, keepdims=True)
    initial = rng.random(k)
    return t, rng.integers(0, m, size=k), initial / initial.sum()


def pair(name, rng, m):
    """(competition, reference factory, number of contexts) for a named case."""
    if name == "fixed":
        return (
            Fixed(),
            lambda g: PaperReference(
                m, lambda lam, c: lam, lambda k: np.eye(m), np.full(m, 1 / m), g
            ),
            1,
        )
    if name in ("switching", "decaying"):
        rate = 0.05 if name == "switching" else None
        return (
            Switching(rate=rate),
            lambda g: PaperReference(
                m, lambda lam, c: lam, switching_kernel(m, rate), np.full(m, 1 / m), g
            ),
            1,
        )
    if name == "contextual":
        n_ctx = 2
        k = m**n_ctx
        return (
            Contextual(n_ctx),
            lambda g: PaperReference(
                m, lambda lam, c: (lam // m**c) % m, lambda _: np.eye(k), np.full(k, 1 / k), g
            ),
            n_ctx,
        )
    t, arm_of, initial = random_chain(rng, 5, m)
    return (
        Markov(t, arm_of, initial),
        lambda g: PaperReference(m, lambda lam, c: int(arm_of[lam]), lambda _: t, initial, g),
        1,
    )


@pytest.mark.parametrize("name", ["fixed", "switching", "decaying", "contextual", "markov"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_probabilities_match_paper_transcription(name, seed):
    rng = np.random.default_rng(seed)
    m = 3
    competition, make_reference, n_ctx = pair(name, rng, m)
    bandit = Bandit(m, competition, seed=seed, variant="paper")
    reference = make_reference(bandit.gamma)
    means = rng.normal(size=(n_ctx, m)) * 3
    for _ in range(150):
        ctx = int(rng.integers(n_ctx))
        context = ctx if n_ctx > 1 else None
        q_ref, _ = reference.policy(ctx)
        np.testing.assert_allclose(bandit.probabilities(context), q_ref, rtol=1e-9, atol=0)
        ticket = bandit.select(context=context, u=float(rng.random()))
        loss = float(means[ctx, ticket.arm] + rng.normal())
        reference.update(ticket.arm, loss, ticket.prob, ticket.weight_share, ctx)
        bandit.update(ticket, loss)
    assert pytest.approx(reference.V, rel=1e-12) == bandit.V
    assert pytest.approx(reference.D, rel=1e-15) == bandit.D
    assert bandit.psi == reference.psi


def test_reference_harness_detects_a_wrong_learning_rate():
    """The comparison above is sharp: γ off by 1% already breaks agreement."""
    rng = np.random.default_rng(5)
    bandit = Bandit(3, Fixed(), seed=0, variant="paper")
    reference = PaperReference(
        3, lambda lam, c: lam, lambda k: np.eye(3), np.full(3, 1 / 3), bandit.gamma * 1.01
    )
    worst = 0.0
    for _ in range(100):
        q_ref, _ = reference.policy()
        worst = max(worst, float(np.max(np.abs(bandit.probabilities() / q_ref - 1))))
        ticket = bandit.select(u=float(rng.random()))
        loss = float(ticket.arm + rng.normal())
        reference.update(ticket.arm, loss, ticket.prob, ticket.weight_share)
        bandit.update(ticket, loss)
    assert worst > 1e-6
