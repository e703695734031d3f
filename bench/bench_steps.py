"""Where the service's worker thread spends its CPU in the throughput run, step by step.

Run from the repository root (about 3 minutes; it starts the project's broker unless
``KAFKA_BOOTSTRAP_SERVERS`` is set)::

    .venv/bin/python bench/bench_steps.py      # raw figures in bench/steps_results.json

``bench_flow.py`` measures the service's throughput and its ladder (``stack_flow``,
``shape_flow``); this bench splits the same runs by step. Each Python-level step the
dataflow calls once per item is wrapped in a timer of the calling thread's CPU time
(``time.thread_time``) for the run: the sources' ``next_batch``, the compiled parsing and
routing into one item per key group, the key groups' ``on_batch`` (which writes their answers' JSON;
and the timer calls Bytewax makes of a bounded flow's shards: ``notify_at`` after each
call, ``on_notify``, ``snapshot``), the dead letters' JSON, the sinks' ``write_batch``.
What is left of the worker's CPU is Bytewax's own (its operators, the items between them)
and what the wrapped steps do not cover; the cyclic GC's time is counted apart
(``gc.callbacks``; it also falls inside the steps). Each repeat runs the service and
then the ``shape`` rung on the same input, so the two columns compare. A timer costs two
``thread_time`` calls a step's call, small beside the events a shard call brings
(bench/RESULTS.md, "Figures behind the code").
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import os
import statistics
import sys
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from flow_kafka import Broker, Counter, broker, log  # noqa: E402
from flow_plan import registry_toml  # noqa: E402
from flow_report import machine_info  # noqa: E402
from flow_throughput import _EchoShard, prepare_input, run_once, run_rung  # noqa: E402

from flows.service import dataflow  # noqa: E402
from flows.service.connectors import kafka_partition, kafka_sink  # noqa: E402
from flows.service.instances.registry import Registry  # noqa: E402
from flows.service.runtime.gc_freezer import freeze_long_lived  # noqa: E402
from flows.service.shards import deadlines, group_logic  # noqa: E402

#: (label, owner, attribute): the steps timed. The dataflow's functions are looked up when
#: a flow is built, so a wrapper set before ``run_once`` builds it is the one called.
STEPS = (
    ("Kafka sources: next_batch", kafka_partition.ObservedPartition, "next_batch"),
    ("parse and route by key group and shard (compiled)", dataflow, "parse_and_route"),
    ("shards: on_batch", group_logic.GroupLogic, "on_batch"),
    ("shards: on_batch", _EchoShard, "on_batch"),
    ("shards: notify_at, on_notify, snapshot", group_logic.GroupLogic, "notify_at"),
    ("shards: notify_at, on_notify, snapshot", group_logic.GroupLogic, "on_notify"),
    ("shards: notify_at, on_notify, snapshot", group_logic.GroupLogic, "snapshot"),
    ("dead letters' JSON", dataflow, "_letters_json"),
    ("wake-up source: next_batch", deadlines._WakeUps, "next_batch"),
    ("Kafka sinks: write_batch, snapshot", kafka_sink._CheckedPartition, "write_batch"),
    ("Kafka sinks: write_batch, snapshot", kafka_sink._CheckedPartition, "snapshot"),
)
GC = "cyclic GC (also inside the steps)"
REST = "the rest: Bytewax's operators and items"
MODES = {"events": "combined events topic", "separate": "requests + feedback topics"}


@contextlib.contextmanager
def timed_steps(spent: Tally) -> Iterator[None]:
    """Every step of ``STEPS`` adds its thread CPU seconds to ``spent[label]``, and the
    GC to ``spent[GC]``, until the block ends (the originals are put back)."""
    saved = [(owner, name, getattr(owner, name)) for _, owner, name in STEPS]
    for (label, owner, name), (_, _, original) in zip(STEPS, saved, strict=True):
        setattr(owner, name, _timer(label, original, spent))
    started: list[float] = []

    def on_gc(phase: str, _info: dict) -> None:
        if phase == "start":
            started.append(time.thread_time())
        elif started:
            spent[GC] += time.thread_time() - started.pop()

    gc.callbacks.append(on_gc)
    try:
        yield
    finally:
        gc.callbacks.remove(on_gc)
        for owner, name, original in saved:
            setattr(owner, name, original)


def _timer(label: str, fn: Callable, spent: Tally) -> Callable:
    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[label] += time.thread_time() - t0

    return timed


def split_run(run: Callable[[], dict[str, Any]], events: int) -> dict[str, float]:
    """us of worker CPU an event per step of one run, ``REST`` the worker's remainder,
    ``"worker"`` its total and ``"events_per_s"`` the run's steady rate."""
    spent: Tally = Tally()
    with timed_steps(spent):
        result = run()
    worker = result.get("worker_us_per_event")
    if worker is None:  # run_once's figures
        worker = result["worker_thread_cpu"] * result["seconds"] / events * 1e6
    figures = {label: seconds / events * 1e6 for label, seconds in spent.items()}
    steps = sum(us for label, us in figures.items() if label != GC)
    figures[REST] = worker - steps
    figures["worker"] = worker
    figures["events_per_s"] = result["steady_events_per_s"]
    return figures


def measure(requests: int, units: int, repeats: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The figures per mode and flow (medians, and every run), and the machine."""
    freeze_long_lived()  # the service process's GC settings, as bench_flow
    registry = Registry.from_toml(registry_toml())
    out: dict[str, Any] = {}
    with broker() as bk:
        machine = machine_info(bk)
        counter = Counter(bk.bootstrap)
        try:
            for mode in MODES:
                out[mode] = mode_figures(bk, registry, counter, mode, requests, units, repeats)
        finally:
            counter.close()
    machine["load_average_at_end"] = os.getloadavg()
    return out, machine


def mode_figures(
    bk: Broker,
    registry: Registry,
    counter: Counter,
    mode: str,
    requests: int,
    units: int,
    repeats: int,
) -> dict[str, Any]:
    """One mode's medians per flow (and its runs): the service and the shape rung
    alternating on the same input, after a warm-up run of the service."""
    inp = prepare_input(bk, mode, requests, units)
    runs: dict[str, list[dict[str, float]]] = {"service": [], "shape": []}
    run_once(bk, registry, inp, counter)  # warm-up: imports, the broker's caches
    for k in range(repeats):
        service = split_run(lambda: run_once(bk, registry, inp, counter), inp.events)
        shape = split_run(lambda: run_rung(bk, inp, counter, "shape"), inp.events)
        runs["service"].append(service)
        runs["shape"].append(shape)
        log(
            f"  {mode} repeat {k + 1}: service {service['worker']:.1f} us an event "
            f"({service['events_per_s']:,.0f} events/s), shape {shape['worker']:.1f}"
        )
    medians: dict[str, Any] = {
        flow: {
            label: statistics.median(r.get(label, 0.0) for r in rs)
            for label in {label for r in rs for label in r}
        }
        for flow, rs in runs.items()
    }
    medians["runs"] = runs
    return medians


def report(figures: dict[str, Any], requests: int, repeats: int) -> str:
    order = [*dict.fromkeys(label for label, _, _ in STEPS), REST, GC]
    lines = [
        f"Worker thread CPU, us an event ({requests:,} requests and their feedback; "
        f"medians of {repeats} repeats, the service and the shape rung alternating)",
        "",
    ]
    for mode, label in MODES.items():
        service, shape = figures[mode]["service"], figures[mode]["shape"]
        lines += [
            f"{label}: service {service['worker']:.1f} us an event "
            f"({service['events_per_s']:,.0f} events/s), shape {shape['worker']:.1f} "
            f"({shape['events_per_s']:,.0f})",
            "",
            "| Step | service | shape |",
            "|---|---:|---:|",
        ]
        for step in order:
            lines.append(f"| {step} | {service.get(step, 0.0):.2f} | {shape.get(step, 0.0):.2f} |")
        lines.append(f"| **worker, all** | {service['worker']:.2f} | {shape['worker']:.2f} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--requests", type=int, default=150_000, help="requests per mode")
    parser.add_argument("--units", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "steps_results.json")
    args = parser.parse_args()
    figures, machine = measure(args.requests, args.units, args.repeats)
    print(report(figures, args.requests, args.repeats))
    args.out.write_text(json.dumps({"figures": figures, "machine": machine}, indent=2) + "\n")
    log(f"raw results written to {args.out}")


if __name__ == "__main__":
    main()
