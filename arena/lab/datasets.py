"""Loss tables from real data sets bundled with scikit-learn (no download).

scikit-learn is a ``lab`` extra, imported when a table is built. Each builder is seeded:
the same seed gives the same table.

- ``digits``: handwritten digits, arm = guessed digit, contexts = k-means clusters;
- ``wine``: wine cultivars, arm = guessed cultivar, contexts = k-means clusters;
- ``diabetes``: disease progression forecasts, arm = a fixed forecasting rule, loss = its
  absolute error in the target's own units (not rescaled: the range is the data's).

>>> env = diabetes(500, seed=0)
>>> env.shape, env.kind
((500, 10), 'fixed')
>>> DIABETES_RULES[:3]
('mean', 'median', 'line on bmi')
"""

from __future__ import annotations

from typing import Any

import numpy as np

from arena.lab.environments import supervised
from flows.tools.loss_table import LossTable
from tsi_core.validate import check_int

__all__ = [
    "DIABETES_FEATURES",
    "DIABETES_RULES",
    "breast_cancer",
    "diabetes",
    "diabetes_forecasts",
    "digits",
    "iris",
    "wine",
]

#: the single features the diabetes rules fit a least-squares line on
DIABETES_FEATURES = ("bmi", "bp", "s1", "s3", "s4", "s5", "s6", "age")
DIABETES_RULES = ("mean", "median", *(f"line on {f}" for f in DIABETES_FEATURES))


def _clusters(features: np.ndarray, n_contexts: int, seed: int) -> np.ndarray:
    """k-means cluster ids (``n_contexts`` clusters, seeded) of the rows of ``features``."""
    from sklearn.cluster import KMeans

    return KMeans(n_clusters=n_contexts, n_init=4, random_state=seed).fit_predict(features)


def digits(n_rounds: int, seed: int, n_contexts: int = 8) -> LossTable:
    """scikit-learn's bundled handwritten digits as a 10-arm bandit: arm = guessed digit,
    loss 1 for a wrong guess; the context is one of ``n_contexts`` k-means clusters of the
    pixels (computed once, seeded), so the competitor is the best cluster -> digit map.

    >>> env = digits(300, seed=0)
    >>> env.shape, env.n_contexts, env.name
    ((300, 10), 8, 'digits (k-means ctx)')
    """
    from sklearn.datasets import load_digits

    data = load_digits()
    clusters = _clusters(data.data, n_contexts, seed)
    return supervised(data.target, n_rounds, seed, contexts=clusters, name="digits (k-means ctx)")


def wine(n_rounds: int, seed: int, n_contexts: int = 4) -> LossTable:
    """scikit-learn's bundled wine data (178 wines, 3 cultivars) as a 3-arm bandit: arm =
    guessed cultivar, loss 1 if wrong; the context is one of ``n_contexts`` k-means
    clusters of the standardised chemical measurements (computed once, seeded).

    >>> env = wine(400, seed=0)
    >>> env.shape, env.n_contexts, env.best_contextual_loss() < env.best_fixed_loss()
    ((400, 3), 4, True)
    """
    from sklearn.datasets import load_wine

    return _classified(load_wine(), n_rounds, seed, n_contexts, "wine (k-means ctx)")


def iris(n_rounds: int, seed: int, n_contexts: int = 3) -> LossTable:
    """scikit-learn's bundled iris data (150 flowers, 3 species) as a 3-arm bandit: arm =
    guessed species, loss 1 if wrong; the context is one of ``n_contexts`` k-means clusters
    of the standardised measurements (computed once, seeded).

    >>> env = iris(300, seed=0)
    >>> env.shape, env.n_contexts
    ((300, 3), 3)
    """
    from sklearn.datasets import load_iris

    return _classified(load_iris(), n_rounds, seed, n_contexts, "iris (k-means ctx)")


def breast_cancer(n_rounds: int, seed: int, n_contexts: int = 4) -> LossTable:
    """scikit-learn's bundled breast cancer data (569 tumours, malignant or benign) as a
    2-arm bandit: arm = guessed diagnosis, loss 1 if wrong; the context is one of
    ``n_contexts`` k-means clusters of the standardised features (computed once, seeded).

    >>> env = breast_cancer(300, seed=0)
    >>> env.shape, env.n_contexts
    ((300, 2), 4)
    """
    from sklearn.datasets import load_breast_cancer

    return _classified(
        load_breast_cancer(), n_rounds, seed, n_contexts, "breast cancer (k-means ctx)"
    )


def _classified(data: Any, n_rounds: int, seed: int, n_contexts: int, name: str) -> LossTable:
    """A bundled classification data set as a bandit (``supervised``), its context one of
    ``n_contexts`` k-means clusters of the standardised features."""
    x = data.data
    clusters = _clusters((x - x.mean(axis=0)) / x.std(axis=0), n_contexts, seed)
    return supervised(data.target, n_rounds, seed, contexts=clusters, name=name)


def diabetes_forecasts() -> tuple[np.ndarray, np.ndarray]:
    """(forecasts, targets): the ``DIABETES_RULES`` applied to every patient of
    scikit-learn's diabetes data, shape (442, 10), and the 442 targets (a measure of
    disease progression after one year, 25 to 346). The rules are fitted once, on all
    the data: the global mean and median, and least-squares lines on single features.
    """
    from sklearn.datasets import load_diabetes

    data = load_diabetes()
    x, y = data.data, data.target.astype(float)
    columns = [np.full(len(y), y.mean()), np.full(len(y), np.median(y))]
    for feature in DIABETES_FEATURES:
        f = x[:, data.feature_names.index(feature)]
        slope, intercept = np.polyfit(f, y, 1)
        columns.append(slope * f + intercept)
    return np.column_stack(columns), y


def diabetes(n_rounds: int, seed: int) -> LossTable:
    """Forecasting disease progression (scikit-learn's diabetes data) as a 10-arm bandit.

    Arm i forecasts with rule ``DIABETES_RULES[i]`` (see ``diabetes_forecasts``); the loss
    is the absolute error in the target's units, so losses lie in about [0, 250], not in
    [0, 1]. Each round is a patient drawn uniformly with replacement (seeded). Competitor:
    the best fixed rule.

    >>> env = diabetes(2000, seed=1)
    >>> bool(env.losses.min() >= 0.0 and env.losses.max() > 100.0)
    True
    >>> DIABETES_RULES[int(env.losses.mean(axis=0).argmin())] in ("line on bmi", "line on s5")
    True
    """
    n_rounds = check_int("n_rounds", n_rounds, 1)
    seed = check_int("seed", seed, 0)
    forecasts, targets = diabetes_forecasts()
    rows = np.random.default_rng(seed).integers(len(targets), size=n_rounds)
    losses = np.abs(forecasts[rows] - targets[rows, None])
    return LossTable("diabetes (abs. error)", losses)
