"""The inputs of ``bench_core.py``'s loops, precomputed before timing: loss tables, draws
and contexts (single instances as Python lists, batches as numpy arrays), and the Markov
competition."""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path

import numpy as np

from tsi_core import Markov

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the modules beside this one
from core_plan import (
    BATCH_M,
    BATCH_N,
    DRAW_SEED,
    LOSS_SCALE,
    LOSS_SHIFT,
    N_CONTEXTS,
    TABLE_CELLS,
    TABLE_ROWS,
    TABLE_SEED,
)


def unit_array(shape: tuple[int, ...], seed: int = TABLE_SEED) -> np.ndarray:
    """U[0, 1), the same for every measure of a given shape."""
    return np.random.default_rng(seed).random(shape)


@cache
def single_table(n_arms: int, kind: str) -> list[list[float]]:
    """Per-round losses of one instance: "shifted" (what tsi sees), "unit" or "reward"."""
    unit = unit_array((min(TABLE_ROWS, TABLE_CELLS // n_arms), n_arms))
    values = {"shifted": LOSS_SHIFT + LOSS_SCALE * unit, "unit": unit, "reward": 1.0 - unit}
    return values[kind].tolist()


@cache
def single_draws() -> list[float]:
    return unit_array((TABLE_ROWS,), DRAW_SEED).tolist()


@cache
def single_contexts() -> list[int]:
    return np.random.default_rng(DRAW_SEED).integers(0, N_CONTEXTS, TABLE_ROWS).tolist()


@cache
def batch_losses(slabs: int, kind: str) -> np.ndarray:
    unit = unit_array((slabs, BATCH_N, BATCH_M))
    return LOSS_SHIFT + LOSS_SCALE * unit if kind == "shifted" else unit


@cache
def batch_draws(slabs: int) -> np.ndarray:
    return unit_array((slabs, BATCH_N), DRAW_SEED)


@cache
def batch_contexts(slabs: int) -> np.ndarray:
    return np.random.default_rng(DRAW_SEED).integers(0, N_CONTEXTS, (slabs, BATCH_N))


def markov_10() -> Markov:
    """A dense, sticky 10x10 transition (stay 0.9), one class per arm."""
    transition = np.full((10, 10), 0.1 / 9)
    np.fill_diagonal(transition, 0.9)
    return Markov(transition, arm_of=list(range(10)))
