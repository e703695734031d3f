"""The speed measures of ``bench_core.py``: every timed loop as a ``Measure`` (a fresh
instance, untimed warm-up, timed rounds) and their interleaved repeats."""

from __future__ import annotations

import gc
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from tsi_core import Bandit, BatchBandit, Contextual, Switching
from tsi_core._kernel import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the modules beside this one
from core_inputs import (
    batch_contexts,
    batch_draws,
    batch_losses,
    markov_10,
    single_table,
)
from core_loops import (
    loop_bandit,
    loop_bandit_contexts,
    loop_bandit_u,
    loop_batch,
    loop_batch_table,
    loop_river,
    loop_table,
)
from core_plan import BATCH_M, BATCH_N, BATCH_SLABS, BEFORE, N_CONTEXTS, RIVER_GAMMA, Measure, Plan
from core_references import BatchExp3, Exp3, PythonExp3


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
