"""The allocation rule written out from its statement (``tsi_core.allocation``), in numpy:
a test oracle for the compiled round, which is the one implementation the library runs.

Given the learner's q, the allocation, the selections made so far and the eligible arms:
the probability P of each arm, the reason each arm would be served, and the arm a draw u
serves. Renormalisation over the eligible arms is done even when every arm is eligible
(the compiled round skips it there): the two agree to rounding.
"""

from __future__ import annotations

import numpy as np

from tsi_core import Allocation


def eligible_of(eligible: np.ndarray | None, m: int) -> np.ndarray:
    return np.ones(m, dtype=bool) if eligible is None else np.asarray(eligible, dtype=bool)


def holdout_share(a: Allocation, e: np.ndarray) -> float:
    """s for this request: the holdout's share when its arm is eligible, else 0."""
    return a.holdout_share if a.holdout_arm is not None and e[a.holdout_arm] else 0.0


def base(q: np.ndarray, a: Allocation, n_rounds: int, e: np.ndarray) -> tuple[np.ndarray, str]:
    """π over the eligible arms (0 elsewhere) and its reason."""
    m_e = int(e.sum())
    if n_rounds < a.burn_in:
        return np.where(e, 1.0 / m_e, 0.0), "burn_in"
    q_e = np.where(e, q, 0.0)
    total = q_e.sum()
    q_tilde = q_e / total if total > 0 else np.where(e, 1.0 / m_e, 0.0)
    return np.where(e, a.min_share + (1 - m_e * a.min_share) * q_tilde, 0.0), "bandit"


def serving(q: np.ndarray, a: Allocation, n_rounds: int, eligible=None) -> np.ndarray:
    """P(arm) for every arm at the next selection."""
    e = eligible_of(eligible, len(q))
    if a.force_arm is not None:
        return np.eye(len(q))[a.force_arm]
    pi, _ = base(q, a, n_rounds, e)
    s = holdout_share(a, e)
    p = (1 - s) * pi
    if s:
        p[a.holdout_arm] += s
    return p


def served(
    q: np.ndarray, a: Allocation, n_rounds: int, u: float, eligible=None
) -> tuple[int, str, float]:
    """(arm, why, margin): the arm the draw u serves, its reason, and how far the draw
    that chose it was from a boundary of the inverse CDF (a rounding could move it there)."""
    e = eligible_of(eligible, len(q))
    if a.force_arm is not None:
        return a.force_arm, "forced", 1.0
    s = holdout_share(a, e)
    if u < s:
        return a.holdout_arm, "holdout", s - u
    pi, why = base(q, a, n_rounds, e)
    v = (u - s) / (1 - s)
    cdf = np.cumsum(pi)
    beyond = np.flatnonzero((v < cdf) & e)
    arm = int(beyond[0]) if len(beyond) else int(np.flatnonzero(e)[-1])
    return arm, why, float(np.min(np.abs(cdf[e] - v)))
