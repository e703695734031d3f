"""Tables on which a round that amplifies rounding would change selections, the maps of
the losses that round, and the run that records every selection.

Each builder returns losses of shape (rounds, instances, arms): every instance plays its
own column of draws. ``tests/core/test_affine_drift.py`` plays them for 2·10^4 rounds,
``bench/bench_invariance.py`` for 10^5.

>>> rng = np.random.default_rng(0)
>>> trend_and_regimes(rng, 1000, 2, 8).shape
(1000, 2, 8)
>>> sorted(MAPS)
['1000l', '1000l+1e6', '1e-4l-3', 'l+3']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tsi_core import BatchBandit, Contextual, Fixed, Markov, Switching

#: 1000·l + 10^6, 1000·l, l + 3, 10^-4·l − 3: each rounds the losses differently
MAPS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "1000l+1e6": lambda x: 1000.0 * x + 1e6,
    "1000l": lambda x: 1000.0 * x,
    "l+3": lambda x: x + 3.0,
    "1e-4l-3": lambda x: 1e-4 * x - 3.0,
}


def trend_and_regimes(
    rng: np.random.Generator, rounds: int, n_instances: int, n_arms: int
) -> np.ndarray:
    """Forecast-error-like losses: a slow trend, a ×100 jump at 40% and back at 80%, arm
    means that cross, rounded to 0.1 (ties)."""
    t = np.arange(rounds)[:, None, None] / rounds
    means = rng.uniform(1.0, 3.0, size=(1, n_instances, n_arms)) + t * rng.normal(
        0.0, 2.0, size=(1, n_instances, n_arms)
    )
    noise = np.abs(rng.normal(0.0, 1.0, size=(rounds, n_instances, n_arms)))
    scale = np.where((t > 0.4) & (t < 0.8), 100.0, 1.0)
    return np.round(scale * np.abs(means + noise), 1)


def near_ties(rng: np.random.Generator, rounds: int, n_instances: int, n_arms: int) -> np.ndarray:
    """Two arms 10^-3 apart, the rest close behind, Gaussian noise with decimals."""
    means = np.linspace(0.5, 0.53, n_arms)
    means[1] = means[0] + 1e-3
    return means + 0.2 * rng.standard_normal((rounds, n_instances, n_arms))


def spikes(rng: np.random.Generator, rounds: int, n_instances: int, n_arms: int) -> np.ndarray:
    """Every arm loses 1.7; arm 0 loses 31.3 one round in ten, else 0 (mean 3.13)."""
    losses = np.full((rounds, n_instances, n_arms), 1.7)
    losses[:, :, 0] = 31.3 * (rng.random((rounds, n_instances)) < 0.1)
    return losses


def forecast_errors(
    rng: np.random.Generator, rounds: int, n_instances: int, n_arms: int
) -> np.ndarray:
    """Real data: the absolute errors of the diabetes forecasting rules
    (``arena.lab.datasets.diabetes_forecasts``, the first ``n_arms`` rules), one patient a
    round drawn with replacement for each instance; errors with every decimal the
    regressions give."""
    from arena.lab.datasets import diabetes_forecasts

    forecasts, targets = diabetes_forecasts()
    errors = np.abs(forecasts - targets[:, None])[:, :n_arms]
    return errors[rng.integers(0, len(targets), size=(rounds, n_instances))]


TABLES: dict[str, Callable[[np.random.Generator, int, int, int], np.ndarray]] = {
    "trend_and_regimes": trend_and_regimes,
    "near_ties": near_ties,
    "spikes": spikes,
    "forecast_errors": forecast_errors,
}


def classes(n_arms: int, n_contexts: int) -> dict[str, Callable[[], Any]]:
    """A fresh competition class of each kind, by name: a Markov prior that stays put with
    probability 0.9.

    >>> sorted(classes(8, 3))
    ['contextual', 'fixed', 'markov', 'switching']
    """
    stay = 0.1 / n_arms + 0.9 * np.eye(n_arms)
    return {
        "fixed": Fixed,
        "contextual": lambda: Contextual(n_contexts),
        "switching": Switching,
        "markov": lambda: Markov(stay, arm_of=list(range(n_arms))),
    }


def selections(
    losses: np.ndarray,
    u: np.ndarray,
    contexts: np.ndarray | None,
    competition: Any,
    variant: str | None = None,
) -> np.ndarray:
    """The arm each of the instances chose at every round, shape (rounds, instances):
    ``BatchBandit`` with draws ``u`` (rounds, instances), ``contexts`` of the same shape or
    None, immediate feedback from ``losses``.

    >>> rng = np.random.default_rng(1)
    >>> x, u = spikes(rng, 200, 2, 3), rng.random((200, 2))
    >>> arms = selections(x, u, None, Fixed())
    >>> arms.shape, bool((arms == selections(MAPS["1000l+1e6"](x), u, None, Fixed())).all())
    ((200, 2), True)
    """
    rounds, n_instances, n_arms = losses.shape
    b = BatchBandit(n_instances, n_arms, competition, seed=0, variant=variant)
    out = np.empty((rounds, n_instances), dtype=np.int64)
    rows = np.arange(n_instances)
    for t in range(rounds):
        tickets = b.select(contexts=None if contexts is None else contexts[t], u=u[t])
        out[t] = tickets.arms
        b.update(tickets, losses[t, rows, out[t]])
    return out
