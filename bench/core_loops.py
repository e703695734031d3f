"""The timed loops of ``bench_core.py``: select + update rounds of ``tsi_core`` (``Bandit``,
``BatchBandit`` of either implementation, the kernel ``Table``) and of river's ``Exp3``,
``time.perf_counter`` around the loop only."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from tsi_core import Bandit
from tsi_core._kernel import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the modules beside this one
from core_inputs import single_contexts, single_draws


def loop_bandit(b: Bandit, table: list, start: int, rounds: int) -> float:
    """Seconds of ``rounds`` rounds with the instance's own draws, losses from row ``start``."""
    select, update, n_rows = b.select, b.update, len(table)
    t0 = time.perf_counter()
    for i in range(start, start + rounds):
        t = select()
        update(t, table[i % n_rows][t.arm])
    return time.perf_counter() - t0


def loop_bandit_contexts(b: Bandit, table: list, start: int, rounds: int) -> float:
    contexts = single_contexts()
    select, update, n_rows, n_ctx = b.select, b.update, len(table), len(contexts)
    t0 = time.perf_counter()
    for i in range(start, start + rounds):
        t = select(contexts[i % n_ctx])
        update(t, table[i % n_rows][t.arm])
    return time.perf_counter() - t0


def loop_bandit_u(b: Bandit, table: list, start: int, rounds: int) -> float:
    draws = single_draws()
    select, update, n_rows, n_draws = b.select, b.update, len(table), len(draws)
    t0 = time.perf_counter()
    for i in range(start, start + rounds):
        t = select(u=draws[i % n_draws])
        update(t, table[i % n_rows][t.arm])
    return time.perf_counter() - t0


def loop_table(t: Table, table: list, start: int, rounds: int) -> float:
    """The kernel's own single-row entry points, no Bandit layer."""
    draws = single_draws()
    select, update, n_rows, n_draws = t.select, t.update, len(table), len(draws)
    t0 = time.perf_counter()
    for i in range(start, start + rounds):
        arm, q, p, _, _ = select(0, 0, draws[i % n_draws])
        update(0, 0, arm, q, p, table[i % n_rows][arm])
    return time.perf_counter() - t0


def loop_river(policy: Any, table: list, start: int, rounds: int) -> float:
    pull, update, n_rows = policy.pull, policy.update, len(table)
    arm_ids = range(len(table[0]))
    t0 = time.perf_counter()
    for i in range(start, start + rounds):
        arm = pull(arm_ids)
        update(arm, table[i % n_rows][arm])
    return time.perf_counter() - t0


def loop_batch(
    bb: Any, losses: np.ndarray, start: int, rounds: int, contexts: Any = None, draws: Any = None
) -> float:
    """Seconds of ``rounds`` batch rounds (a BatchBandit of either implementation);
    ``losses`` is (slabs, N, M), ``contexts`` and ``draws`` (slabs, N) or None."""
    idx = np.arange(bb.n_instances)
    n_slabs = len(losses)
    t0 = time.perf_counter()
    for r in range(start, start + rounds):
        s = r % n_slabs
        tk = bb.select(
            contexts=None if contexts is None else contexts[s],
            u=None if draws is None else draws[s],
        )
        bb.update(tk, losses[s][idx, tk.arms])
    return time.perf_counter() - t0


def loop_batch_table(t: Table, losses: np.ndarray, draws: np.ndarray, start: int, rounds: int):
    """The kernel's many-event entry points on an N-row table, no BatchBandit layer."""
    n, n_slabs = t.n, len(losses)
    rows, contexts = np.arange(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    arms, q, p = np.empty(n, dtype=np.int64), np.empty(n), np.empty(n)
    t0 = time.perf_counter()
    for r in range(start, start + rounds):
        s = r % n_slabs
        t.select_many(rows, contexts, draws[s], arms, q, p)
        t.update_many(rows, contexts, arms, q, p, losses[s][rows, arms])
    return time.perf_counter() - t0
