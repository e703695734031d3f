"""Small simulations: oblivious loss tables and the regret of the bandit on them.

>>> table = bernoulli_table(200, [0.2, 0.5, 0.8], seed=0)
>>> result = run(table, n_seeds=4, seed=1)
>>> result.regret.shape, result.range
((4,), 1.0)
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from tsi_core.batch import BatchBandit


def bernoulli_table(n_rounds: int, means: Any, seed: int) -> np.ndarray:
    """Losses in {0, 1}: arm m loses with probability means[m] each round (T×M)."""
    rng = np.random.default_rng(seed)
    return (rng.random((n_rounds, len(means))) < np.asarray(means)).astype(float)


def switching_table(n_rounds: int, n_arms: int, n_switches: int, seed: int) -> np.ndarray:
    """Bernoulli losses whose best arm (mean 0.2, others 0.7) changes ``n_switches`` times."""
    rng = np.random.default_rng(seed)
    means = np.full((n_rounds, n_arms), 0.7)
    edges = np.linspace(0, n_rounds, n_switches + 2).astype(int)
    for k, (a, b) in enumerate(itertools.pairwise(edges)):
        means[a:b, k % n_arms] = 0.2
    return (rng.random((n_rounds, n_arms)) < means).astype(float)


def best_switching_loss(table: np.ndarray, n_segments: int) -> float:
    """Loss of the best arm sequence that is constant on ``n_segments`` equal segments."""
    edges = np.linspace(0, len(table), n_segments + 1).astype(int)
    return float(sum(table[a:b].sum(axis=0).min() for a, b in itertools.pairwise(edges)))


@dataclass(frozen=True)
class Result:
    """Expected cumulative loss Σ q_t·(l_t - shift) per seed, and its regret."""

    loss: np.ndarray
    regret: np.ndarray
    range: float  # D: max - min of the (transformed) loss table

    @property
    def normalised(self) -> np.ndarray:
        """Regret / (D·sqrt(M·T)): the scale-free figure the paper bounds."""
        t, m = self.shape
        return self.regret / (self.range * math.sqrt(m * t))

    shape: tuple[int, int] = (0, 0)


def run(
    table: np.ndarray,
    n_seeds: int,
    competition: Any = None,
    scale: float = 1.0,
    shift: float = 0.0,
    seed: int = 0,
    competitor_loss: float | None = None,
) -> Result:
    """Play ``n_seeds`` independent bandits on ``scale·table + shift``.

    The regret is taken against ``competitor_loss`` (in the table's own units; default the
    best fixed arm) and uses the expected loss q_t·l_t of each round, which has the same
    mean as the realised loss and less noise.
    """
    losses = scale * table + shift
    # regret is shift-free; evaluating it relative to the shift avoids cancellation
    centred = losses - shift
    n_rounds, n_arms = table.shape
    bandits = BatchBandit(n_seeds, n_arms, competition, seed=seed)
    total = np.zeros(n_seeds)
    rows = np.arange(n_seeds)
    for t in range(n_rounds):
        q = bandits.probabilities()
        total += q @ centred[t]
        tickets = bandits.select()
        bandits.update(tickets, losses[t, tickets.arms[rows]])
    best = centred.sum(axis=0).min() if competitor_loss is None else scale * competitor_loss
    return Result(total, total - best, float(losses.max() - losses.min()), (n_rounds, n_arms))
