"""Throughput and memory benchmark of ``tsi_core`` against a plain numpy EXP3 reference.

Run from the repository root::

    .venv/bin/python bench/bench_core.py                  # full run (5 repeats, ~1-2 min)
    .venv/bin/python bench/bench_core.py --quick          # smoke run (2 repeats, fewer rounds)
    .venv/bin/python bench/bench_core.py --out bench/core_results.json

It prints a Markdown report to stdout and writes every raw repeat to the JSON file given by
``--out`` (default: ``bench/core_results.json`` next to this script).

What each figure means
----------------------
Every throughput figure is the median over the repeats of ``work / seconds``, timed with
``time.perf_counter`` around the loop only. Each repeat builds a fresh instance with the
same seed, runs a few untimed warm-up rounds on it, then times a fixed number of rounds.
Loss tables are precomputed before timing; looking a loss up is part of every timed loop
(the same lookup in the tsi loop and in its reference). To bound memory, a loss table has
at most 8192 rows (single instance) or 32 (N x M) slabs (batch) and is cycled through:
round i uses row ``i % rows``; an adversarial algorithm is indifferent to the repetition.

* ``Bandit M=10`` / ``Bandit M=1000``: rounds/s of one ``tsi_core.Bandit`` (default
  competition ``Fixed``) driven by ``t = b.select(); b.update(t, loss=...)``. Losses are a
  (rows x M) table of ``1e6 + 1000 * U[0, 1)`` looked up by the chosen arm (the
  algorithm is translation- and scale-invariant, so the shift and scale do not matter).
* ``Bandit M=10 Switching``: the same loop with ``competition=Switching(rate=1e-3)``.
* ``EXP3 M=...``: the reference, a plain numpy EXP3 loop written here: log-weights in a
  numpy array, p = softmax(log-weights) (no uniform mixing), ``u = rng.random()``,
  ``arm = searchsorted(cumsum(p), u)``, importance-weighted update
  ``logw[arm] -= eta * loss / p[arm]`` with the fixed rate ``eta = sqrt(2 log M / (T M))``
  and losses ``U[0, 1)`` (the same table before shifting and scaling).
  ``ratio`` = tsi rounds/s / EXP3 rounds/s at the same M (> 1: tsi is faster).
* ``BatchBandit N=10000 M=10``: instance-rounds/s (N * rounds / seconds) of
  ``tk = bb.select(); bb.update(tk, losses)``; losses come from a (slabs x N x M) table
  indexed by ``tk.arms``. Its reference is the same EXP3 vectorised over the N instances
  (the per-row draw is ``(cumsum(p, axis=1) <= u[:, None]).sum(axis=1)``, as a row-wise
  searchsorted).
* Memory, bytes per instance:
  ``BatchBandit.nbytes / N`` (the state arrays the class reports); tracemalloc of
  constructing one ``BatchBandit`` with N=100,000 divided by N (retained, and the peak
  during construction); tracemalloc of 10,000 ``Bandit(n_arms=10)`` objects divided by
  10,000, right after construction and after one select+update each (the pending-ticket
  dict is empty again after the update, but CPython keeps the table it allocated). These
  include the list holding the objects (8 bytes per object).

Targets (from the issue) are printed beside the results as PASS/MISS; nothing is asserted.
"""

from __future__ import annotations

import argparse
import bisect
import gc
import itertools
import json
import math
import os
import platform
import random
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

import tsi_core
from tsi_core import Bandit, BatchBandit, Switching

LOSS_SHIFT = 1e6
LOSS_SCALE = 1000.0
TABLE_SEED = 12345
TABLE_ROWS = 8192  # single-instance loss tables: at most this many rows, cycled
BATCH_SLABS = 32  # batch loss tables: at most this many (N, M) slabs, cycled
BATCH_N = 10_000
BATCH_M = 10
MEM_BATCH_N = 100_000
MEM_BANDITS = 10_000

TARGETS = {  # measure key -> (minimum, unit)
    "bandit_m10": (300_000, "rounds/s"),
    "bandit_m1000": (50_000, "rounds/s"),
    "batch_n10000_m10": (5_000_000, "instance-rounds/s"),
}


@dataclass(frozen=True)
class Plan:
    """How much work each measure does (rounds are timed; warm-up rounds are not)."""

    repeats: int
    warmup: int  # single-instance warm-up rounds
    batch_warmup: int  # batch warm-up rounds
    bandit_m10: int
    bandit_m1000: int
    switching_m10: int
    exp3_m10: int
    exp3_m1000: int
    batch: int
    exp3_batch: int


# Chosen so that, on a 2-core AMD EPYC, each full measure takes about 1-2 s.
FULL = Plan(
    repeats=5,
    warmup=300,
    batch_warmup=5,
    bandit_m10=20_000,
    bandit_m1000=16_000,
    switching_m10=12_000,
    exp3_m10=120_000,
    exp3_m1000=60_000,
    batch=250,
    exp3_batch=500,
)
QUICK = Plan(
    repeats=2,
    warmup=100,
    batch_warmup=2,
    bandit_m10=2_000,
    bandit_m1000=2_000,
    switching_m10=1_500,
    exp3_m10=6_000,
    exp3_m1000=4_000,
    batch=20,
    exp3_batch=40,
)


# ------------------------------------------------------------------------------ losses


def unit_table(shape: tuple[int, ...]) -> np.ndarray:
    """U[0, 1) losses, the same for every measure of a given shape."""
    return np.random.default_rng(TABLE_SEED).random(shape)


def shifted(unit: np.ndarray) -> np.ndarray:
    """The losses tsi sees: far from zero and not in [0, 1] (it is invariant to both)."""
    return LOSS_SHIFT + LOSS_SCALE * unit


# ------------------------------------------------------------------------- timed loops


def run_bandit(b: Bandit, losses: np.ndarray, start: int, rounds: int) -> float:
    """Seconds for ``rounds`` select+update rounds of one Bandit, losses from row ``start``."""
    t0 = time.perf_counter()
    n_rows = len(losses)
    for i in range(start, start + rounds):
        t = b.select()
        b.update(t, loss=float(losses[i % n_rows, t.arm]))
    return time.perf_counter() - t0


class Exp3:
    """Plain EXP3 on one instance: log-weights, softmax, searchsorted draw, IW update."""

    def __init__(self, n_arms: int, horizon: int, seed: int) -> None:
        self.logw = np.zeros(n_arms)
        self.eta = math.sqrt(2.0 * math.log(n_arms) / (horizon * n_arms))
        self.rng = np.random.default_rng(seed)

    def run(self, losses: np.ndarray, start: int, rounds: int) -> float:
        logw, eta, rng = self.logw, self.eta, self.rng
        last = logw.shape[0] - 1
        n_rows = len(losses)
        t0 = time.perf_counter()
        for i in range(start, start + rounds):
            w = np.exp(logw - logw.max())
            p = w / w.sum()
            u = rng.random()
            arm = min(int(np.searchsorted(np.cumsum(p), u, side="right")), last)
            loss = float(losses[i % n_rows, arm])
            logw[arm] -= eta * loss / p[arm]
        return time.perf_counter() - t0


class PythonExp3:
    """EXP3 in plain Python floats (math.exp, bisect): what CPython manages at its leanest."""

    def __init__(self, n_arms: int, horizon: int, seed: int) -> None:
        self.logw = [0.0] * n_arms
        self.eta = math.sqrt(2.0 * math.log(n_arms) / (horizon * n_arms))
        self.rng = random.Random(seed)

    def run(self, losses: np.ndarray, start: int, rounds: int) -> float:
        logw, eta, draw = self.logw, self.eta, self.rng.random
        last = len(logw) - 1
        table = losses.tolist()
        n_rows = len(table)
        t0 = time.perf_counter()
        for i in range(start, start + rounds):
            top = max(logw)
            w = [math.exp(v - top) for v in logw]
            total = sum(w)
            arm = min(bisect.bisect_right(list(itertools.accumulate(w)), draw() * total), last)
            logw[arm] -= eta * table[i % n_rows][arm] * total / w[arm]
        return time.perf_counter() - t0


def run_batch(bb: BatchBandit, losses: np.ndarray, start: int, rounds: int) -> float:
    """Seconds for ``rounds`` batch select+update rounds; ``losses`` is (slabs, N, M)."""
    idx = np.arange(bb.n_instances)
    n_slabs = len(losses)
    t0 = time.perf_counter()
    for r in range(start, start + rounds):
        tk = bb.select()
        bb.update(tk, losses[r % n_slabs][idx, tk.arms])
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


# ---------------------------------------------------------------------------- measures


def repeat(
    name: str, repeats: int, work: int, unit: str, once: Callable[[], float]
) -> dict[str, Any]:
    """Call ``once`` (which builds, warms up and returns timed seconds) ``repeats`` times."""
    seconds = []
    for _ in range(repeats):
        gc.collect()
        seconds.append(once())
    rates = [work / s for s in seconds]
    result = {
        "name": name,
        "unit": unit,
        "work_per_repeat": work,
        "seconds": seconds,
        "rates": rates,
        "median": statistics.median(rates),
        "min": min(rates),
        "max": max(rates),
    }
    print(f"  {name:<28} {result['median']:>14,.0f} {unit}", file=sys.stderr, flush=True)
    return result


def measure_bandit(name: str, n_arms: int, rounds: int, plan: Plan, **kw: Any) -> dict:
    losses = shifted(unit_table((min(plan.warmup + rounds, TABLE_ROWS), n_arms)))

    def once() -> float:
        b = Bandit(n_arms=n_arms, seed=1, **kw)
        run_bandit(b, losses, 0, plan.warmup)
        return run_bandit(b, losses, plan.warmup, rounds)

    return repeat(name, plan.repeats, rounds, "rounds/s", once)


def measure_exp3(name: str, kind: type, n_arms: int, rounds: int, plan: Plan) -> dict:
    """An EXP3 reference loop (``Exp3`` in numpy or ``PythonExp3``)."""
    losses = unit_table((min(plan.warmup + rounds, TABLE_ROWS), n_arms))

    def once() -> float:
        e = kind(n_arms, horizon=plan.warmup + rounds, seed=1)
        e.run(losses, 0, plan.warmup)
        return e.run(losses, plan.warmup, rounds)

    return repeat(name, plan.repeats, rounds, "rounds/s", once)


def measure_batch(name: str, rounds: int, plan: Plan) -> dict:
    losses = shifted(unit_table((min(plan.batch_warmup + rounds, BATCH_SLABS), BATCH_N, BATCH_M)))

    def once() -> float:
        bb = BatchBandit(n_instances=BATCH_N, n_arms=BATCH_M, seed=1)
        run_batch(bb, losses, 0, plan.batch_warmup)
        return run_batch(bb, losses, plan.batch_warmup, rounds)

    return repeat(name, plan.repeats, BATCH_N * rounds, "instance-rounds/s", once)


def measure_batch_exp3(name: str, rounds: int, plan: Plan) -> dict:
    losses = unit_table((min(plan.batch_warmup + rounds, BATCH_SLABS), BATCH_N, BATCH_M))

    def once() -> float:
        e = BatchExp3(BATCH_N, BATCH_M, horizon=plan.batch_warmup + rounds, seed=1)
        e.run(losses, 0, plan.batch_warmup)
        return e.run(losses, plan.batch_warmup, rounds)

    return repeat(name, plan.repeats, BATCH_N * rounds, "instance-rounds/s", once)


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


def measure_memory() -> dict[str, Any]:
    small = BatchBandit(n_instances=BATCH_N, n_arms=BATCH_M, seed=1)
    nbytes_per_instance = small.nbytes / BATCH_N
    del small

    def build_batch() -> BatchBandit:
        return BatchBandit(n_instances=MEM_BATCH_N, n_arms=BATCH_M, seed=1)

    big, batch_retained, batch_peak = traced(build_batch)
    del big

    def build_bandits() -> list[Bandit]:
        return [Bandit(n_arms=BATCH_M, seed=i) for i in range(MEM_BANDITS)]

    def build_and_play() -> list[Bandit]:
        bandits = build_bandits()
        for b in bandits:
            t = b.select()
            b.update(t, loss=LOSS_SHIFT + t.arm)
        del t
        assert not any(b.pending for b in bandits)
        return bandits

    built, bandit_built, _ = traced(build_bandits)
    del built
    played, bandit_played, _ = traced(build_and_play)
    del played
    return {
        "batch_nbytes_per_instance": nbytes_per_instance,
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


# ----------------------------------------------------------------------------- machine


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
        "tsi_core_file": tsi_core.__file__,
        **numpy_config(),
    }


# ------------------------------------------------------------------------------ report


def fmt(x: float) -> str:
    return f"{x:,.0f}"


def status(key: str, value: float) -> tuple[str, str]:
    if key not in TARGETS:
        return "", ""
    minimum, _ = TARGETS[key]
    return f">= {fmt(minimum)}", "PASS" if value >= minimum else "MISS"


def report(results: dict[str, Any]) -> str:
    m, r, mem = results["machine"], results["measures"], results["memory"]
    lines = [
        "## tsi_core benchmark",
        "",
        f"- CPU: {m['cpu_model']} ({m['cpu_count']} logical, {m['usable_cpus']} usable)",
        f"- Python {m['python']}, numpy {m['numpy']}, {m['platform']}",
    ]
    if m.get("simd_found") is not None:
        lines.append(
            f"- numpy SIMD baseline {m['simd_baseline']}, found {m['simd_found']}; BLAS {m['blas']}"
        )
    lines += [
        f"- mode: {results['mode']}, {results['plan']['repeats']} repeats (median, min-max)",
        "",
        "| Measure | Median | Unit | Min - max | EXP3 reference | tsi / EXP3 | Target | |",
        "|---|---:|---|---:|---:|---:|---:|---|",
    ]
    rows = [
        ("bandit_m10", "Bandit M=10 (Fixed)", "exp3_m10"),
        ("bandit_m1000", "Bandit M=1000 (Fixed)", "exp3_m1000"),
        ("switching_m10", "Bandit M=10 Switching(rate=1e-3)", "exp3_m10"),
        ("batch_n10000_m10", "BatchBandit N=10,000 M=10", "exp3_batch_n10000_m10"),
    ]
    for key, label, ref in rows:
        x, y = r[key], r[ref]
        target, ok = status(key, x["median"])
        lines.append(
            f"| {label} | {fmt(x['median'])} | {x['unit']} | {fmt(x['min'])} - {fmt(x['max'])}"
            f" | {fmt(y['median'])} | {results['ratios'][key]:.3f} | {target} | {ok} |"
        )
    floor = r["python_exp3_m10"]
    lines += [
        "",
        f"Leanest CPython reference: a pure-Python EXP3 loop (lists, math.exp, bisect) at M=10 runs"
        f" {fmt(floor['median'])} rounds/s ({fmt(floor['min'])} - {fmt(floor['max'])});"
        f" tsi Bandit M=10 is {r['bandit_m10']['median'] / floor['median']:.3f} of it.",
    ]
    lines += [
        "",
        "| Memory (M=10) | Bytes per instance |",
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
    return "\n".join(lines)


REFERENCES = (  # tsi measure -> its EXP3 reference (ratio = tsi / reference)
    ("bandit_m10", "exp3_m10"),
    ("bandit_m1000", "exp3_m1000"),
    ("switching_m10", "exp3_m10"),
    ("batch_n10000_m10", "exp3_batch_n10000_m10"),
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="2 repeats and fewer rounds")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parent / "core_results.json",
        help="JSON file for all raw repeats (default: bench/core_results.json)",
    )
    return parser.parse_args(argv)


def run_measures(plan: Plan) -> dict[str, dict]:
    """Every throughput measure, in this order (progress on stderr)."""
    return {
        "bandit_m10": measure_bandit("Bandit M=10", 10, plan.bandit_m10, plan),
        "bandit_m1000": measure_bandit("Bandit M=1000", 1000, plan.bandit_m1000, plan),
        "switching_m10": measure_bandit(
            "Bandit M=10 Switching",
            10,
            plan.switching_m10,
            plan,
            competition=Switching(rate=1e-3),
        ),
        "exp3_m10": measure_exp3("EXP3 M=10", Exp3, 10, plan.exp3_m10, plan),
        "exp3_m1000": measure_exp3("EXP3 M=1000", Exp3, 1000, plan.exp3_m1000, plan),
        "python_exp3_m10": measure_exp3(
            "pure-Python EXP3 M=10", PythonExp3, 10, plan.exp3_m10, plan
        ),
        "batch_n10000_m10": measure_batch("BatchBandit N=10000 M=10", plan.batch, plan),
        "exp3_batch_n10000_m10": measure_batch_exp3(
            "EXP3 batch N=10000 M=10", plan.exp3_batch, plan
        ),
    }


def targets_of(measures: dict[str, dict]) -> dict[str, dict[str, Any]]:
    return {
        key: {
            "minimum": minimum,
            "unit": unit,
            "median": measures[key]["median"],
            "pass": measures[key]["median"] >= minimum,
        }
        for key, (minimum, unit) in TARGETS.items()
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = QUICK if args.quick else FULL
    started = time.perf_counter()

    print("measuring (progress on stderr) ...", file=sys.stderr, flush=True)
    measures = run_measures(plan)
    ratios = {key: measures[key]["median"] / measures[ref]["median"] for key, ref in REFERENCES}
    memory = measure_memory()
    results = {
        "mode": "quick" if args.quick else "full",
        "plan": asdict(plan),
        "machine": machine_info(),
        "loss_table": {"shift": LOSS_SHIFT, "scale": LOSS_SCALE, "seed": TABLE_SEED},
        "measures": measures,
        "ratios": ratios,
        "targets": targets_of(measures),
        "memory": memory,
        "wall_seconds": time.perf_counter() - started,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(report(results))
    print(f"\nraw repeats: {args.out} (total {results['wall_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
