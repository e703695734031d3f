"""Throughput and memory of ``tsi_core`` (the compiled kernel), each figure a ratio to
references measured in the same run.

Run from the repository root::

    .venv/bin/python bench/bench_core.py            # full run (7 repeats, ~1 min)
    .venv/bin/python bench/bench_core.py --quick    # smoke run (2 repeats, 1/10 of the work)
    .venv/bin/python bench/bench_core.py --out F    # raw repeats to F (bench/core_results.json)

It prints a Markdown report to stdout (progress goes to stderr) and writes every raw repeat
to the JSON file.

How a figure is taken
---------------------
Every measure is a closure that builds a fresh instance with the same seed, runs untimed
warm-up rounds on it, then times a fixed number of rounds with ``time.perf_counter``
around the loop only. The repeats are interleaved: repeat r runs every measure once, in an
order rotated by r, so a drift of this machine's speed hits every measure alike. A figure
is the median over repeats of ``work / seconds``; a ratio is the quotient of two such
medians (the per-repeat quotients, pairs from the same repeat, are in the JSON and their
range in the report). Loss tables, draws and contexts are precomputed before timing: for
single instances as Python lists (round i reads row ``i % rows``: the same lookup in every
loop, at most 8192 rows and 2^18 cells), for batches as numpy arrays of at most 32 (N, M)
slabs (round r reads slab ``r % slabs``); the algorithms are adversarial and indifferent
to the repetition. OPENBLAS_NUM_THREADS=1 is set before numpy is imported (an idle BLAS
thread otherwise spins on the second core).

Single instance: rounds/s of select + update
* ``Bandit <class> M=10``: ``t = b.select(); b.update(t, loss)`` with the instance's own
  generator draws and the loss ``1e6 + 1000 * U[0, 1)`` of the chosen arm (tsi is invariant
  to shift and scale), for Fixed(), Contextual(3) (``b.select(context)``, contexts cycling
  through a precomputed random array), Switching(rate=1e-3), Switching() (the decaying
  rate) and Markov (dense 10x10 transition, 0.9 on the diagonal, arm_of = range(10)); and
  ``Bandit Fixed() M=1000``.
* ``pure-Python EXP3 M=10``: EXP3 with lists, math.exp, bisect and random.Random draws:
  what CPython manages at its leanest.
* ``numpy EXP3 M=...``: log-weights in a numpy array, p = softmax (no uniform mixing),
  ``arm = searchsorted(cumsum(p), rng.random())``, ``logw[arm] -= eta * loss / p[arm]``
  with ``eta = sqrt(2 log M / (T M))``; losses U (the table before shifting and scaling).
* ``river Exp3 M=...``: ``river.bandit.Exp3(gamma=0.1, seed=1)`` driven by its own API,
  ``arm = policy.pull(range(M))`` (the range built once), ``policy.update(arm, 1 - U)``:
  rewards in [0, 1], so its weights grow without overflowing in the rounds run here.

Batch, N=10,000 and M=10: instance-rounds/s (N * rounds / seconds) of
``tk = bb.select(); bb.update(tk, losses[slab][idx, tk.arms])``
* ``BatchBandit <class>``: Fixed(), Switching(rate=1e-3), Contextual(3) (contexts from a
  precomputed (slabs, N) array).
* ``numpy BatchBandit <class> (433eead)``: the same loop on the numpy implementation of
  commit 433eead, extracted with ``git archive`` into a temporary directory as the package
  ``tsi_core_numpy`` (imports rewritten) and imported beside ``tsi_core``. Without git or
  that commit, the Fixed reference is the figure recorded in bench/RESULTS.md
  (``RECORDED_NUMPY_BATCH``) and the report says so.
* ``numpy EXP3 batch``: the EXP3 above vectorised over N instances (row-wise searchsorted
  as ``(cumsum(p, axis=1) <= u[:, None]).sum(axis=1)``).

Cost of the API layer (argument checks, tickets, the pending-ticket registry): both loops
take u from a precomputed array.
* ``Bandit Fixed() M=... (u given)``: ``t = b.select(u=u); b.update(t, loss)``, against
  ``kernel Table M=...``: ``arm, q, p, n, why = t.select(0, 0, u); t.update(0, 0, arm, q, p,
  loss)`` on ``t = Table(k, k.initial_rows(1))``, ``k = Bandit(M)._table.kernel``.
* ``BatchBandit Fixed() (u given)``: ``bb.select(u=...)``, against ``kernel Table
  N=10,000``: ``t.select_many(rows, contexts, u, arms, q, p)`` and ``t.update_many(rows,
  contexts, arms, q, p, losses)`` on an N-row table (int64/float64 arrays, outputs
  allocated once).
The figure is API / bare (1 = the layer costs nothing).

Memory, bytes per instance (M=10): ``BatchBandit.nbytes / N`` (its state table; the
traced figures below also count the index arrays it keeps);
tracemalloc of constructing one ``BatchBandit`` with N=100,000, retained and peak, divided
by N; tracemalloc of 10,000 ``Bandit(n_arms=10)`` objects (a compiled base class with a
Python subclass, each holding a one-row kernel table) divided by 10,000, right after
construction and after one select + update each (the own-draw select creates the
instance's numpy Generator). These include the list holding the objects (8 bytes each).

Targets (from the issue; printed as PASS/MISS beside the ratios, nothing is asserted):
Bandit Fixed M=10 >= 2x pure-Python EXP3 and >= 5x river Exp3; Bandit Fixed M=1000 >= 2x
numpy EXP3; Fixed / class <= 1.5 at M=10 (rounds/s of Fixed over rounds/s of the class) for
Switching(rate=1e-3), Switching() and Contextual(3) (Markov is shown without a target: its
update is O(edges), 100 for the dense 10x10); BatchBandit Fixed >= 4x the numpy BatchBandit
of 433eead. The one-instance table also gives, for every row, the Bandit
Fixed of the same M over that row (> 1: Bandit Fixed is faster).
"""

from __future__ import annotations

import os

os.environ["OPENBLAS_NUM_THREADS"] = "1"  # before numpy: no BLAS thread spinning

import argparse
import bisect
import gc
import importlib
import io
import itertools
import json
import math
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

import tsi_core
from tsi_core import Bandit, BatchBandit, Contextual, Markov, Switching
from tsi_core._kernel import Table

REPO = Path(__file__).resolve().parent.parent
BEFORE = "433eead"  # the last numpy implementation
# bench/RESULTS.md, 2026-11-26, AMD EPYC (2 cores): numpy BatchBandit N=10,000 M=10, Fixed
RECORDED_NUMPY_BATCH = 5_430_876.0
BUILD_NOTE = "kernel built with -O3 -ffp-contract=off (setup.py: no fast-math, no FMA)"

LOSS_SHIFT = 1e6
LOSS_SCALE = 1000.0
TABLE_SEED = 12345
DRAW_SEED = 54321
TABLE_ROWS = 8192  # single instance: at most this many rows, cycled
TABLE_CELLS = 2**18  # ... and at most this many cells (Python floats)
BATCH_SLABS = 32  # batch: at most this many (N, M) slabs, cycled
BATCH_N = 10_000
BATCH_M = 10
N_CONTEXTS = 3
RIVER_GAMMA = 0.1
MEM_BATCH_N = 100_000
MEM_BANDITS = 10_000

# (label, measure, reference, op, bound): ratio = measure / reference, PASS if `ratio op bound`
TARGETS = (
    ("Bandit Fixed M=10 vs pure-Python EXP3", "bandit_fixed_m10", "python_exp3_m10", ">=", 2.0),
    ("Bandit Fixed M=10 vs river Exp3", "bandit_fixed_m10", "river_exp3_m10", ">=", 5.0),
    ("Bandit Fixed M=1000 vs numpy EXP3", "bandit_fixed_m1000", "exp3_m1000", ">=", 2.0),
    ("Fixed / Switching(1e-3), M=10", "bandit_fixed_m10", "bandit_switching_m10", "<=", 1.5),
    ("Fixed / Switching() decaying, M=10", "bandit_fixed_m10", "bandit_decaying_m10", "<=", 1.5),
    ("Fixed / Contextual(3), M=10", "bandit_fixed_m10", "bandit_contextual_m10", "<=", 1.5),
    ("BatchBandit Fixed vs numpy BatchBandit", "batch_fixed", "numpy_batch_fixed", ">=", 4.0),
)

# rounds timed per repeat in the full run; chosen so that, on a 2-core AMD EPYC, each
# timed loop takes about 0.3 s
WORK = {
    "bandit_fixed_m10": 900_000,
    "bandit_contextual_m10": 450_000,
    "bandit_switching_m10": 550_000,
    "bandit_decaying_m10": 550_000,
    "bandit_markov_m10": 250_000,
    "bandit_fixed_m1000": 45_000,
    "python_exp3_m10": 170_000,
    "exp3_m10": 40_000,
    "exp3_m1000": 22_000,
    "river_exp3_m10": 55_000,  # below ~130,000: river's weights overflow at log w = 709
    "river_exp3_m1000": 900,
    "bandit_u_m10": 800_000,
    "table_m10": 900_000,
    "bandit_u_m1000": 45_000,
    "table_m1000": 45_000,
    "batch_fixed": 220,
    "batch_switching": 100,
    "batch_contextual": 220,
    "numpy_batch_fixed": 230,
    "numpy_batch_switching": 130,
    "numpy_batch_contextual": 130,
    "exp3_batch": 180,
    "batch_u_fixed": 220,
    "table_batch": 240,
}


@dataclass(frozen=True)
class Plan:
    """How much work each measure does (rounds are timed; warm-up rounds are not)."""

    repeats: int
    warmup: int  # single-instance warm-up rounds
    batch_warmup: int  # batch warm-up rounds
    share: float  # fraction of ``WORK`` timed per repeat

    def rounds(self, key: str) -> int:
        return max(1, round(WORK[key] * self.share))


FULL = Plan(repeats=7, warmup=1000, batch_warmup=3, share=1.0)
QUICK = Plan(repeats=2, warmup=100, batch_warmup=1, share=0.1)


@dataclass
class Measure:
    """A timed loop: ``once()`` builds, warms up and returns the timed seconds."""

    key: str
    label: str
    unit: str
    work: int  # rounds (or instance-rounds) timed per call of ``once``
    once: Callable[[], float]


# ------------------------------------------------------------------------------ inputs


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


# ----------------------------------------------------------------- single-instance loops


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


class Exp3:
    """Plain EXP3 on one instance: log-weights, softmax, searchsorted draw, IW update."""

    def __init__(self, n_arms: int, horizon: int, seed: int) -> None:
        self.logw = np.zeros(n_arms)
        self.eta = math.sqrt(2.0 * math.log(n_arms) / (horizon * n_arms))
        self.rng = np.random.default_rng(seed)

    def run(self, table: list, start: int, rounds: int) -> float:
        logw, eta, rng = self.logw, self.eta, self.rng
        last, n_rows = logw.shape[0] - 1, len(table)
        t0 = time.perf_counter()
        for i in range(start, start + rounds):
            w = np.exp(logw - logw.max())
            p = w / w.sum()
            u = rng.random()
            arm = min(int(np.searchsorted(np.cumsum(p), u, side="right")), last)
            logw[arm] -= eta * table[i % n_rows][arm] / p[arm]
        return time.perf_counter() - t0


class PythonExp3:
    """EXP3 in plain Python floats (math.exp, bisect): what CPython manages at its leanest."""

    def __init__(self, n_arms: int, horizon: int, seed: int) -> None:
        self.logw = [0.0] * n_arms
        self.eta = math.sqrt(2.0 * math.log(n_arms) / (horizon * n_arms))
        self.rng = random.Random(seed)

    def run(self, table: list, start: int, rounds: int) -> float:
        logw, eta, draw = self.logw, self.eta, self.rng.random
        last, n_rows = len(logw) - 1, len(table)
        t0 = time.perf_counter()
        for i in range(start, start + rounds):
            top = max(logw)
            w = [math.exp(v - top) for v in logw]
            total = sum(w)
            arm = min(bisect.bisect_right(list(itertools.accumulate(w)), draw() * total), last)
            logw[arm] -= eta * table[i % n_rows][arm] * total / w[arm]
        return time.perf_counter() - t0


# --------------------------------------------------------------------------- batch loops


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


class BatchExp3:
    """EXP3 vectorised over N independent instances (same steps as ``Exp3``, row-wise)."""

    def __init__(self, n_instances: int, n_arms: int, horizon: int, seed: int) -> None:
        self.logw = np.zeros((n_instances, n_arms))
        self.eta = math.sqrt(2.0 * math.log(n_arms) / (horizon * n_arms))
        self.rng = np.random.default_rng(seed)

    def run(self, losses: np.ndarray, start: int, rounds: int) -> float:
        logw, eta, rng = self.logw, self.eta, self.rng
        n, m = logw.shape
        idx = np.arange(n)
        n_slabs = len(losses)
        t0 = time.perf_counter()
        for r in range(start, start + rounds):
            w = np.exp(logw - logw.max(axis=1, keepdims=True))
            p = w / w.sum(axis=1, keepdims=True)
            u = rng.random(n)
            arms = np.minimum((np.cumsum(p, axis=1) <= u[:, None]).sum(axis=1), m - 1)
            logw[idx, arms] -= eta * losses[r % n_slabs][idx, arms] / p[idx, arms]
        return time.perf_counter() - t0


# ----------------------------------------------------------------------------- measures


def warmed(
    build: Callable[[], Any], loop: Callable[..., float], table: Any, warmup: int, rounds: int
) -> Callable[[], float]:
    """``once``: a fresh instance, ``warmup`` untimed rounds, then ``rounds`` timed ones."""

    def once() -> float:
        x = build()
        loop(x, table, 0, warmup)
        return loop(x, table, warmup, rounds)

    return once


def bandit_measure(key: str, label: str, plan: Plan, n_arms: int = 10, **kw: Any) -> Measure:
    """A ``Bandit`` loop: own draws (``loop_bandit``), contexts or given u (``loop``)."""
    loop = kw.pop("loop", loop_bandit)
    rounds = plan.rounds(key)

    def build() -> Bandit:
        return Bandit(n_arms=n_arms, seed=1, **kw)

    once = warmed(build, loop, single_table(n_arms, "shifted"), plan.warmup, rounds)
    return Measure(key, label, "rounds/s", rounds, once)


def table_measure(key: str, label: str, plan: Plan, n_arms: int) -> Measure:
    rounds = plan.rounds(key)
    kernel = Bandit(n_arms)._table.kernel

    def build() -> Table:
        return Table(kernel, kernel.initial_rows(1))

    once = warmed(build, loop_table, single_table(n_arms, "shifted"), plan.warmup, rounds)
    return Measure(key, label, "rounds/s", rounds, once)


def exp3_measure(key: str, label: str, plan: Plan, kind: type, n_arms: int) -> Measure:
    """An EXP3 reference loop (``Exp3`` in numpy or ``PythonExp3``), losses U."""
    rounds = plan.rounds(key)

    def build() -> Any:
        return kind(n_arms, horizon=plan.warmup + rounds, seed=1)

    def loop(e: Any, table: list, start: int, n: int) -> float:
        return e.run(table, start, n)

    once = warmed(build, loop, single_table(n_arms, "unit"), plan.warmup, rounds)
    return Measure(key, label, "rounds/s", rounds, once)


def river_measure(key: str, label: str, plan: Plan, exp3: type, n_arms: int) -> Measure:
    rounds = plan.rounds(key)

    def build() -> Any:
        return exp3(gamma=RIVER_GAMMA, seed=1)

    once = warmed(build, loop_river, single_table(n_arms, "reward"), plan.warmup, rounds)
    return Measure(key, label, "rounds/s", rounds, once)


def batch_measure(key: str, label: str, plan: Plan, cls: type, **kw: Any) -> Measure:
    """A BatchBandit loop (``cls`` of either implementation); ``contexts``/``draws``
    True take them from the precomputed arrays."""
    rounds = plan.rounds(key)
    slabs = min(plan.batch_warmup + rounds, BATCH_SLABS)
    losses = batch_losses(slabs, "shifted")
    contexts = batch_contexts(slabs) if kw.pop("contexts", False) else None
    draws = batch_draws(slabs) if kw.pop("draws", False) else None

    def build() -> Any:
        return cls(n_instances=BATCH_N, n_arms=BATCH_M, seed=1, **kw)

    def loop(bb: Any, table: np.ndarray, start: int, n: int) -> float:
        return loop_batch(bb, table, start, n, contexts, draws)

    once = warmed(build, loop, losses, plan.batch_warmup, rounds)
    return Measure(key, label, "instance-rounds/s", BATCH_N * rounds, once)


def batch_table_measure(key: str, label: str, plan: Plan) -> Measure:
    rounds = plan.rounds(key)
    slabs = min(plan.batch_warmup + rounds, BATCH_SLABS)
    draws = batch_draws(slabs)
    kernel = Bandit(BATCH_M)._table.kernel

    def build() -> Table:
        return Table(kernel, kernel.initial_rows(BATCH_N))

    def loop(t: Table, losses: np.ndarray, start: int, n: int) -> float:
        return loop_batch_table(t, losses, draws, start, n)

    once = warmed(build, loop, batch_losses(slabs, "shifted"), plan.batch_warmup, rounds)
    return Measure(key, label, "instance-rounds/s", BATCH_N * rounds, once)


def batch_exp3_measure(key: str, label: str, plan: Plan) -> Measure:
    rounds = plan.rounds(key)
    slabs = min(plan.batch_warmup + rounds, BATCH_SLABS)

    def build() -> BatchExp3:
        return BatchExp3(BATCH_N, BATCH_M, horizon=plan.batch_warmup + rounds, seed=1)

    def loop(e: BatchExp3, losses: np.ndarray, start: int, n: int) -> float:
        return e.run(losses, start, n)

    once = warmed(build, loop, batch_losses(slabs, "unit"), plan.batch_warmup, rounds)
    return Measure(key, label, "instance-rounds/s", BATCH_N * rounds, once)


def single_measures(plan: Plan, river_exp3: type | None) -> list[Measure]:
    m = [
        bandit_measure("bandit_fixed_m10", "Bandit Fixed() M=10", plan),
        bandit_measure(
            "bandit_contextual_m10",
            "Bandit Contextual(3) M=10",
            plan,
            competition=Contextual(N_CONTEXTS),
            loop=loop_bandit_contexts,
        ),
        bandit_measure(
            "bandit_switching_m10",
            "Bandit Switching(rate=1e-3) M=10",
            plan,
            competition=Switching(rate=1e-3),
        ),
        bandit_measure(
            "bandit_decaying_m10", "Bandit Switching() decaying M=10", plan, competition=Switching()
        ),
        bandit_measure(
            "bandit_markov_m10", "Bandit Markov 10x10 M=10", plan, competition=markov_10()
        ),
        bandit_measure("bandit_fixed_m1000", "Bandit Fixed() M=1000", plan, n_arms=1000),
        exp3_measure("python_exp3_m10", "pure-Python EXP3 M=10", plan, PythonExp3, 10),
        exp3_measure("exp3_m10", "numpy EXP3 M=10", plan, Exp3, 10),
        exp3_measure("exp3_m1000", "numpy EXP3 M=1000", plan, Exp3, 1000),
    ]
    if river_exp3 is not None:
        m.append(river_measure("river_exp3_m10", "river Exp3 M=10", plan, river_exp3, 10))
        m.append(river_measure("river_exp3_m1000", "river Exp3 M=1000", plan, river_exp3, 1000))
    return m


def api_measures(plan: Plan) -> list[Measure]:
    return [
        bandit_measure("bandit_u_m10", "Bandit Fixed() M=10 (u given)", plan, loop=loop_bandit_u),
        table_measure("table_m10", "kernel Table M=10", plan, 10),
        bandit_measure(
            "bandit_u_m1000",
            "Bandit Fixed() M=1000 (u given)",
            plan,
            n_arms=1000,
            loop=loop_bandit_u,
        ),
        table_measure("table_m1000", "kernel Table M=1000", plan, 1000),
        batch_measure(
            "batch_u_fixed", "BatchBandit Fixed() (u given)", plan, BatchBandit, draws=True
        ),
        batch_table_measure("table_batch", "kernel Table N=10,000 (select_many)", plan),
    ]


def batch_measures(plan: Plan, before: ModuleType | None) -> list[Measure]:
    m = [
        batch_measure("batch_fixed", "BatchBandit Fixed()", plan, BatchBandit),
        batch_measure(
            "batch_switching",
            "BatchBandit Switching(rate=1e-3)",
            plan,
            BatchBandit,
            competition=Switching(rate=1e-3),
        ),
        batch_measure(
            "batch_contextual",
            "BatchBandit Contextual(3)",
            plan,
            BatchBandit,
            competition=Contextual(N_CONTEXTS),
            contexts=True,
        ),
        batch_exp3_measure("exp3_batch", "numpy EXP3 batch", plan),
    ]
    if before is not None:
        old = before.BatchBandit
        m += [
            batch_measure("numpy_batch_fixed", f"numpy BatchBandit Fixed() ({BEFORE})", plan, old),
            batch_measure(
                "numpy_batch_switching",
                f"numpy BatchBandit Switching(rate=1e-3) ({BEFORE})",
                plan,
                old,
                competition=before.Switching(rate=1e-3),
            ),
            batch_measure(
                "numpy_batch_contextual",
                f"numpy BatchBandit Contextual(3) ({BEFORE})",
                plan,
                old,
                competition=before.Contextual(N_CONTEXTS),
                contexts=True,
            ),
        ]
    return m


def summary(m: Measure, seconds: list[float]) -> dict[str, Any]:
    rates = [m.work / s for s in seconds]
    return {
        "label": m.label,
        "unit": m.unit,
        "work_per_repeat": m.work,
        "seconds": seconds,
        "rates": rates,
        "median": statistics.median(rates),
        "min": min(rates),
        "max": max(rates),
    }


def run_interleaved(measures: list[Measure], repeats: int) -> dict[str, dict[str, Any]]:
    """Every measure once per repeat, the order rotated by the repeat (progress on stderr)."""
    seconds: dict[str, list[float]] = {m.key: [] for m in measures}
    for r in range(repeats):
        shift = r % len(measures)
        for m in measures[shift:] + measures[:shift]:
            gc.collect()
            seconds[m.key].append(m.once())
        print(f"  repeat {r + 1}/{repeats} done", file=sys.stderr, flush=True)
    results = {m.key: summary(m, seconds[m.key]) for m in measures}
    for m in measures:
        x = results[m.key]
        print(f"  {m.label:<48} {x['median']:>14,.0f} {m.unit}", file=sys.stderr)
    return results


# ------------------------------------------------------------- the numpy implementation


def extract_before(workdir: Path) -> Path:
    """``git archive BEFORE tsi_core`` as package ``tsi_core_numpy`` under ``workdir``."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", BEFORE, "tsi_core"],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(workdir, filter="data")
    package = workdir / "tsi_core_numpy"
    (workdir / "tsi_core").rename(package)
    for source in package.glob("*.py"):
        text = re.sub(r"\b(from|import) tsi_core\b", r"\1 tsi_core_numpy", source.read_text())
        source.write_text(text)
    return package


def load_before(workdir: Path) -> tuple[ModuleType | None, str]:
    """The numpy implementation of ``BEFORE`` importable beside ``tsi_core``, and a note."""
    try:
        extract_before(workdir)
    except (OSError, subprocess.CalledProcessError, tarfile.TarError, TypeError) as exc:
        detail = getattr(exc, "stderr", b"") or str(exc).encode()
        return None, f"git archive {BEFORE} failed: {detail.decode(errors='replace').strip()}"
    sys.path.insert(0, str(workdir))
    module = importlib.import_module("tsi_core_numpy")
    return module, f"measured in this run (git archive {BEFORE}, imported as tsi_core_numpy)"


def river_exp3() -> type | None:
    try:
        from river.bandit import Exp3 as RiverExp3
    except ImportError:
        return None
    return RiverExp3


def recorded_reference(repeats: int) -> dict[str, Any]:
    """Stand-in for ``numpy_batch_fixed`` when the old commit cannot be extracted."""
    return {
        "label": f"numpy BatchBandit Fixed() ({BEFORE}, recorded in bench/RESULTS.md)",
        "unit": "instance-rounds/s",
        "recorded": True,
        "rates": [RECORDED_NUMPY_BATCH] * repeats,
        "median": RECORDED_NUMPY_BATCH,
        "min": RECORDED_NUMPY_BATCH,
        "max": RECORDED_NUMPY_BATCH,
    }


# ------------------------------------------------------------------------------- ratios


def ratio(measures: dict[str, dict], key: str, ref: str) -> dict[str, Any] | None:
    """measure / reference: the quotient of medians, and per repeat (same-repeat pairs)."""
    if key not in measures or ref not in measures:
        return None
    a, b = measures[key], measures[ref]
    per_repeat = [x / y for x, y in zip(a["rates"], b["rates"], strict=True)]
    return {
        "measure": key,
        "reference": ref,
        "ratio": a["median"] / b["median"],
        "per_repeat": per_repeat,
        "min": min(per_repeat),
        "max": max(per_repeat),
    }


PAIRS = (  # every ratio the report shows, (measure, reference)
    *((t[1], t[2]) for t in TARGETS),
    ("bandit_fixed_m10", "exp3_m10"),
    ("bandit_fixed_m1000", "river_exp3_m1000"),
    ("bandit_fixed_m10", "bandit_fixed_m1000"),
    ("batch_switching", "numpy_batch_switching"),
    ("batch_contextual", "numpy_batch_contextual"),
    ("batch_fixed", "exp3_batch"),
    ("batch_fixed", "batch_switching"),
    ("batch_fixed", "batch_contextual"),
    ("bandit_u_m10", "table_m10"),
    ("bandit_u_m1000", "table_m1000"),
    ("batch_u_fixed", "table_batch"),
    ("bandit_fixed_m10", "bandit_u_m10"),
)


def all_ratios(measures: dict[str, dict]) -> dict[str, dict[str, Any]]:
    found = {f"{a}/{b}": ratio(measures, a, b) for a, b in PAIRS}
    return {name: r for name, r in found.items() if r is not None}


def targets_of(ratios: dict[str, dict]) -> list[dict[str, Any]]:
    out = []
    for label, key, ref, op, bound in TARGETS:
        r = ratios.get(f"{key}/{ref}")
        passed = None if r is None else (r["ratio"] >= bound if op == ">=" else r["ratio"] <= bound)
        out.append(
            {
                "label": label,
                "ratio": None if r is None else r["ratio"],
                "op": op,
                "bound": bound,
                "pass": passed,
                "measure": key,
                "reference": ref,
            }
        )
    return out


# ------------------------------------------------------------------------------- memory


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


# ------------------------------------------------------------------------------ machine


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def numpy_config() -> dict[str, Any]:
    """SIMD extensions and BLAS of the numpy build (numpy >= 1.25; empty otherwise)."""
    try:
        cfg = np.show_config(mode="dicts")
    except (TypeError, ValueError):
        return {}
    simd = cfg.get("SIMD Extensions", {})
    blas = cfg.get("Build Dependencies", {}).get("blas", {})
    return {
        "simd_baseline": simd.get("baseline"),
        "simd_found": simd.get("found"),
        "blas": f"{blas.get('name', '?')} {blas.get('version', '')}".strip(),
    }


def kernel_build() -> dict[str, Any]:
    """Cython version and compile flags of the built kernel, from its generated C file."""
    try:
        import Cython

        venv_cython = Cython.__version__
    except ImportError:
        venv_cython = None
    source = Path(tsi_core.__file__).with_name("_kernel.c")
    try:
        text = source.read_text(encoding="utf-8", errors="replace")[:4000]
    except OSError:
        text = ""
    generated = re.search(r"Generated by Cython (\S+)", text)
    meta = re.search(r"BEGIN: Cython Metadata\n(.*?)\nEND: Cython Metadata", text, re.S)
    flags = json.loads(meta.group(1))["distutils"].get("extra_compile_args") if meta else None
    compiled = ("tsi_core._kernel", "tsi_core._bandit")
    built = min(Path(sys.modules[name].__file__).stat().st_mtime for name in compiled)
    sources = [*source.parent.glob("*.pyx"), *source.parent.glob("*.pxd")]
    sources += source.parent.glob("_kernel_src/*.h")
    return {
        "cython": venv_cython,
        "kernel_built_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(built)),
        "kernel_older_than_sources": any(f.stat().st_mtime > built for f in sources),
        "kernel_generated_by_cython": generated.group(1) if generated else None,
        "kernel_compile_args": flags,
        "build_note": BUILD_NOTE,
    }


def git_state() -> dict[str, Any]:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True
        ).stdout

    try:
        dirty = git("status", "--porcelain", "--", "tsi_core").splitlines()
        return {
            "commit": git("rev-parse", "--short", "HEAD").strip(),
            "dirty_tsi_core": [line[3:] for line in dirty],
        }
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "dirty_tsi_core": []}


def machine_info() -> dict[str, Any]:
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "openblas_num_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
        "tsi_core_file": tsi_core.__file__,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        **git_state(),
        **kernel_build(),
        **numpy_config(),
    }


# ------------------------------------------------------------------------------- report


def fmt(x: float | None, digits: int = 0) -> str:
    return "n/a" if x is None else f"{x:,.{digits}f}"


def ratio_cell(results: dict[str, Any], key: str, ref: str) -> str:
    r = results["ratios"].get(f"{key}/{ref}")
    return "n/a" if r is None else f"{r['ratio']:.2f} ({r['min']:.2f} - {r['max']:.2f})"


def median_of(results: dict[str, Any], key: str) -> float | None:
    x = results["measures"].get(key)
    return None if x is None else x["median"]


def report_header(results: dict[str, Any]) -> list[str]:
    m = results["machine"]
    dirty = ", ".join(m["dirty_tsi_core"]) or "none"
    lines = [
        "## tsi_core benchmark",
        "",
        f"- CPU: {m['cpu_model']} ({m['cpu_count']} logical, {m['usable_cpus']} usable)",
        f"- {m['platform']}; Python {m['python']}, numpy {m['numpy']}",
        f"- Cython {m['cython']} (kernel generated by Cython {m['kernel_generated_by_cython']});"
        f" {m['build_note']}; compile args {m['kernel_compile_args']}",
        f"- code: git {m['commit']}, uncommitted in tsi_core/: {dirty};"
        f" compiled modules built {m['kernel_built_utc']} UTC"
        + (" (older than its .pyx/.pxd/.h sources)" if m["kernel_older_than_sources"] else ""),
        f"- OPENBLAS_NUM_THREADS={m['openblas_num_threads']}; load average (1, 5, 15 min)"
        f" {' / '.join(map(str, m['load_average']))} at the start,"
        f" {' / '.join(map(str, m['load_average_end']))} at the end",
    ]
    if m.get("simd_found") is not None:
        lines.append(
            f"- numpy SIMD baseline {m['simd_baseline']}, found {m['simd_found']}; BLAS {m['blas']}"
        )
    lines += [
        f"- mode: {results['mode']}, {results['plan']['repeats']} interleaved repeats;"
        " figures are medians, ratios quotients of medians (range of the same-repeat"
        " quotients in parentheses)",
        f"- numpy BatchBandit reference: {results['before']}",
    ]
    return lines


def report_targets(results: dict[str, Any]) -> list[str]:
    lines = ["", "### Targets", "", "| Target | Ratio (per-repeat range) | Goal | |"]
    lines.append("|---|---:|---:|---|")
    for t in results["targets"]:
        ok = "n/a" if t["pass"] is None else ("PASS" if t["pass"] else "MISS")
        cell = ratio_cell(results, t["measure"], t["reference"])
        lines.append(f"| {t['label']} | {cell} | {t['op']} {t['bound']:g} | {ok} |")
    return lines


SINGLE_ROWS = (  # (measure, the Bandit Fixed of the same M)
    ("bandit_fixed_m10", "bandit_fixed_m10"),
    ("bandit_contextual_m10", "bandit_fixed_m10"),
    ("bandit_switching_m10", "bandit_fixed_m10"),
    ("bandit_decaying_m10", "bandit_fixed_m10"),
    ("bandit_markov_m10", "bandit_fixed_m10"),
    ("python_exp3_m10", "bandit_fixed_m10"),
    ("exp3_m10", "bandit_fixed_m10"),
    ("river_exp3_m10", "bandit_fixed_m10"),
    ("bandit_fixed_m1000", "bandit_fixed_m1000"),
    ("exp3_m1000", "bandit_fixed_m1000"),
    ("river_exp3_m1000", "bandit_fixed_m1000"),
)


def report_single(results: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "### One instance: select + update (rounds/s)",
        "",
        "| Measure | Median | Min - max | Bandit Fixed (same M) / this |",
        "|---|---:|---:|---:|",
    ]
    for key, fixed in SINGLE_ROWS:
        x = results["measures"].get(key)
        if x is None:
            continue
        lines.append(
            f"| {x['label']} | {fmt(x['median'])} | {fmt(x['min'])} - {fmt(x['max'])}"
            f" | {ratio_cell(results, fixed, key) if key != fixed else '1'} |"
        )
    return lines


BATCH_ROWS = (
    ("Fixed()", "batch_fixed", "numpy_batch_fixed"),
    ("Switching(rate=1e-3)", "batch_switching", "numpy_batch_switching"),
    ("Contextual(3)", "batch_contextual", "numpy_batch_contextual"),
)


def report_batch(results: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"### BatchBandit N={BATCH_N:,} M={BATCH_M}: select + update of every instance"
        " (instance-rounds/s)",
        "",
        f"| Class | BatchBandit (kernel) | numpy BatchBandit ({BEFORE}) | kernel / numpy |",
        "|---|---:|---:|---:|",
    ]
    for label, key, ref in BATCH_ROWS:
        lines.append(
            f"| {label} | {fmt(median_of(results, key))} | {fmt(median_of(results, ref))}"
            f" | {ratio_cell(results, key, ref)} |"
        )
    exp3 = median_of(results, "exp3_batch")
    lines += [
        "",
        f"Vectorised numpy EXP3 over the same N: {fmt(exp3)} instance-rounds/s;"
        f" BatchBandit Fixed / it = {ratio_cell(results, 'batch_fixed', 'exp3_batch')}.",
    ]
    return lines


API_ROWS = (
    ("Bandit Fixed() M=10 / Table.select + update", "bandit_u_m10", "table_m10"),
    ("Bandit Fixed() M=1000 / Table.select + update", "bandit_u_m1000", "table_m1000"),
    (
        "BatchBandit Fixed() N=10,000 / Table.select_many + update_many",
        "batch_u_fixed",
        "table_batch",
    ),
)


def report_api(results: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "### Cost of the API layer (checks, tickets, pending registry); u given in both loops",
        "",
        "| Loop | API | bare kernel | API / bare |",
        "|---|---:|---:|---:|",
    ]
    for label, key, ref in API_ROWS:
        lines.append(
            f"| {label} | {fmt(median_of(results, key))} | {fmt(median_of(results, ref))}"
            f" | {ratio_cell(results, key, ref)} |"
        )
    lines += [
        "",
        "Bandit Fixed() M=10 with its own generator draws / with u given:"
        f" {ratio_cell(results, 'bandit_fixed_m10', 'bandit_u_m10')}.",
    ]
    return lines


def report_memory(mem: dict[str, Any]) -> list[str]:
    return [
        "",
        "### Memory (M=10), bytes per instance",
        "",
        "| Measure | Bytes per instance |",
        "|---|---:|",
        f"| BatchBandit.nbytes / N (N={BATCH_N:,}) | {mem['batch_nbytes_per_instance']:,.1f} |",
        f"| BatchBandit, tracemalloc retained (N={MEM_BATCH_N:,}) |"
        f" {mem['batch_traced_per_instance']:,.1f} |",
        f"| BatchBandit, tracemalloc peak while constructing (N={MEM_BATCH_N:,}) |"
        f" {mem['batch_traced_peak_per_instance']:,.1f} |",
        f"| Bandit object, constructed (tracemalloc, {MEM_BANDITS:,} objects) |"
        f" {mem['bandit_constructed_per_object']:,.1f} |",
        f"| Bandit object, after one select+update (tracemalloc, {MEM_BANDITS:,} objects) |"
        f" {mem['bandit_after_round_per_object']:,.1f} |",
    ]


def report_all(results: dict[str, Any]) -> list[str]:
    lines = ["", "### Every measure", "", "| Measure | Median | Min - max | Unit | Work/repeat |"]
    lines.append("|---|---:|---:|---|---:|")
    for x in results["measures"].values():
        work = fmt(x.get("work_per_repeat"))
        lines.append(
            f"| {x['label']} | {fmt(x['median'])} | {fmt(x['min'])} - {fmt(x['max'])}"
            f" | {x['unit']} | {work} |"
        )
    return lines


def report(results: dict[str, Any]) -> str:
    return "\n".join(
        report_header(results)
        + report_targets(results)
        + report_single(results)
        + report_batch(results)
        + report_api(results)
        + report_memory(results["memory"])
        + report_all(results)
    )


# --------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="2 repeats, 1/10 of the work")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parent / "core_results.json",
        help="JSON file for all raw repeats (default: bench/core_results.json)",
    )
    return parser.parse_args(argv)


def run(plan: Plan, workdir: Path) -> dict[str, Any]:
    """Every measure (interleaved), the ratios and the memory figures."""
    before, note = load_before(workdir)
    measures = (
        single_measures(plan, river_exp3()) + batch_measures(plan, before) + api_measures(plan)
    )
    print(f"measuring {len(measures)} loops x {plan.repeats} repeats ...", file=sys.stderr)
    results = run_interleaved(measures, plan.repeats)
    if before is None:
        results["numpy_batch_fixed"] = recorded_reference(plan.repeats)
        recorded = fmt(RECORDED_NUMPY_BATCH)
        note += f"; the Fixed reference is the figure recorded in bench/RESULTS.md ({recorded})"
    ratios = all_ratios(results)
    return {
        "before": note,
        "measures": results,
        "ratios": ratios,
        "targets": targets_of(ratios),
        "memory": measure_memory(),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = QUICK if args.quick else FULL
    started = time.perf_counter()
    machine = machine_info()  # before the run: the code and the build it measures
    workdir = Path(tempfile.mkdtemp(prefix="bench_core_"))
    try:
        figures = run(plan, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    machine["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    results = {
        "mode": "quick" if args.quick else "full",
        "plan": asdict(plan),
        "work": {key: plan.rounds(key) for key in WORK},
        "machine": machine,
        "loss_table": {"shift": LOSS_SHIFT, "scale": LOSS_SCALE, "seed": TABLE_SEED},
        **figures,
        "wall_seconds": time.perf_counter() - started,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(report(results))
    print(f"\nraw repeats: {args.out} (total {results['wall_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
