"""Quick regret runs of the bandit on an oblivious loss table (``tsi simulate``).

The arena (``arena/runner.py``) runs every algorithm the same way, on the loss tables of
``arena/lab/environments.py``.

>>> table = bernoulli_table(200, [0.2, 0.5, 0.8], seed=0)
>>> result = run(table, n_seeds=4, seed=1)
>>> result.regret.shape, result.range
((4,), 1.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from tsi_core.batch import BatchBandit


def bernoulli_table(n_rounds: int, means: list[float], seed: int = 0) -> np.ndarray:
    """A T×M table of losses in {0, 1}: arm m loses with probability means[m]."""
    rng = np.random.default_rng(seed)
    return (rng.random((n_rounds, len(means))) < np.asarray(means)).astype(float)


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
