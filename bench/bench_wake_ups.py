"""What one event costs while many instances wait for feedback: per-key timers vs wake-ups.

Run from the repository root::

    .venv/bin/python bench/bench_wake_ups.py            # waiting 10^3, 10^4, 10^5 (~2 min)
    .venv/bin/python bench/bench_wake_ups.py --max 1000000   # adds 10^6 (wake-ups only)

In this process (``bytewax.testing.run_main``, one worker, no Kafka, no recovery): a
per-unit experiment (10 arms, one hour to live) first serves N requests of N units, which
leaves N instances each with an open ticket; once all N are answered, the source sends
``PROBES`` more requests one per call of its ``next_batch`` (an event per activation, as at
a real-time rate) and the figure is the worker thread's CPU time from the first probe to
the last divided by their number: the cost of one event, the operator's scan of the
waiting keys included (CPU, not wall time: on this shared host the wall time of the same
run moved severalfold between consecutive runs). Two
flows are timed at each N: Bytewax's per-key timers (``notify_at``, what bounded flows use)
and the unbounded service's wake-ups (one queue per worker, ``flows.service.shards.deadlines``).
The figure to compare is the cost at N over the cost at 10^3 (the issue's target: at most
1.5), and the host's speed drifts over minutes: so every run at N is paired with a run at
10^3 just before it, the ratio taken per pair, and the median of ``REPEATS`` pairs reported
(with the median costs). With 300 probes a run lasted a few hundredths of a second and
one pause of the host moved it by a third (bench/RESULTS.md, "Figures behind the code"):
``PROBES`` is 2,000.

The probes start ``SETTLE_S`` seconds after the last of the N is answered: shards put the
instances an event left unchanged for a second to rest a few per call
(``flows.service.shards.shard_store.REST_AFTER``), so right after a burst of 10^6 new instances the
first calls also pay for putting the burst's last second to rest. ``--settle 0`` probes
at once, to show that tail.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import orjson
from bytewax.inputs import DynamicSource, StatelessSourcePartition
from bytewax.testing import run_main

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from flows.service.connectors.memory import memory_wiring, one_per_batch
from flows.service.dataflow import Inputs, Wiring, build_flow
from flows.service.instances.registry import Registry
from flows.service.wire.events import Origin

REGISTRY = Registry.from_toml(
    '[experiments.e]\narms = ["a0","a1","a2","a3","a4","a5","a6","a7","a8","a9"]\n'
    "per_unit = true\nfeedback_ttl = 3600\n"
)
PROBES = 2000
REPEATS = 3
CHUNK = 2000
SETTLE_S = 3.0


class _Load(StatelessSourcePartition):
    """N requests in chunks; once all are answered, one probe request per call."""

    def __init__(self, n: int, answered: list, marks: list, settle: float) -> None:
        self.n, self.sent, self.probes = n, 0, 0
        self.answered, self.marks, self.settle = answered, marks, settle
        self.quiet_since: float | None = None

    def next_batch(self) -> list:
        if self.sent < self.n:
            batch = [_request(i) for i in range(self.sent, min(self.n, self.sent + CHUNK))]
            self.sent += len(batch)
            return batch
        if len(self.answered) < self.n:
            return []  # the backlog is still being served
        if self.quiet_since is None:
            self.quiet_since = time.perf_counter()
        if time.perf_counter() - self.quiet_since < self.settle:
            return []  # the shards put the backlog to rest
        if self.probes <= PROBES:
            self.marks.append(time.thread_time())  # the worker's thread: it calls this
            self.probes += 1
            return [_request(self.n + self.probes)]
        raise StopIteration


class _LoadSource(DynamicSource):
    def __init__(self, n: int, answered: list, marks: list, settle: float) -> None:
        self.args = (n, answered, marks, settle)

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _Load:
        return _Load(*self.args)


def _request(i: int) -> tuple[bytes, Origin]:
    body = orjson.dumps({"experiment": "e", "unit": f"u{i}", "request_id": f"r{i}"})
    return body, Origin("requests", 0, i)


def per_event_us(n: int, wake_ups: bool, settle: float = SETTLE_S) -> float:
    """Microseconds of the worker thread's CPU per probe event with n instances waiting."""
    answered, dead, marks = [], [], []
    memory = memory_wiring([], [], answered, dead)
    finished = [False]

    def requests(flow, step):
        return one_per_batch(flow, step, _LoadSource(n, answered, marks, settle)), None

    ending = (lambda: finished[0] or len(marks) > PROBES) if wake_ups else None
    wiring = Wiring(Inputs({"requests": requests}, ending=ending), memory.outputs)
    run_main(build_flow(REGISTRY, wiring, snapshots=False))
    finished[0] = True
    assert len(answered) == n + PROBES + 1, (len(answered), n)
    return (marks[-1] - marks[0]) / PROBES * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max", type=int, default=100_000, help="largest N (10^6 adds minutes)")
    parser.add_argument(
        "--settle", type=float, default=SETTLE_S, help="seconds between the backlog and the probes"
    )
    args = parser.parse_args()
    sizes = [n for n in (1_000, 10_000, 100_000, 1_000_000) if n <= args.max]
    base, rows, ratios = sizes[0], {}, {}
    for n in sizes:
        for mode in ("timers", "wake-ups"):
            if mode == "timers" and n > 100_000:
                continue  # milliseconds an event (bench/RESULTS.md): minutes for nothing new
            pairs = []
            for _ in range(REPEATS):  # the reference just before each run at n
                reference = per_event_us(base, mode == "wake-ups", args.settle)
                cost = reference if n == base else per_event_us(n, mode == "wake-ups", args.settle)
                pairs.append((reference, cost))
            rows[(n, mode)] = statistics.median(cost for _, cost in pairs)
            ratios[(n, mode)] = statistics.median(cost / ref for ref, cost in pairs)
            print(
                f"  N={n:>9,} {mode:<8} {rows[(n, mode)]:9.1f} us/event, "
                f"{ratios[(n, mode)]:.2f}x the run at {base:,} before it "
                f"(pairs: {', '.join(f'{c:.0f}/{r:.0f}' for r, c in pairs)})",
                file=sys.stderr,
            )
    print("## Per-event cost while N instances wait for feedback\n")
    print(
        f"- {platform.processor() or platform.machine()}, Python {platform.python_version()}, "
        f"{os.cpu_count()} cores; {PROBES} probe events a run, {args.settle:g} s after the "
        f"backlog; each run at N paired with a run at {base:,} just before it: median of "
        f"{REPEATS} pairs (costs and ratios)\n"
    )
    print("| N waiting | per-key timers (us/event) | x at 10^3 | wake-ups (us/event) | x at 10^3 |")
    print("|---:|---:|---:|---:|---:|")
    for n in sizes:
        cells = []
        for mode in ("timers", "wake-ups"):
            cost = rows.get((n, mode))
            cells += ["n/a", ""] if cost is None else [f"{cost:,.1f}", f"{ratios[(n, mode)]:.2f}"]
        print(f"| {n:,} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
