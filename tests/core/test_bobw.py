"""The ``bobw`` variant (½-Tsallis-INF on the mean baseline and an RMS scale):
the kernel against a Python transcription, exact propensities, no forced exploration,
invariance under maps that round, and its configuration. Bandit ≡ BatchBandit, 2^k
scaling bit for bit and snapshots run for every preset in ``test_long_horizon.py``,
``test_invariance.py`` and ``test_variants.py``."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core.bobw_reference import BobwReference
from tsi_core import VARIANTS, Bandit, BatchBandit, Contextual, Markov, Switching, Variant
from tsi_core._kernel import Kernel
from tsi_core.variant import TSALLIS_SCALE


def heavy_losses(rng: np.random.Generator, rounds: int, m: int) -> np.ndarray:
    return 50.0 + 10.0 * rng.standard_t(2.5, size=(rounds, m)) + 3.0 * np.arange(m)


@pytest.mark.parametrize("n_contexts", [1, 3])
def test_the_kernel_follows_the_transcription_to_rounding(n_contexts):
    """800 heavy-tailed rounds with in-order feedback: q of every arm within 1e-9 of the
    transcription's (bisection for the normaliser, plain floats for D)."""
    m, rng = 5, np.random.default_rng(4)
    losses = heavy_losses(rng, 800, m)
    competition = Contextual(n_contexts) if n_contexts > 1 else None
    b = Bandit(m, competition, seed=1, variant="bobw")
    ref = BobwReference(m, n_contexts, TSALLIS_SCALE)
    for t in range(len(losses)):
        ctx = int(rng.integers(n_contexts))
        context = ctx if n_contexts > 1 else None
        np.testing.assert_allclose(b.probabilities(context), ref.probabilities(ctx), atol=1e-9)
        ticket = b.select(context=context)
        b.update(ticket, float(losses[t, ticket.arm]))
        ref.update(ctx, ticket.arm, ticket.prob, float(losses[t, ticket.arm]))
    assert b.n_updates == 800
    assert pytest.approx(ref.d, rel=1e-9) == b.D  # D: the root of the arms' mean squares


def test_a_tickets_prob_is_the_exact_probability_of_its_draw():
    """prob is q of the drawn arm as the draw used it: the same number probabilities()
    gives, and the draw is the inverse CDF of those q (no sampling, no estimate)."""
    b = Bandit(4, seed=0, variant="bobw")
    rng = np.random.default_rng(0)
    for _ in range(300):
        q = b.probabilities()
        u = float(rng.random())
        ticket = b.select(u=u)
        assert ticket.prob == q[ticket.arm]
        assert ticket.weight_share == pytest.approx(ticket.prob, rel=1e-15)
        edges = np.cumsum(q)
        assert ticket.arm == min(int(np.sum(edges <= u)), 3)
        b.update(ticket, float(rng.standard_t(3.0) + (ticket.arm != 2)))


def test_there_is_no_forced_exploration_floor():
    """Robust mixes ε_t = sqrt(M/t) of uniform play in; bobw's bad arms fall far below it."""
    rng = np.random.default_rng(1)
    b = Bandit(5, seed=0, variant="bobw")
    for _ in range(3000):
        t = b.select()
        b.update(t, float(rng.random() < (0.2 if t.arm == 0 else 0.8)))
    q = b.probabilities()
    assert q[0] > 0.9 and q.min() < math.sqrt(5 / 3000) / 5 / 4


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_arms=st.integers(1, 40))
def test_probabilities_are_a_distribution_with_every_arm_possible(seed, n_arms):
    rng = np.random.default_rng(seed)
    b = Bandit(n_arms, seed=seed, variant="bobw")
    for _ in range(60):
        t = b.select()
        b.update(t, float(rng.standard_cauchy() * 10.0 ** rng.integers(-5, 6)))
        q = b.probabilities()
        assert abs(q.sum() - 1.0) < 1e-12 and (q > 0).all()


@pytest.mark.parametrize("alpha, beta", [(1000.0, 1e6), (1e-4, -3.0)])
@pytest.mark.parametrize("kind", ["fixed", "contextual"])
def test_maps_that_round_change_no_selection_over_10000_heavy_tailed_rounds(alpha, beta, kind):
    rng = np.random.default_rng(9)
    m, rounds = 6, 10_000
    losses = heavy_losses(rng, rounds, m)
    contexts = rng.integers(3, size=rounds)
    draws = rng.random(rounds)

    def arms(a, b):
        bandit = Bandit(m, Contextual(3) if kind == "contextual" else None, seed=0, variant="bobw")
        out = []
        for t in range(rounds):
            ctx = int(contexts[t]) if kind == "contextual" else None
            ticket = bandit.select(context=ctx, u=float(draws[t]))
            out.append(ticket.arm)
            bandit.update(ticket, a * float(losses[t, ticket.arm]) + b)
        return np.array(out)

    base, mapped = arms(1.0, 0.0), arms(alpha, beta)
    differ = np.flatnonzero(base != mapped)
    assert not len(differ), f"{len(differ)} selections differ, the first at round {differ[0] + 1}"


def test_switching_and_markov_keep_the_robust_round():
    """bobw's Tsallis learner needs an identity transition: Switching and Markov run the
    exponential-weights round of ``robust``, with φ/D read on a grid of 2^-10: the same
    arms in 98% of 500 rounds here, q to 0.02."""
    rng = np.random.default_rng(2)
    markov = Markov(np.full((3, 3), 1 / 3), [0, 1, 2])
    for competition in (Switching(), markov):
        a = Bandit(3, competition, seed=0, variant="bobw")
        b = Bandit(3, competition, seed=0, variant="robust")
        same = 0
        for _ in range(500):
            u = float(rng.random())
            ta, tb = a.select(u=u), b.select(u=u)
            same += ta.arm == tb.arm
            assert a.probabilities() == pytest.approx(b.probabilities(), abs=0.02)
            loss = float(rng.standard_t(2.0))
            a.update(ta, loss)
            b.update(tb, loss)
        assert same >= 490
    assert Bandit(3, variant="bobw").gamma == TSALLIS_SCALE
    assert Bandit(3, Contextual(4), variant="bobw").gamma == TSALLIS_SCALE  # per context


def test_a_robust_snapshot_stays_robust():
    b = Bandit(3, seed=0, variant="robust")
    t = b.select()
    b.update(t, 4.0)
    again = Bandit.from_dict(b.to_dict())
    assert again.variant == VARIANTS["robust"]
    assert again.probabilities().tolist() == b.probabilities().tolist()
    old = b.to_dict()
    old["variant"] = {
        k: v for k, v in old["variant"].items() if k not in ("learner", "tsallis_scale")
    }
    assert Bandit.from_dict(old).variant == VARIANTS["robust"]  # written before this change


def test_batch_bandit_plays_the_same_bits_as_bandits():
    rng = np.random.default_rng(5)
    batch = BatchBandit(3, 4, Contextual(2), seed=0, variant="bobw")
    singles = [Bandit(4, Contextual(2), seed=0, variant="bobw") for _ in range(3)]
    for _ in range(400):
        ctx = rng.integers(2, size=3)
        u = rng.random(3)
        tickets = batch.select(contexts=ctx, u=u)
        one = [b.select(context=int(ctx[i]), u=float(u[i])) for i, b in enumerate(singles)]
        assert tickets.probs.tolist() == [t.prob for t in one]
        losses = rng.standard_t(2.0, size=3) + tickets.arms
        batch.update(tickets, losses)
        for i, b in enumerate(singles):
            b.update(one[i], float(losses[i]))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Variant("x", learner="thompson"), "learner must be one of .* got 'thompson'"),
        (lambda: Variant("x", tsallis_scale=0.0), "tsallis_scale must be a number in .* got 0.0"),
        (lambda: Variant("x", tsallis_scale=True), "got True"),
        (
            lambda: Kernel("cumulative", 3, learner="ts"),
            "learner must be 'exp' or 'tsallis', got 'ts'",
        ),
    ],
)
def test_a_bad_learner_is_refused_naming_the_value(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_the_paper_is_still_exactly_the_paper():
    assert VARIANTS["paper"].is_paper and not VARIANTS["bobw"].is_paper
    assert not Variant("x", learner="tsallis").is_paper


@pytest.mark.parametrize(
    ("old", "new"), [("robust", "bobw"), ("bobw", "robust"), ("paper", "bobw")]
)
@pytest.mark.parametrize("n_contexts", [1, 2])
def test_a_change_of_learner_keeps_the_arm_distribution(old, new, n_contexts):
    """Experiments that follow the default move from robust to bobw on their next event:
    p per context survives the change of learner (to 1e-9), and so do the counters."""
    from tsi_core import migrate

    competition = Contextual(n_contexts) if n_contexts > 1 else None
    b = Bandit(4, competition, seed=0, variant=old)
    rng = np.random.default_rng(3)
    for _ in range(300):
        ctx = int(rng.integers(n_contexts)) if n_contexts > 1 else None
        t = b.select(context=ctx)
        b.update(t, float(rng.standard_t(3.0) + 2.0 * (t.arm != 1)))
    moved = migrate(b, [0, 1, 2, 3], variant=new).bandit
    assert moved.variant == VARIANTS[new] and moved.n_updates == b.n_updates
    for c in range(n_contexts):
        ctx = c if n_contexts > 1 else None
        np.testing.assert_allclose(moved.weight_shares(ctx), b.weight_shares(ctx), atol=1e-9)
    ctx = 0 if n_contexts > 1 else None
    t = moved.select(context=ctx)
    moved.update(t, 1.0)  # and it goes on learning
    assert np.isfinite(moved.probabilities(ctx)).all()


def test_migrating_a_bobw_bandit_keeps_p_and_places_a_new_arm_at_its_share():
    from tsi_core import migrate

    b = Bandit(3, seed=0, variant="bobw")
    rng = np.random.default_rng(6)
    for _ in range(400):
        t = b.select()
        b.update(t, float(rng.standard_t(3.0) + (t.arm != 2)))
    same = migrate(b, [0, 1, 2]).bandit
    assert same.probabilities().tolist() == b.probabilities().tolist()  # exactly
    grown = migrate(b, [0, 1, 2, None], new_arm_share=0.2).bandit
    p = grown.weight_shares()
    assert p[3] == pytest.approx(0.2, abs=1e-9)
    np.testing.assert_allclose(p[:3] / p[:3].sum(), b.weight_shares(), atol=1e-9)
    assert (grown.n_updates, grown._vn, grown._d_mant) == (b.n_updates, b._vn, b._d_mant)
    ctx = migrate(b, [0, 1, 2], competition=Contextual(2)).bandit
    for c in (0, 1):
        np.testing.assert_allclose(ctx.weight_shares(c), b.weight_shares(), atol=1e-9)
