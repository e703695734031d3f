"""Estimates of a per-round loss with normal-approximation confidence intervals: the sample
mean, inverse propensity scoring (IPS), self-normalised IPS, each with Kish's effective
sample size of its weights, and the size below which an estimate is insufficient data.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from flows.tools.evaluation.logs import EvaluationError

#: the effective sample size below which ``tsi evaluate`` gives an off-policy estimate as
#: "insufficient data", not as a figure to compare (``--min-ess``)
MIN_ESS = 100.0


def z_of(level: float) -> float:
    """The two-sided normal quantile of a confidence ``level`` in (0, 1).

    >>> round(z_of(0.95), 4)
    1.96
    """
    if isinstance(level, bool) or not isinstance(level, int | float) or not 0 < level < 1:
        raise EvaluationError(f"level must be a number in (0, 1), got {level!r}")
    return NormalDist().inv_cdf(0.5 + level / 2)


@dataclass(frozen=True)
class Estimate:
    """An estimated per-round loss with a normal-approximation confidence interval.

    ``low, high = value ∓ z·stderr`` with z the two-sided normal quantile of ``level``;
    ``n`` is the number of terms averaged. ``value`` is NaN when ``n`` is 0, the interval
    unbounded when ``n`` is 1. ``ess`` is Kish's effective sample size of the terms'
    weights (``effective_sample_size``): ``n`` when every term weighs 1 (the default).

    >>> e = Estimate(2.0, 0.5, 10, 0.95)
    >>> str(e), e.contains(2.9), e.contains(3.0), e.ess, e.enough(10), e.enough(10.5)
    ('2 [1.02002, 2.97998]', True, False, 10.0, True, False)
    """

    value: float
    stderr: float
    n: int
    level: float
    ess: float = math.nan

    def __post_init__(self) -> None:
        if math.isnan(self.ess):
            object.__setattr__(self, "ess", float(self.n))

    @property
    def low(self) -> float:
        return self.value - z_of(self.level) * self.stderr

    @property
    def high(self) -> float:
        return self.value + z_of(self.level) * self.stderr

    def contains(self, x: float) -> bool:
        """Whether ``x`` lies in the confidence interval."""
        return bool(self.low <= x <= self.high)

    def enough(self, min_ess: float) -> bool:
        """Whether the estimate rests on an effective sample of at least ``min_ess``."""
        return self.ess >= min_ess

    def __str__(self) -> str:
        if math.isnan(self.value):
            return "n/a"
        return f"{self.value:.6g} [{self.low:.6g}, {self.high:.6g}]"

    def to_dict(self) -> dict[str, float | int | None]:
        """The figures, JSON-serialisable (None where a figure is NaN or infinite)."""
        figures = {"value": self.value, "stderr": self.stderr, "low": self.low, "high": self.high}
        out: dict[str, float | int | None] = {
            k: v if math.isfinite(v) else None for k, v in figures.items()
        }
        return {**out, "n": self.n, "level": self.level, "ess": self.ess}


def mean_estimate(values: Any, level: float = 0.95) -> Estimate:
    """Sample mean ± z·sd/sqrt(n) (sd with n − 1): assumes roughly independent terms.

    >>> e = mean_estimate([1.0, 2.0, 3.0])
    >>> e.value, round(e.stderr, 6)
    (2.0, 0.57735)
    """
    z_of(level)
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n == 0:
        return Estimate(math.nan, math.nan, 0, level)
    if n == 1:
        return Estimate(float(x[0]), math.inf, 1, level)
    return Estimate(float(x.mean()), float(x.std(ddof=1) / math.sqrt(n)), n, level)


def ips_estimate(weights: Any, losses: Any, level: float = 0.95) -> Estimate:
    """Inverse propensity scoring: V̂ = (1/T) Σ w_t·l_t with w_t = q_t(a_t) / prob_t.

    ``q_t`` is the target policy's probability of the logged arm a_t and ``prob_t`` the
    logging policy's. Unbiased for the target's expected per-round loss (1/T) Σ_t Σ_a
    q_t(a)·l_t(a) when the propensities are right, every arm the target can play had
    prob > 0, a_t was drawn independently of the losses given the context, and q_t is
    fixed before round t's loss is seen (a fixed policy, or one that learns only from
    earlier rounds). The CI uses the empirical variance of the terms w_t·l_t (normal
    approximation, martingale CLT). That variance grows with max w ≤ max q/prob, and with
    the losses' offset: IPS is not translation-invariant (adding c to every loss adds
    c·mean(w), not c), so large offsets inflate it; see ``snips_estimate``.

    >>> e = ips_estimate([2.0, 0.0, 2.0, 0.0], [1.0, 5.0, 0.0, 5.0])
    >>> e.value, e.n, e.ess
    (0.5, 4, 2.0)
    """
    w, loss = _pair(weights, losses)
    return dataclasses.replace(mean_estimate(w * loss, level), ess=effective_sample_size(w))


def snips_estimate(weights: Any, losses: Any, level: float = 0.95) -> Estimate:
    """Self-normalised IPS: Σ w_t·l_t / Σ w_t, CI by the delta method.

    Consistent under the same assumptions as ``ips_estimate`` but biased at O(1/T); it is
    translation- and scale-equivariant (losses a·l + c give a·V̂ + c), so an offset in the
    losses does not inflate its variance. Terms for the CI: w_t·(l_t − V̂)/mean(w).

    >>> e = snips_estimate([2.0, 0.0, 2.0, 0.0], [1.0, 5.0, 0.0, 5.0])
    >>> e.value, e.ess
    (0.5, 2.0)
    """
    w, loss = _pair(weights, losses)
    z_of(level)
    ess = effective_sample_size(w)
    if len(w) == 0 or not w.sum() > 0:
        return Estimate(math.nan, math.nan, len(w), level, ess)
    value = float((w * loss).sum() / w.sum())
    influence = w * (loss - value) / w.mean()
    stderr = float(influence.std(ddof=1) / math.sqrt(len(w))) if len(w) > 1 else math.inf
    return Estimate(value, stderr, len(w), level, ess)


def effective_sample_size(weights: Any) -> float:
    """Kish's (Σ w)² / Σ w²: how many equally weighted rounds the weights are worth (0
    when every weight is 0); n for n equal weights.

    >>> effective_sample_size([1.0, 1.0, 0.0, 0.0]), effective_sample_size([2.0, 2.0, 1.0, 1.0])
    (2.0, 3.6)
    """
    w = np.asarray(weights, dtype=float)
    square = float((w * w).sum())
    return float(w.sum()) ** 2 / square if square > 0 else 0.0


def _pair(weights: Any, losses: Any) -> tuple[np.ndarray, np.ndarray]:
    w, loss = np.asarray(weights, dtype=float), np.asarray(losses, dtype=float)
    if w.shape != loss.shape or w.ndim != 1:
        raise ValueError(f"weights and losses must be 1-D of one length: {w.shape}, {loss.shape}")
    if (w < 0).any() or not np.isfinite(w).all():
        raise ValueError("weights must be finite and >= 0")
    return w, loss
