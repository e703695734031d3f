"""The memory figures of ``bench_core.py``: bytes per instance of ``BatchBandit`` and of
``Bandit`` objects, by ``nbytes`` and tracemalloc."""

from __future__ import annotations

import gc
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tsi_core import Bandit, BatchBandit

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the modules beside this one
from core_plan import BATCH_M, BATCH_N, LOSS_SHIFT, MEM_BANDITS, MEM_BATCH_N


def traced(build: Callable[[], Any]) -> tuple[Any, int, int]:
    """(object, retained bytes, peak bytes) allocated by ``build``, per tracemalloc."""
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        obj = build()
        gc.collect()
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return obj, current - base, peak - base


def build_bandits() -> list[Bandit]:
    return [Bandit(n_arms=BATCH_M, seed=i) for i in range(MEM_BANDITS)]


def build_and_play() -> list[Bandit]:
    bandits = build_bandits()
    for b in bandits:
        t = b.select()
        b.update(t, LOSS_SHIFT + t.arm)
    assert not any(b.pending for b in bandits)
    return bandits


def measure_memory() -> dict[str, Any]:
    nbytes = BatchBandit(n_instances=BATCH_N, n_arms=BATCH_M, seed=1).nbytes
    _, batch_retained, batch_peak = traced(
        lambda: BatchBandit(n_instances=MEM_BATCH_N, n_arms=BATCH_M, seed=1)
    )
    _, bandit_built, _ = traced(build_bandits)
    _, bandit_played, _ = traced(build_and_play)
    return {
        "batch_nbytes_per_instance": nbytes / BATCH_N,
        "batch_traced_n": MEM_BATCH_N,
        "batch_traced_bytes": batch_retained,
        "batch_traced_per_instance": batch_retained / MEM_BATCH_N,
        "batch_traced_peak_per_instance": batch_peak / MEM_BATCH_N,
        "bandit_count": MEM_BANDITS,
        "bandit_constructed_bytes": bandit_built,
        "bandit_constructed_per_object": bandit_built / MEM_BANDITS,
        "bandit_after_round_bytes": bandit_played,
        "bandit_after_round_per_object": bandit_played / MEM_BANDITS,
    }
