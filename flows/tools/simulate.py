"""Quick regret runs of the bandit on an oblivious loss table (``tsi simulate``).

``run_maps`` plays the same seeds under several affine maps ``l -> scale·l + shift`` at
once (one ``BatchBandit`` whose rows are seed × map, every map given the same uniform
draws), so the maps cost about one run; ``agreement`` says what the results show —
whether the selections and the normalised regret are the same under every map, and to
what precision — from the numbers, never assumed. The arena (``arena/runner.py``) runs
every algorithm the same way, on the loss tables of ``arena/lab/environments.py``.

>>> table = bernoulli_table(200, [0.2, 0.5, 0.8], seed=0)
>>> result = run(table, n_seeds=4, seed=1)
>>> result.regret.shape, result.range
((4,), 1.0)
>>> plain, scaled = run_maps(table, 4, [(1.0, 0.0), (4.0, 0.0)], seed=1)
>>> bool((plain.arms == scaled.arms).all()), agreement([plain, scaled]).same_selections
(True, True)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
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
    arms: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int16))
    # the arm played at each round (T × seeds)


def run(
    table: np.ndarray,
    n_seeds: int,
    competition: Any = None,
    scale: float = 1.0,
    shift: float = 0.0,
    seed: int = 0,
    competitor_loss: float | None = None,
    variant: str | None = None,
) -> Result:
    """Play ``n_seeds`` independent bandits on ``scale·table + shift``.

    The regret is taken against ``competitor_loss`` (in the table's own units; default the
    best fixed arm) and uses the expected loss q_t·l_t of each round, which has the same
    mean as the realised loss and less noise.
    """
    maps = [(scale, shift)]
    return run_maps(table, n_seeds, maps, competition, seed, competitor_loss, variant)[0]


def run_maps(
    table: np.ndarray,
    n_seeds: int,
    maps: Sequence[tuple[float, float]],
    competition: Any = None,
    seed: int = 0,
    competitor_loss: float | None = None,
    variant: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[Result]:
    """``run`` under every ``(scale, shift)`` of ``maps``, in one batch: the result of each
    map is the one ``run`` gives alone (the same draws, bit for bit). ``progress`` is
    called with the number of rounds played, now and then.
    """
    n_rounds, n_arms = table.shape
    k, rows = len(maps), np.arange(len(maps) * n_seeds)
    scales = np.array([s for s, _ in maps], dtype=float)
    shifts = np.array([b for _, b in maps], dtype=float)
    losses = scales[:, None, None] * table[None] + shifts[:, None, None]  # map × T × M
    # regret is shift-free; evaluating it relative to the shift avoids cancellation
    centred = losses - shifts[:, None, None]
    bandits = BatchBandit(k * n_seeds, n_arms, competition, seed=seed, variant=variant)
    draws = np.random.default_rng(seed)  # what BatchBandit(n_seeds, seed=seed) would draw
    which = rows // n_seeds
    total = np.zeros((k, n_seeds))
    arms = np.empty((n_rounds, k * n_seeds), dtype=np.int16)
    step = max(1, min(n_rounds // 100, 1000))
    for start in range(0, n_rounds, step):
        stop = min(start + step, n_rounds)
        u = np.tile(draws.random((stop - start, n_seeds)), k)  # the same draws for every map
        for t in range(start, stop):
            q = bandits.probabilities().reshape(k, n_seeds, n_arms)
            total += np.einsum("ksm,km->ks", q, centred[:, t])
            tickets = bandits.select(u=u[t - start])
            arms[t] = tickets.arms
            bandits.update(tickets, losses[which, t, tickets.arms])
        if progress is not None:
            progress(stop - start)
    out = []
    for m, (scale, _) in enumerate(maps):
        best = centred[m].sum(axis=0).min() if competitor_loss is None else scale * competitor_loss
        spread = float(losses[m].max() - losses[m].min())
        block = arms[:, m * n_seeds : (m + 1) * n_seeds]
        out.append(Result(total[m], total[m] - best, spread, (n_rounds, n_arms), block))
    return out


@dataclass(frozen=True)
class Agreement:
    """How far the results of several maps agree (the first map is the reference)."""

    same_selections: bool  # every map played the same arm as the first, every round
    differing: tuple[int, ...]  # per map: selections that differ from the first map's
    identical: bool  # the normalised regrets are equal bit for bit
    relative: float  # the largest relative difference of the mean normalised regrets
    digits: int  # significant digits they share (17 when identical)


def agreement(results: Sequence[Result]) -> Agreement:
    """Compare the selections and the mean normalised regrets of ``results``.

    >>> r = Result(np.ones(1), np.ones(1), 1.0, (1, 1), np.zeros((1, 1), dtype=np.int16))
    >>> s = Result(np.ones(1), np.array([1.001]), 1.0, (1, 1), np.ones((1, 1), dtype=np.int16))
    >>> a = agreement([r, s])
    >>> a.same_selections, a.differing, a.identical, a.digits
    (False, (0, 1), False, 3)
    """
    first = results[0].arms
    differing = tuple(int((r.arms != first).sum()) for r in results)
    values = np.array([r.normalised.mean() for r in results])
    identical = bool((values == values[0]).all())
    scale = float(np.abs(values).max())
    spread = float(values.max() - values.min())
    relative = 0.0 if identical or scale == 0.0 else spread / scale
    digits = 17 if relative == 0.0 else max(0, math.floor(-math.log10(relative)))
    return Agreement(not any(differing), differing, identical, relative, digits)


def agreement_text(results: Sequence[Result], names: Sequence[str]) -> str:
    """What the table shows about invariance, in words computed from ``results``.

    >>> r = Result(np.ones(1), np.ones(1), 1.0, (1, 1), np.zeros((1, 1), dtype=np.int16))
    >>> agreement_text([r, r], ["l", "2·l"]).startswith("Every map made the same 1 selection")
    True
    """
    a = agreement(results)
    n = results[0].arms.size
    if a.same_selections:
        words = f"Every map made the same {n:,} selection{'s' if n != 1 else ''} as the first row"
    else:
        changed = [f"{name} ({d:,})" for name, d in zip(names, a.differing, strict=True) if d]
        words = f"Selections that differ from the first row's (of {n:,}): " + ", ".join(changed)
    if a.identical:
        column = "the last column is identical in every row, bit for bit"
    else:
        column = (
            f"the last column differs between rows by up to {a.relative:.1e} relative "
            f"(the rows agree to {a.digits} significant digit{'s' if a.digits != 1 else ''})"
        )
    if a.same_selections:
        return (
            f"{words}: on this table the algorithm's choices are invariant to these maps; {column}."
        )
    return f"{words}: the algorithm's choices are not the same under every map; {column}."
