"""Vowpal Wabbit's contextual-bandit explorers (``--cb_explore``, ``--cb_explore_adf``) behind
``PeerBatch``, with one constant feature: VW minimises costs, and gets ``cost(loss)``."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from arena.peers.base import PeerBatch, PeerFaultError, check_vector, quiet_import


@functools.cache
def _vowpalwabbit() -> Any:
    with quiet_import():
        from vowpalwabbit import Workspace
    return Workspace


class VWCbExplore(PeerBatch):
    """Vowpal Wabbit ``--cb_explore M`` (default exploration: ε-greedy, ε = 0.05) with one
    constant feature. ``predict`` returns a probability mass function; the adapter draws the
    arm from it with ``u`` (or its per-instance generator) and learns with the label
    ``action:cost:probability`` (1-based action), cost = loss. ``args`` adds VW options.

    Memory: every instance holds VW's default 18-bit weight table; ``args="-b 12"`` asks for
    a smaller one (figures in arena/PEERS.md). ``close()`` finishes the workspaces.

    Example (needs vowpalwabbit)::

        bandit = VWCbExplore(3, 5, seed=0, args="-b 12")
        tickets = bandit.select(u=[0.1, 0.5, 0.9])    # the arms drawn from each pmf with u
        bandit.update(tickets, losses[tickets.arms])  # learns "arm+1:loss:prob | c"
        bandit.close()
    """

    name = "VW cb_explore"
    library = "vowpalwabbit"
    exposes_probabilities = True

    @classmethod
    def _load(cls) -> Any:
        return _vowpalwabbit()

    def _options(self, seed: int, args: str) -> str:
        return f"--cb_explore {self.n_arms} --quiet --random_seed {seed} {args}".strip()

    def _make(self, i: int, seed: int, args: str = "") -> Any:
        return self.lib(self._options(seed, args))

    def _example(self, label: tuple[int, float, float] | None = None) -> Any:
        if label is None:
            return "| c"
        arm, cost, prob = label
        return f"{arm + 1}:{cost!r}:{prob!r} | c"

    def _pmf(self, i: int) -> np.ndarray:
        pmf = np.asarray(self.peers[i].predict(self._example()), dtype=float)
        if pmf.shape != (self.n_arms,):
            raise PeerFaultError("collapse", f"pmf has shape {pmf.shape}, not ({self.n_arms},)")
        check_vector("pmf", pmf, normalised=False)
        if abs(pmf.sum() - 1.0) > 1e-4:  # VW computes in float32
            raise PeerFaultError("collapse", f"pmf sums to {pmf.sum()!r}: {pmf.tolist()}")
        return pmf / pmf.sum()

    def _choose(self, i: int, u: float | None) -> tuple[int, float]:
        pmf = self._pmf(i)
        arm = self._from_pmf(i, pmf, u)
        return arm, float(pmf[arm])

    def _learn(self, i: int, arm: int, prob: float, loss: float) -> None:
        self.peers[i].learn(self._example((arm, self.cost(loss), prob)))

    def _probs(self, i: int) -> np.ndarray:
        return self._pmf(i)

    def _close(self, peer: Any) -> None:
        peer.finish()


class VWCbExploreADF(VWCbExplore):
    """Vowpal Wabbit ``--cb_explore_adf`` (action-dependent features, ε = 0.05): a shared
    constant feature and one indicator feature per action; label ``0:cost:probability`` on
    the chosen action's line.

    Example (needs vowpalwabbit)::

        bandit = VWCbExploreADF(3, 5, seed=0, loss_range=(0.0, 1.0))  # cost = loss in [0, 1]
        tickets = bandit.select()
        bandit.update(tickets, losses[tickets.arms])
        bandit.close()
    """

    name = "VW cb_explore_adf"

    def _options(self, seed: int, args: str) -> str:
        return f"--cb_explore_adf --quiet --random_seed {seed} {args}".strip()

    def _example(self, label: tuple[int, float, float] | None = None) -> Any:
        lines = ["shared |s c"] + [f"|a a{k}" for k in range(self.n_arms)]
        if label is not None:
            arm, cost, prob = label
            lines[arm + 1] = f"0:{cost!r}:{prob!r} {lines[arm + 1]}"
        return lines
