r"""An anytime-valid confidence sequence for the difference of two means (treatment -
holdout), from each group's n, sum and sum of squares.

The asymptotic confidence sequence of Waudby-Smith, Arbour, Sinha, Kennedy and Ramdas
("Time-uniform central limit theory and asymptotic confidence sequences"), built on the
normal mixture boundary of Howard, Ramdas, McAuliffe and Sekhon ("Time-uniform,
nonparametric, nonasymptotic confidence sequences"). With the two groups' means
:math:`m_1, m_2`, variances :math:`s_1^2, s_2^2` and sizes :math:`n_1, n_2`, the effective
time :math:`t = n_1 n_2 / (n_1 + n_2)` and variance :math:`\sigma^2 = t (v_1/n_1 +
v_2/n_2)`, where each :math:`v_i = \max(s_i^2, s_p^2)` is floored at the pooled variance
:math:`s_p^2 = (n_1 s_1^2 + n_2 s_2^2) / (n_1 + n_2)` (a small group of rare events,
such as errors, often shows no variance at all), the interval is

.. math::

    m_1 - m_2 \pm \sigma \sqrt{\frac{2 (t \rho^2 + 1)}{t^2 \rho^2}
        \log\frac{\sqrt{t \rho^2 + 1}}{\alpha}}

and covers the true difference at every t at once with probability about 1 - alpha: it may
be looked at after every sample without inflating the error. :math:`\rho^2 = (2 \log(1 /
\alpha) + \log(1 + 2 \log(1/\alpha))) / t^*` makes it tightest near :math:`t^*` (here the
effective time of ``min_samples`` in each group).

A breach: the whole interval on the worse side of ``margin`` (``worse = "higher"``: its
low end above ``margin``; ``"lower"``: its high end below ``-margin``).

>>> treated, held = Sums(400, 600.0, 1300.0), Sums(400, 400.0, 800.0)
>>> interval = confidence_sequence(treated, held, alpha=0.05, min_samples=100)
>>> round(interval.estimate, 3), round(interval.low, 3), round(interval.high, 3)
(0.5, 0.279, 0.721)
>>> breached(interval, "higher", margin=0.0), breached(interval, "lower", margin=0.0)
(True, False)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from flows.guardrails.spec import WORSE

__all__ = ["WORSE", "Interval", "Sums", "breached", "confidence_sequence", "half_width", "rho2"]


@dataclass(frozen=True)
class Sums:
    """One group's count, sum and sum of squares of a metric."""

    n: float
    total: float
    squares: float

    @property
    def mean(self) -> float:
        return self.total / self.n

    @property
    def variance(self) -> float:
        """The (biased) sample variance, never negative."""
        mean = self.mean
        return max(self.squares / self.n - mean * mean, 0.0)


@dataclass(frozen=True)
class Interval:
    """The difference treatment - holdout: its estimate and the confidence sequence's ends."""

    estimate: float
    low: float
    high: float


def rho2(alpha: float, t_star: float) -> float:
    """The mixture's rho squared that makes the boundary tightest at time ``t_star``.

    >>> round(rho2(0.05, 100.0), 4)
    0.0794
    """
    two_log = 2.0 * math.log(1.0 / alpha)
    return (two_log + math.log(1.0 + two_log)) / t_star


def half_width(t: np.ndarray | float, sigma2: np.ndarray | float, alpha: float, rho_2: float):
    """The boundary's half-width at effective time ``t`` and variance ``sigma2`` (numbers
    or numpy arrays alike).

    >>> round(float(half_width(100.0, 1.0, 0.05, rho2(0.05, 100.0))), 4)
    0.3035
    """
    t_rho = np.asarray(t, dtype=float) * rho_2 + 1.0
    return np.sqrt(
        np.asarray(sigma2, dtype=float)
        * 2.0
        * t_rho
        / (np.asarray(t, dtype=float) ** 2 * rho_2)
        * np.log(np.sqrt(t_rho) / alpha)
    )


def confidence_sequence(
    treatment: Sums, holdout: Sums, alpha: float, min_samples: int
) -> Interval | None:
    """The interval of treatment - holdout, or None until each group has ``min_samples``.

    >>> confidence_sequence(Sums(5, 5.0, 5.0), Sums(500, 0.0, 0.0), 0.05, 100) is None
    True
    """
    if min(treatment.n, holdout.n) < max(min_samples, 2):
        return None
    n1, n2 = treatment.n, holdout.n
    t = n1 * n2 / (n1 + n2)
    pooled = (n1 * treatment.variance + n2 * holdout.variance) / (n1 + n2)
    sigma2 = t * (max(treatment.variance, pooled) / n1 + max(holdout.variance, pooled) / n2)
    t_star = max(min_samples / 2.0, 1.0)  # the effective time of min_samples in each group
    half = float(half_width(t, sigma2, alpha, rho2(alpha, t_star)))
    estimate = treatment.mean - holdout.mean
    return Interval(estimate, estimate - half, estimate + half)


def breached(interval: Interval | None, worse: str, margin: float) -> bool:
    """Whether the whole interval lies on the ``worse`` side of ``margin``.

    >>> breached(Interval(-1.0, -1.5, -0.5), "lower", 0.2), breached(None, "higher", 0.0)
    (True, False)
    """
    if interval is None:
        return False
    if worse == "higher":
        return interval.low > margin
    if worse == "lower":
        return interval.high < -margin
    raise ValueError(f"worse must be one of {WORSE}, got {worse!r}")
