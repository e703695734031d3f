"""Invariance under maps that round, on several kinds of real-like tables.

``test_long_horizon.py`` checks one heavy-tailed stream. Here the default (``bobw``) plays,
for every competition class, tables with a trend, a ×100 regime change,
near-ties, one-arm spikes and decimal losses (the kinds of data where a round that
amplifies rounding flips selections), once on the losses and once on each map
1000·l + 10^6, 1000·l, l + 3, 10^-4·l − 3: every selection must be the same. The draws
are the same in each run; feedback is immediate.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import pytest

from tsi_core import BatchBandit, Contextual, Fixed, Markov, Switching

ROUNDS = 20_000
N_ARMS = 8
N_INSTANCES = 6
N_CONTEXTS = 3

MAPS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "1000l+1e6": lambda x: 1000.0 * x + 1e6,
    "1000l": lambda x: 1000.0 * x,
    "l+3": lambda x: x + 3.0,
    "1e-4l-3": lambda x: 1e-4 * x - 3.0,
}

CLASSES: dict[str, Callable[[], object]] = {
    "fixed": Fixed,
    "contextual": lambda: Contextual(N_CONTEXTS),
    "switching": Switching,
    "markov": lambda: Markov(0.1 / N_ARMS + 0.9 * np.eye(N_ARMS), arm_of=list(range(N_ARMS))),
}


def trend_and_regimes(rng: np.random.Generator) -> np.ndarray:
    """Forecast-error-like losses: a slow trend, a ×100 jump at 40% and back at 80%, arm
    means that cross, rounded to 0.1 (ties)."""
    t = np.arange(ROUNDS)[:, None, None] / ROUNDS
    means = rng.uniform(1.0, 3.0, size=(1, N_INSTANCES, N_ARMS)) + t * rng.normal(
        0.0, 2.0, size=(1, N_INSTANCES, N_ARMS)
    )
    noise = np.abs(rng.normal(0.0, 1.0, size=(ROUNDS, N_INSTANCES, N_ARMS)))
    scale = np.where((t > 0.4) & (t < 0.8), 100.0, 1.0)
    return np.round(scale * np.abs(means + noise), 1)


def near_ties(rng: np.random.Generator) -> np.ndarray:
    """Two arms 10^-3 apart, the rest close behind, Gaussian noise with decimals."""
    means = np.linspace(0.5, 0.53, N_ARMS)
    means[1] = means[0] + 1e-3
    return means + 0.2 * rng.standard_normal((ROUNDS, N_INSTANCES, N_ARMS))


def spikes(rng: np.random.Generator) -> np.ndarray:
    """Every arm loses 1.7; arm 0 loses 31.3 one round in ten, else 0 (mean 3.13)."""
    losses = np.full((ROUNDS, N_INSTANCES, N_ARMS), 1.7)
    losses[:, :, 0] = 31.3 * (rng.random((ROUNDS, N_INSTANCES)) < 0.1)
    return losses


TABLES = {"trend_and_regimes": trend_and_regimes, "near_ties": near_ties, "spikes": spikes}


@functools.cache
def table(kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(20261206)
    return (
        TABLES[kind](rng),
        rng.random((ROUNDS, N_INSTANCES)),
        rng.integers(0, N_CONTEXTS, size=(ROUNDS, N_INSTANCES)),
    )


def selections(kind: str, name: str, variant: str, transform: str | None) -> np.ndarray:
    """The arms chosen at every round by N_INSTANCES bandits fed (mapped) losses."""
    losses, u, contexts = table(kind)
    if transform is not None:
        losses = MAPS[transform](losses)
    b = BatchBandit(N_INSTANCES, N_ARMS, CLASSES[name](), seed=0, variant=variant)
    ctx = contexts if name == "contextual" else [None] * ROUNDS
    out = np.empty((ROUNDS, N_INSTANCES), dtype=np.int64)
    rows = np.arange(N_INSTANCES)
    for t in range(ROUNDS):
        tickets = b.select(contexts=ctx[t], u=u[t])
        out[t] = tickets.arms
        b.update(tickets, losses[t, rows, out[t]])
    return out


@functools.cache
def unmapped(kind: str, name: str, variant: str) -> np.ndarray:
    return selections(kind, name, variant, None)


@pytest.mark.parametrize("transform", list(MAPS))
@pytest.mark.parametrize("variant", ["bobw"])
@pytest.mark.parametrize("name", list(CLASSES))
@pytest.mark.parametrize("kind", list(TABLES))
def test_no_selection_changes_under_maps_that_round(kind, name, variant, transform):
    base = unmapped(kind, name, variant)
    mapped = selections(kind, name, variant, transform)
    differ = np.argwhere(mapped != base)
    assert not len(differ), (
        f"{len(differ)} of {base.size} selections differ, the first at round {differ[0][0] + 1}"
    )


def test_the_tables_are_what_they_claim():
    """The checks above could fail: the mapped losses differ from the exact map in their
    last bits, and the tables have ties, regime changes and spikes."""
    close, _, _ = table("near_ties")
    assert ((MAPS["1000l+1e6"](close) - 1e6) / 1000.0 != close).any()
    assert ((MAPS["l+3"](close) - 3.0) != close).any()
    losses, _, _ = table("trend_and_regimes")
    assert (np.diff(np.sort(losses[:100, 0], axis=None)) == 0).any()  # ties
    assert losses[ROUNDS // 2].mean() > 20 * losses[: ROUNDS // 3].mean()
    spiky, _, _ = table("spikes")
    assert 0.08 < (spiky[:, :, 0] > 0).mean() < 0.12
