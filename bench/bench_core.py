"""Throughput and memory of ``tsi_core`` (the compiled kernel), each figure a ratio to
references measured in the same run.

Run from the repository root::

    .venv/bin/python bench/bench_core.py            # full run (7 repeats, ~1 min)
    .venv/bin/python bench/bench_core.py --quick    # smoke run (2 repeats, 1/10 of the work)
    .venv/bin/python bench/bench_core.py --out F    # raw repeats to F (bench/core_results.json)

It prints a Markdown report to stdout (progress goes to stderr) and writes every raw repeat
to the JSON file.

This file holds the command line and ``main``; the modules beside it do the rest:
``core_plan`` (constants, work and targets), ``core_inputs`` (precomputed losses, draws and
contexts), ``core_references`` (the EXP3 references), ``core_loops`` (the timed loops),
``core_speed`` (measures and their interleaved repeats), ``core_numpy`` (the numpy
implementation of the old commit), ``core_ratios`` (ratios and targets), ``core_memory``,
``core_machine`` (the machine and the kernel's build) and ``core_report`` (the Markdown).

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
import json
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the modules beside this one
from core_machine import machine_info
from core_memory import measure_memory
from core_numpy import load_before, recorded_reference
from core_plan import (
    FULL,
    LOSS_SCALE,
    LOSS_SHIFT,
    QUICK,
    RECORDED_NUMPY_BATCH,
    TABLE_SEED,
    WORK,
    Plan,
)
from core_ratios import all_ratios, targets_of
from core_references import river_exp3
from core_report import fmt, report
from core_speed import api_measures, batch_measures, run_interleaved, single_measures


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
