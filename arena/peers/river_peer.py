"""river's Exp3 behind ``PeerBatch``."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from arena.peers.base import PeerBatch, check_vector, quiet_import


@functools.cache
def _river() -> Any:
    with quiet_import():
        from river import bandit
    return bandit


class RiverExp3(PeerBatch):
    """``river.bandit.Exp3`` (river 0.26).

    ``pull(arm_ids)`` draws with p = (1 - γ) w / Σw + γ / K (Python's ``random.Random(seed)``);
    ``update(arm, reward)`` multiplies w[arm] by exp(γ · reward / p[arm] / K). Weights are
    never normalised, so reward = -loss shrinks them towards 0: with large losses they
    underflow to 0 and the next ``pull`` divides by zero. river documents no reward range; its
    ``reward_scaler`` only feeds the reward statistic, not the Exp3 weights. ``gamma`` has no
    default in river; 0.1 here (≈ the EXP3 tuning √(K ln K / ((e - 1) T)) for K = 5, T = 500).
    Probabilities come from river's own formula applied to ``_weights`` (private attribute).

    Example (needs river)::

        bandit = RiverExp3(3, 5, seed=0, gamma=0.1)   # 3 instances, 5 arms
        tickets = bandit.select()
        bandit.update(tickets, losses[tickets.arms])  # each instance gets reward -loss
        bandit.probabilities()                        # (3, 5)
    """

    name = "river Exp3"
    library = "river"
    exposes_probabilities = True

    @classmethod
    def _load(cls) -> Any:
        return _river()

    def _make(self, i: int, seed: int, gamma: float = 0.1) -> Any:
        self._arm_ids = list(range(self.n_arms))
        return self.lib.Exp3(gamma=gamma, seed=seed)

    def _weights(self, peer: Any) -> np.ndarray:
        return np.array([peer._weights[a] for a in self._arm_ids], dtype=float)

    def _choose(self, i: int, u: float | None) -> tuple[int, float]:
        peer = self.peers[i]
        arm = peer.pull(self._arm_ids)
        return int(arm), float(peer._probabilities[arm])

    def _learn(self, i: int, arm: int, prob: float, loss: float) -> None:
        peer = self.peers[i]
        peer.update(arm, self.reward(loss))
        check_vector("weights", self._weights(peer), normalised=False)

    def _probs(self, i: int) -> np.ndarray:
        peer = self.peers[i]
        w = self._weights(peer)
        p = (1 - peer.gamma) * (w / w.sum()) + peer.gamma / self.n_arms
        check_vector("probabilities", p, normalised=True)
        return p
