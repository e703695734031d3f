"""Invariance under maps that round, on several kinds of real-like tables.

``test_long_horizon.py`` checks one heavy-tailed stream. Here the default (``bobw``) plays,
for every competition class, tables with a trend, a ×100 regime change,
near-ties, one-arm spikes, decimal losses and real forecast errors
(``arena.lab.rounding_tables``: the kinds of data where a round that amplifies rounding
flips selections), once on the losses and once on each map 1000·l + 10^6, 1000·l, l + 3,
10^-4·l − 3: every selection must be the same. The draws are the same in each run;
feedback is immediate. ``bench/bench_invariance.py`` runs the same for 10^5 rounds.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from arena.lab.rounding_tables import MAPS, TABLES, classes, selections

ROUNDS = 20_000
N_ARMS = 8
N_INSTANCES = 6
N_CONTEXTS = 3

CLASSES = classes(N_ARMS, N_CONTEXTS)


@functools.cache
def table(kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(20261206)
    return (
        TABLES[kind](rng, ROUNDS, N_INSTANCES, N_ARMS),
        rng.random((ROUNDS, N_INSTANCES)),
        rng.integers(0, N_CONTEXTS, size=(ROUNDS, N_INSTANCES)),
    )


def run(kind: str, name: str, variant: str, transform: str | None) -> np.ndarray:
    """The arms chosen at every round by N_INSTANCES bandits fed (mapped) losses."""
    losses, u, contexts = table(kind)
    if transform is not None:
        losses = MAPS[transform](losses)
    ctx = contexts if name == "contextual" else None
    return selections(losses, u, ctx, CLASSES[name](), variant)


@functools.cache
def unmapped(kind: str, name: str, variant: str) -> np.ndarray:
    return run(kind, name, variant, None)


@pytest.mark.parametrize("transform", list(MAPS))
@pytest.mark.parametrize("variant", ["bobw"])
@pytest.mark.parametrize("name", list(CLASSES))
@pytest.mark.parametrize("kind", list(TABLES))
def test_no_selection_changes_under_maps_that_round(kind, name, variant, transform):
    base = unmapped(kind, name, variant)
    mapped = run(kind, name, variant, transform)
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
    errors, _, _ = table("forecast_errors")
    assert errors.min() >= 0.0 and errors.max() > 100.0  # the targets' units, 25 to 346
    assert ((MAPS["1e-4l-3"](errors) + 3.0) * 1e4 != errors).any()
