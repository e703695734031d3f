"""Peer libraries' bandits behind the BatchBandit interface (arena/peers/).

The peers are installed by the project's ``lab`` extra, so a peer that does not import is a
failure here, not a skip.
"""

from __future__ import annotations

import sys
import warnings
from functools import cache

import numpy as np
import pytest

from arena.peers import (
    INSTALL_HINT,
    KINDS,
    PEERS,
    Failure,
    PeerBatch,
    PeerFaultError,
    available_peers,
    missing_peers,
)
from tsi_core import BatchBandit, TicketError

N, M, T, LAST = 3, 5, 500, 200
MEANS = np.array([0.1, 0.6, 0.6, 0.6, 0.6])  # arm 0 is best

# (upper, lower) bounds on the mean realised loss over the last 200 rounds on the table below
# (uniform play: about 0.5); upper None: only "beats uniform play". Checked on 10 seeds: the
# fast learners stay far below their upper bound; the slow ones (lower bound given) only just
# beat uniform play, and TsallisInf varies from 0.30 to 0.49 with the seed.
LEARNING_BOUND = {
    "river Exp3": (0.3, None),
    "SMPyBandits Exp3": (None, 0.35),  # γ = 0.01: weights move by ~γ/K per round
    "SMPyBandits Exp3S": (0.42, None),
    "SMPyBandits TsallisInf": (None, None),  # reward = -loss: it sees 1 + loss (PEERS.md)
    "VW cb_explore": (0.35, None),
    "VW cb_explore_adf": (0.3, None),
    "MABWiser Softmax": (None, 0.35),  # τ = 1 on mean rewards -0.1 vs -0.6: odds only e^0.5
    "MABWiser EpsilonGreedy": (0.3, None),
    "MABWiser UCB1": (0.3, None),
}

# What happens on losses 1e6 + 1000 · (the same Bernoulli table): rewards -(1e6 + …).
# kind and latest round of the failure every instance must have, or None for no failure.
HUGE_FINDING = {
    "river Exp3": ("collapse", 20),  # all weights underflow to 0 once each arm was played
    "SMPyBandits Exp3": ("nan", 20),  # its renormalisation divides 0 by 0
    "SMPyBandits Exp3S": None,
    "SMPyBandits TsallisInf": None,
    "VW cb_explore": None,
    "VW cb_explore_adf": None,
    "MABWiser Softmax": None,
    "MABWiser EpsilonGreedy": None,
    "MABWiser UCB1": None,
}

IDS = [cls.name for cls in PEERS]


def require(cls: type[PeerBatch]) -> None:
    """Fail (not skip) when the peer's library does not import."""
    try:
        cls.load()
    except ImportError as exc:
        pytest.fail(f"{cls.name}: {exc}\nthe peers come with the lab extra: {INSTALL_HINT}")


def loss_table(rounds: int = T, seed: int = 2024) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.random((rounds, M)) < MEANS).astype(float)


def play(
    cls: type[PeerBatch], losses: np.ndarray, seed: int = 11, **kw: object
) -> tuple[PeerBatch, np.ndarray, np.ndarray]:
    """Every instance plays the same loss table; (adapter, arms (T, N), probs (T, N))."""
    bandit = cls(N, M, seed=seed, **kw)
    arms = np.empty((len(losses), N), dtype=np.int64)
    probs = np.empty((len(losses), N))
    try:
        for t, row in enumerate(losses):
            tickets = bandit.select()
            assert tickets.every and tickets.rounds.tolist() == [t + 1] * N
            bandit.update(tickets, row[tickets.arms])
            arms[t], probs[t] = tickets.arms, tickets.probs
    finally:
        bandit.close()
    return bandit, arms, probs


@cache
def bernoulli_run(name: str) -> tuple[PeerBatch, np.ndarray, np.ndarray]:
    return play(available_peers()[name], loss_table())


def test_every_peer_imports():
    missing = missing_peers()
    assert not missing, f"peers that do not import: {missing}; install them: {INSTALL_HINT}"
    assert list(available_peers()) == IDS


@pytest.mark.parametrize("cls", PEERS, ids=IDS)
def test_peer_learns_on_a_bernoulli_table(cls):
    """500 rounds, 3 instances, M = 5, mean losses 0.1 (arm 0) and 0.6: arms are in range,
    and the realised loss over the last 200 rounds beats uniform play.

    All nine peers learn here. Two learn slowly and only just beat uniform play: SMPyBandits
    Exp3 with its default γ = 0.01, and MABWiser Softmax with τ = 1 (mean rewards -0.1 vs -0.6
    give the best arm odds of only e^0.5). For them the test checks exactly that. TsallisInf,
    given reward = -loss, learns at a rate that varies a lot with the seed.
    """
    require(cls)
    bandit, arms, probs = bernoulli_run(cls.name)
    assert ((arms >= 0) & (arms < M)).all()
    assert not bandit.failures
    table = loss_table()
    realised = table[np.arange(T)[:, None], arms][-LAST:].mean()
    uniform = table[-LAST:].mean()  # expected loss of uniform play on the same rounds
    upper, lower = LEARNING_BOUND[cls.name]
    assert realised < (uniform if upper is None else upper), (realised, uniform)
    if lower is not None:
        assert realised > lower, f"{cls.name} learns faster than documented: {realised}"
    if cls.exposes_probabilities:
        assert ((probs > 0) & (probs <= 1)).all()
        p = bandit.probabilities()
        assert p.shape == (N, M) and np.allclose(p.sum(axis=1), 1.0)
        assert (p.argmax(axis=1) == 0).all()  # the best arm is the most likely one
    else:
        assert np.isnan(probs[1:]).all()  # MABWiser: no selection probabilities
        with pytest.raises(NotImplementedError):
            bandit.probabilities()


@pytest.mark.parametrize("cls", PEERS, ids=IDS)
def test_same_seed_same_arms(cls):
    """Same seed, same arms. Other seeds (and the other instances, which have their own
    seeds) give other arms, except for MABWiser UCB1: after its first, uniformly drawn arm it
    draws nothing (ties go to the first arm), and on a shared loss table it soon plays the
    same arms whatever the seed."""
    require(cls)
    _, arms, _ = bernoulli_run(cls.name)
    rounds = 150
    _, again, _ = play(cls, loss_table()[:rounds])
    np.testing.assert_array_equal(again, arms[:rounds])
    if cls.name != "MABWiser UCB1":
        _, other, _ = play(cls, loss_table()[:rounds], seed=12)
        assert (other != arms[:rounds]).any()
        assert (arms[:rounds, 0] != arms[:rounds, 1]).any()


@pytest.mark.parametrize("cls", PEERS, ids=IDS)
def test_huge_shifted_losses_are_recorded(cls):
    """Losses 1e6 + 1000 · ℓ (ℓ the Bernoulli table), i.e. rewards -(1e6 + 1000 ℓ): whatever
    happens is recorded. Observed (300 rounds, 3 instances; also in arena/PEERS.md):

    - river Exp3: every instance's weights underflow to exactly 0 as soon as each arm has been
      played once (round 5-8): recorded as "collapse" (river's next ``pull`` would raise
      ZeroDivisionError); the instances then play uniformly.
    - SMPyBandits Exp3: the same underflow, then its renormalisation 0/0 gives NaN weights:
      "nan" at round 5 (SMPyBandits itself would silently play uniformly from then on).
    - SMPyBandits Exp3S: no failure; the additive mixing keeps the weights positive, but it
      does not learn (last-200 loss ≈ uniform).
    - SMPyBandits TsallisInf: no failure but divide-by-zero warnings every round; its
      probabilities stay exactly uniform: it never learns.
    - VW cb_explore / cb_explore_adf: no failure; each instance settles on an arbitrary arm
      (probability 0.96), about as good as uniform play on average.
    - MABWiser Softmax / EpsilonGreedy / UCB1: no failure; they work on empirical means, so the
      shift does not matter, and the scale makes Softmax and UCB1 almost greedy.
    """
    require(cls)
    shifted = 1e6 + 1000.0 * loss_table(300)
    bandit, arms, probs = play(cls, shifted)
    assert ((arms >= 0) & (arms < M)).all()
    for f in bandit.failures:
        assert isinstance(f, Failure) and f.kind in KINDS and f.detail
        assert 0 <= f.instance < N and 1 <= f.round <= 300
    first = bandit.failure_rounds()
    assert sorted(first) == np.flatnonzero(bandit.failed).tolist()
    for i, rnd in first.items():  # after its failure an instance plays uniformly
        assert (probs[rnd:, i] == 1 / M).all()
    finding = HUGE_FINDING[cls.name]
    if finding is None:
        assert not bandit.failures, bandit.failures
        if cls.exposes_probabilities:
            assert np.isfinite(probs).all()
            p = bandit.probabilities()
            assert np.isfinite(p).all() and np.allclose(p.sum(axis=1), 1.0)
    else:
        kind, latest = finding
        assert sorted(first) == list(range(N)), bandit.failures
        assert {f.kind for f in bandit.failures} == {kind}
        assert max(first.values()) <= latest
        assert np.allclose(bandit.probabilities(), 1 / M)
    if cls.name == "SMPyBandits TsallisInf":
        assert np.allclose(bandit.probabilities(), 1 / M)
        assert any("divide by zero" in m for m in bandit.numeric_warnings)


@pytest.mark.parametrize("cls", [c for c in PEERS if c.exposes_probabilities], ids=lambda c: c.name)
def test_asking_for_probabilities_does_not_change_play(cls):
    """The arena may read probabilities() every round (expected regret): same arms."""
    require(cls)
    _, arms, _ = bernoulli_run(cls.name)
    bandit = cls(N, M, seed=11)
    table = loss_table(100)
    for t in range(100):
        p = bandit.probabilities()
        tickets = bandit.select()
        np.testing.assert_allclose(p[np.arange(N), tickets.arms], tickets.probs, rtol=1e-6)
        assert (tickets.arms == arms[t]).all()
        bandit.update(tickets, table[t, tickets.arms])
    bandit.close()


def test_range_aware_rewards():
    cls = available_peers()["river Exp3"]
    bandit = cls(1, M, seed=0, loss_range=(-2.0, 2.0))
    assert bandit.reward(-2.0) == 1.0 and bandit.reward(2.0) == 0.0
    assert bandit.cost(-2.0) == 0.0 and bandit.cost(2.0) == 1.0
    assert cls(1, M).reward(3.5) == -3.5
    with pytest.raises(ValueError, match="loss_range"):
        cls(1, M, loss_range=(1.0, 1.0))


# --- the failure machinery, on a peer that misbehaves on purpose ---------------------------


class Broken(PeerBatch):
    """A fake peer: instance 0 raises in round 3, instance 1 overflows in round 2, instance 2
    reports NaN state in round 4, instance 3 only makes numpy warn of an invalid value."""

    name = "broken"
    library = "none"
    exposes_probabilities = True

    @classmethod
    def _load(cls):
        return None

    def _make(self, i, seed):
        return {"t": 0}

    def _choose(self, i, u):
        return 1, 0.5

    def _learn(self, i, arm, prob, loss):
        peer = self.peers[i]
        peer["t"] += 1
        if i == 0 and peer["t"] == 3:
            raise RuntimeError("boom")
        if i == 1 and peer["t"] == 2:
            np.exp(np.array([1000.0]))
        if i == 2 and peer["t"] == 4:
            raise PeerFaultError("nan", "weights contain NaN")
        if i == 3:
            np.zeros(1) / np.zeros(1)

    def _probs(self, i):
        return np.eye(M)[1]


def test_failures_are_recorded_and_fall_back_to_uniform():
    bandit = Broken(4, M, seed=0)
    arms = []
    for _ in range(6):
        tickets = bandit.select()
        bandit.update(tickets, np.ones(4))
        arms.append(tickets.arms)
    got = [(f.instance, f.round, f.kind) for f in bandit.failures]
    assert got == [(1, 2, "overflow"), (0, 3, "exception"), (2, 4, "nan")]
    assert "RuntimeError: boom" in bandit.failures[1].detail
    assert "overflow encountered" in bandit.failures[0].detail
    assert bandit.failed.tolist() == [True, True, True, False]
    assert bandit.numeric_warnings["invalid value encountered in divide"].calls == 6
    p = bandit.probabilities()
    np.testing.assert_allclose(p[:3], 1 / M)
    np.testing.assert_array_equal(p[3], np.eye(M)[1])
    tickets = bandit.select(u=[0.99, 0.0, 0.5, 0.5])
    assert tickets.arms.tolist() == [M - 1, 0, 2, 1]  # uniform fallback uses u
    assert tickets.probs.tolist() == [1 / M, 1 / M, 1 / M, 0.5]


def test_tickets_are_checked_like_batchbandit():
    bandit = Broken(2, M, seed=0)
    tickets = bandit.select()
    with pytest.raises(TicketError, match="unsettled"):
        bandit.select()
    with pytest.raises(TicketError, match="another bandit"):
        bandit.update(BatchBandit(2, M, seed=0).select(), np.ones(2))
    with pytest.raises(ValueError, match="finite"):
        bandit.update(tickets, [1.0, np.nan])
    with pytest.raises(ValueError, match="context-free"):
        bandit.select(instances=[0], contexts=[0])
    bandit.update(tickets, np.ones(2), where=np.array([True, False]))
    part = bandit.select(instances=[0])
    assert not part.every and part.instances.tolist() == [0] and part.rounds.tolist() == [2]
    bandit.discard(tickets, where=np.array([False, True]))
    with pytest.raises(TicketError, match="settled"):
        bandit.update(tickets, np.ones(2))
    bandit.update(part, [0.0])
    assert bandit.n_updates.tolist() == [2, 0]


def test_peer_construction_errors_name_the_install_command():
    class Missing(Broken):
        name = "missing"

        @classmethod
        def _load(cls):
            import a_module_that_does_not_exist  # noqa: F401

    with pytest.raises(ImportError, match=r"pip install -e '\.\[lab\]'"):
        Missing(1, M)


def test_smpybandits_leaves_the_process_alone():
    """SMPyBandits calls np.seterr(divide='ignore') and puts '..' on sys.path when imported,
    and draws from numpy's global generator: the adapter undoes and avoids all of that."""
    cls = available_peers()["SMPyBandits Exp3"]
    cls.load()
    assert ".." not in sys.path
    assert np.geterr()["divide"] == "warn"
    np.random.seed(5)
    before = np.random.get_state()[1].copy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and its import notes are not printed as warnings
        play(cls, loss_table(20))
    np.testing.assert_array_equal(np.random.get_state()[1], before)
