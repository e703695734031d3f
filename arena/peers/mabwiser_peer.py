"""MABWiser's Softmax, EpsilonGreedy and UCB1 behind ``PeerBatch``, adapted round by round.

MABWiser exposes no selection probabilities: ``probs`` in the tickets is NaN (except for an
instance's first, uniformly drawn arm) and ``probabilities()`` raises ``NotImplementedError``.
"""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace
from typing import Any

import numpy as np

from arena.peers.base import PeerBatch, PeerFaultError, quiet_import


@functools.cache
def _mabwiser() -> Any:
    with quiet_import():
        from mabwiser.mab import MAB, LearningPolicy
    return SimpleNamespace(MAB=MAB, LearningPolicy=LearningPolicy)


class _MABWiserBatch(PeerBatch):
    """MABWiser 2.7 ``MAB(arms, learning_policy, seed=…)``, adapted round by round with
    ``partial_fit(decisions=[arm], rewards=[reward])`` and ``predict()``.

    MABWiser is batch-fit oriented: it refuses to ``predict`` before any fit, so an instance's
    first arm is drawn uniformly by the adapter (from ``u`` or its generator). It exposes no
    selection probabilities (``probs`` is NaN, ``probabilities()`` raises). Health checks read
    the private ``_imp.arm_to_expectation``. It documents no reward range; untried arms have
    expectation 0, so with reward = -loss every untried arm looks better than any tried one.
    """

    library = "mabwiser"

    @classmethod
    def _load(cls) -> Any:
        return _mabwiser()

    def _policy(self, **params: Any) -> Any:
        raise NotImplementedError

    def _make(self, i: int, seed: int, **params: Any) -> Any:
        mab = self.lib.MAB(
            arms=list(range(self.n_arms)), learning_policy=self._policy(**params), seed=seed
        )
        return SimpleNamespace(mab=mab, fitted=False)

    def _choose(self, i: int, u: float | None) -> tuple[int, float]:
        peer = self.peers[i]
        if not peer.fitted:
            return min(int(self._draw(i, u) * self.n_arms), self.n_arms - 1), 1 / self.n_arms
        return int(peer.mab.predict()), math.nan

    def _learn(self, i: int, arm: int, prob: float, loss: float) -> None:
        peer = self.peers[i]
        peer.mab.partial_fit(decisions=[arm], rewards=[self.reward(loss)])
        peer.fitted = True
        values = np.array(list(peer.mab._imp.arm_to_expectation.values()), dtype=float)
        if not np.isfinite(values).all():
            kind = "nan" if np.isnan(values).any() else "overflow"
            raise PeerFaultError(kind, f"arm expectations are not finite: {values.tolist()}")


class MABWiserSoftmax(_MABWiserBatch):
    """``LearningPolicy.Softmax(tau=1)``: the closest MABWiser has to exponential weights
    (Boltzmann exploration on empirical mean rewards, a stochastic-bandit heuristic, not EXP3:
    ``predict`` takes the argmax of a Dirichlet draw around the softmax).

    Example (needs mabwiser)::

        bandit = MABWiserSoftmax(3, 5, seed=0, tau=0.5)
        tickets = bandit.select()                     # first round: uniform, probs 1/5
        bandit.update(tickets, losses[tickets.arms])
        bandit.select().probs                         # then NaN: no probabilities exposed
    """

    name = "MABWiser Softmax"

    def _policy(self, tau: float = 1.0) -> Any:
        return self.lib.LearningPolicy.Softmax(tau=tau)


class MABWiserEpsilonGreedy(_MABWiserBatch):
    """``LearningPolicy.EpsilonGreedy(epsilon=0.1)``.

    Example (needs mabwiser)::

        bandit = MABWiserEpsilonGreedy(3, 5, seed=0, epsilon=0.05)
        tickets = bandit.select()
        bandit.update(tickets, losses[tickets.arms])
    """

    name = "MABWiser EpsilonGreedy"

    def _policy(self, epsilon: float = 0.1) -> Any:
        return self.lib.LearningPolicy.EpsilonGreedy(epsilon=epsilon)


class MABWiserUCB1(_MABWiserBatch):
    """``LearningPolicy.UCB1(alpha=1)``: mean + α √(2 ln N / n); the bonus does not scale
    with the rewards.

    Example (needs mabwiser)::

        bandit = MABWiserUCB1(3, 5, seed=0, alpha=1.0)
        tickets = bandit.select()
        bandit.update(tickets, losses[tickets.arms])
    """

    name = "MABWiser UCB1"

    def _policy(self, alpha: float = 1.0) -> Any:
        return self.lib.LearningPolicy.UCB1(alpha=alpha)
