"""BatchBandit: the same selections as separate Bandits, and the same refusals."""

import numpy as np
import pytest

from tsi_core import Bandit, BatchBandit, Contextual, Fixed, Markov, Switching, TicketError

CASES = [
    Fixed(),
    Switching(rate=0.02),
    Switching(),
    Contextual(3),
    Markov([[0.9, 0.1, 0, 0], [0, 0.8, 0.2, 0], [0, 0, 0.9, 0.1], [0.3, 0, 0, 0.7]], [0, 1, 2, 2]),
]


@pytest.mark.parametrize("competition", CASES, ids=lambda c: type(c).__name__)
def test_batch_equals_separate_bandits_with_delayed_partial_feedback(competition):
    n, m = 6, 3
    rng = np.random.default_rng(42)
    batch = BatchBandit(n, m, competition, seed=0)
    singles = [Bandit(m, competition, seed=0) for _ in range(n)]
    contextual = isinstance(competition, Contextual)
    scales = 10.0 ** rng.integers(-100, 100, size=n)  # each instance in its own units
    waiting = []
    for step in range(300):
        ctx = rng.integers(0, 3, size=n) if contextual else None
        u = rng.random(n)
        tickets = batch.select(contexts=ctx, u=u)
        single = [
            b.select(context=None if ctx is None else int(c), u=float(x))
            for b, c, x in zip(singles, ctx if contextual else [None] * n, u, strict=True)
        ]
        assert tickets.arms.tolist() == [t.arm for t in single]
        # one arithmetic for both engines: q is the same float, bit for bit (a rounding
        # difference would grow about x10 per 100 rounds and change the arms later)
        assert tickets.probs.tolist() == [t.prob for t in single]
        losses = scales * (tickets.arms + rng.normal(size=n))
        waiting.append((tickets, single, losses))
        if step % 3 == 2:  # feedback arrives late, in two halves, newest first
            for tickets, single, losses in reversed(waiting):
                first = rng.random(n) < 0.5
                for part in (first, ~first):
                    batch.update(tickets, losses, where=part)
                    for i in np.flatnonzero(part):
                        singles[i].update(single[i], float(losses[i]))
            waiting = []
    for i, b in enumerate(singles):
        assert batch.psi[i] == b.psi and batch.n_updates[i] == b.n_updates
        ctx = [0] if contextual else None
        assert np.array_equal(
            batch.probabilities([i], ctx)[0], b.probabilities(0 if contextual else None)
        )


def test_subset_selection_only_touches_the_chosen_instances():
    batch = BatchBandit(5, 4, seed=1)
    before = batch.probabilities().copy()
    t = batch.select(instances=[3, 1])
    batch.update(t, np.array([10.0, -3.0]))
    assert batch.n_rounds.tolist() == [0, 1, 0, 1, 0]
    after = batch.probabilities()
    assert np.array_equal(after[[0, 2, 4]], before[[0, 2, 4]])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda b, t: b.update(t, [1.0, float("nan"), 2.0]), r"losses\[1\] = nan"),
        (lambda b, t: b.update(t, [1.0, 2.0]), "losses must be 3 real numbers"),
        (lambda b, t: b.update(t, np.array(["a", "b", "c"])), "losses must be 3 real numbers"),
        (lambda b, t: b.update(t, np.array([True, False, True])), "losses must be 3 real"),
        (
            lambda b, t: b.update(t, [1.0, np.inf, 2.0], where=np.array([True, True, False])),
            r"losses\[1\] = inf",
        ),
        (lambda b, t: b.update(t, [1.0, 2.0, 3.0], where=[1, 0, 1]), "where must be 3 booleans"),
        (lambda b, t: b.select(u=[0.1, 1.0, 0.2]), r"u\[1\] = 1.0|u must be in"),
        (lambda b, t: b.select(u=[0.1, 0.2]), "u must be 2 real|u must be 3 real"),
        (lambda b, t: b.select(instances=[0, 0]), "must not repeat"),
        (lambda b, t: b.select(instances=[0, 7]), r"instances\[1\] = 7 is outside"),
        (lambda b, t: b.select(contexts=[0, 0, 0]), "has no contexts"),
    ],
)
def test_batch_bad_input_is_refused_and_changes_nothing(call, message):
    b = BatchBandit(3, 2, seed=5)
    t = b.select()
    state = (b.weights.copy(), b.psi.copy(), b.vn.copy(), b.n_rounds.copy(), b.n_updates.copy())
    with pytest.raises(ValueError, match=message):
        call(b, t)
    for old, new in zip(state, (b.weights, b.psi, b.vn, b.n_rounds, b.n_updates), strict=True):
        assert np.array_equal(old, new)
    b.update(t, [1.0, 2.0, 3.0])  # the tickets are still open


def test_batch_tickets_settle_once_and_only_on_their_batch():
    a, other = BatchBandit(3, 2, seed=5), BatchBandit(3, 2, seed=5)
    t = a.select()
    a.update(t, [1.0, 2.0, 3.0], where=np.array([True, False, False]))
    with pytest.raises(TicketError, match=r"entry 0 .* already settled"):
        a.update(t, [1.0, 2.0, 3.0])
    with pytest.raises(TicketError, match="another BatchBandit"):
        other.update(t, [1.0, 2.0, 3.0])
    a.discard(t, where=np.array([False, True, True]))
    with pytest.raises(TicketError, match="already settled"):
        a.update(t, [1.0, 2.0, 3.0])
    assert a.n_updates.tolist() == [1, 0, 0]


@pytest.mark.parametrize("competition", [Fixed(), Switching(rate=0.01)], ids=["fixed", "switching"])
@pytest.mark.parametrize("n_arms", [40, 300])  # above SCALAR_ARMS: the array path of Bandit
def test_batch_equals_separate_bandits_with_many_arms(n_arms, competition):
    rng = np.random.default_rng(7)
    batch = BatchBandit(3, n_arms, competition, seed=0)
    singles = [Bandit(n_arms, competition, seed=0) for _ in range(3)]
    means = rng.random(n_arms)
    for _ in range(400):
        u = rng.random(3)
        tickets = batch.select(u=u)
        single = [b.select(u=float(x)) for b, x in zip(singles, u, strict=True)]
        assert tickets.arms.tolist() == [t.arm for t in single]
        losses = means[tickets.arms] + rng.normal(size=3)
        batch.update(tickets, losses)
        for b, t, loss in zip(singles, single, losses, strict=True):
            b.update(t, float(loss))
    for i, b in enumerate(singles):
        assert np.array_equal(batch.probabilities([i])[0], b.probabilities())


def test_a_ticket_batch_keeps_its_rounds_when_the_bandit_moves_on():
    bb = BatchBandit(3, 2, seed=0)
    first = bb.select()
    bb.select()
    assert first.rounds.tolist() == [1, 1, 1]
