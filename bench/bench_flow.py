"""End-to-end benchmark of the streaming service on a real Kafka broker.

Run from the repository root::

    .venv/bin/python bench/bench_flow.py                # full run (~15 min)
    .venv/bin/python bench/bench_flow.py --quick        # smoke run (< 3 min)
    .venv/bin/python bench/bench_flow.py --only throughput --requests 20000 --repeats 1
    .venv/bin/python bench/bench_flow.py --out bench/flow_results.json

It prints a Markdown report to stdout (progress goes to stderr) and writes every raw number
to the JSON file given by ``--out`` (default ``bench/flow_results.json``). ``--requests``,
``--repeats``, ``--latency-seconds``, ``--latency-rounds`` and ``--memory-stages`` shrink a
part for a short check; the report's command line names them.

Broker: ``$KAFKA_BOOTSTRAP_SERVERS`` when set, otherwise the project's single-node broker
(``deploy/kafka``), started into a temp dir and stopped at the end (``flow_kafka.py``).
Every run uses fresh topics and a fresh consumer group; requests, feedback and selection
topics have 3 partitions, the dead-letter topic 1. The workload is one per-unit experiment
with 10 arms (``per_unit = true``); messages are keyed by instance id (``experiment +
"\\x1f" + unit``). One process, one worker. The C-level reference needs ``kcat`` (``make
bench-flow`` installs it).

What each figure means
----------------------
* Throughput: N requests over ``units`` units and their N feedback events are produced
  first (separate ``requests``/``feedback`` topics, or one combined ``events`` topic where
  each request is followed by its feedback). Every measure is steady events/s: 2N / the
  time from its first answer to its last (their Kafka timestamps), so a start (process,
  partitions, consumers) and an end (EOF) are left out alike. In each repeat, every
  reference and every setup runs once, in turn; the report gives the median of every
  run (none dropped) with min - max, and each setup's ratio to the references of as many
  Kafka hops, the median of the repeats' ratios. The setups: ``tsi run --recovery-dir
  DIR`` in tail mode (the headline: recovery on, a snapshot every 10 s, the default
  two-topic setup with its internal topic, or the events topic); ``python -m bytewax.run
  flows.service.main:flow`` (no recovery), the same; ``run_main`` of
  ``Service(...).flow(tail=False)`` in this process (bounded, no recovery: two topics read
  directly, no internal topic), with its CPU: the worker thread's (``time.thread_time``),
  the process's (plus the librdkafka threads) and the broker's, each as a share of one
  core; and the ladder's rungs (``stack_flow``, ``shape_flow``). The references do the
  service's work, pipelined (``flow_references.py``): every input event consumed, one
  answer per request written; Python (confluent-kafka, one thread) and C (kcat), one hop,
  and two hops through an internal topic with both stages at once.
* Decision latency, open loop (``open_loop.py``): the service runs in a background
  process (``tsi run``, ``python -m bytewax.run flows.service.main:flow`` or, for
  sub-second epochs, ``bench/flow_helpers.py serve``, tail mode). This process sends the
  requests on a schedule, request k due at t0 + k / rate (one producer, ``linger.ms=0``;
  one late is sent at once, none skipped), and a consumer thread reads the selections
  topic; latency = the time the selection is consumed - the request's intended send
  time, matched by ``request_id``, so the sender's own stalls count. The first seconds
  at the target rate (with the feedback, in configurations that send it) are a warm-up
  and are not counted. A request not answered within the drain time counts as infinitely
  slow. The configurations of the plan's rounds run several times, one of each a round;
  the figures are medians over the runs.
* Memory: the service runs in a background process (``tsi run --recovery-dir DIR``, the
  configuration users run: recovery and its changelog on, epoch 10 s; with
  ``--memory-no-recovery`` ``python -m bytewax.run flows.service.main:flow``). After
  100 warm-up instances its RSS is the baseline; then new units arrive in cumulative
  stages and, once the selections topic holds every answer, the RSS is read again at
  rest, 12 s later (psutil), and the peak (VmHWM). Bytes
  per instance = (RSS - baseline) / instances at rest and (VmHWM - baseline) / instances
  at the peak, per stage, and the least-squares slope of the resting RSS over the stages.
  Two states: "open ticket" (one request per unit, no feedback: the selection waits for
  its feedback for the experiment's ``feedback_ttl``, 3600 s) and "idle" (request then
  feedback on the combined events topic, ``feedback_ttl`` = 1 s, RSS read after the
  settled answers have expired, so each instance is only its bandit state). Two
  decompositions: tracemalloc of the Python objects of one ``Instance`` in three states
  (in this process), and Bytewax's own RSS per key for a logic that keeps nothing
  (``bench/flow_helpers.py floor``, fresh process).
* Profile: cProfile around ``run_main`` of the separate-topics throughput run; the own time
  (tottime) of every function is put into a group by file; built-ins and generated code
  (``<string>``: dataclass ``__init__``) go to the group of their callers, in proportion.

Targets (from the issue) are printed beside the results as PASS/MISS; nothing is asserted.

Its parts, one module each beside this one (other benchmarks reuse them): ``flow_plan.py``
(the plans and configurations), ``flow_workload.py`` (keys and messages),
``flow_service.py`` (a background service: start, watch, stop, wait), ``flow_load.py``
(open-loop requests, selections read back), ``flow_throughput.py``, ``flow_profile.py``,
``flow_latency.py``, ``flow_memory.py`` and ``flow_report.py`` (the Markdown report).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from flows.service.instances.registry import Registry

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the modules beside this one
import flow_references
from flow_kafka import log
from flow_latency import latency
from flow_memory import memory
from flow_plan import DIAGNOSTIC_LATENCY, FULL, QUICK, ROOT, Plan, registry_toml
from flow_profile import profile
from flow_report import machine_info, report
from flow_service import bench_session
from flow_throughput import Input, throughput


def section(results: dict[str, Any], name: str, fn: Callable[[], Any]) -> Any:
    """Run one part of the benchmark; a failure is reported, the others still run."""
    try:
        value = fn()
    except Exception:
        log(f"{name} FAILED")
        results.setdefault("errors", {})[name] = traceback.format_exc()
        return None
    results[name] = value
    return value


def jsonable(x: Any) -> Any:
    if isinstance(x, Input):
        return {"mode": x.mode, "topics": x.topics, "events": x.events}
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [jsonable(v) for v in x]
    return x


SECTIONS = ("throughput", "latency", "memory")


def chosen_plan(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[Plan, set[str], str]:
    """The plan the options ask for, the parts to run, and the command that repeats it
    (a bad option: ``parser.error``)."""
    only = set(args.only.split(","))
    if not only or only - set(SECTIONS):
        parser.error(f"--only takes parts of {','.join(SECTIONS)}, got {args.only!r}")
    plan = QUICK if args.quick else FULL
    if args.latency_configs:
        pool = (*plan.latency_configs, *plan.latency_once, *DIAGNOSTIC_LATENCY)
        chosen = tuple(dict.fromkeys(c for c in pool if args.latency_configs in c.name))
        if not chosen:
            names = ", ".join(repr(c.name) for c in pool)
            parser.error(
                f"no latency configuration's name contains {args.latency_configs!r}: {names}"
            )
        plan = replace(plan, latency_configs=chosen, latency_once=())
    overrides = {
        "requests": args.requests,
        "repeats": args.repeats,
        "latency_seconds": args.latency_seconds,
        "latency_rounds": args.latency_rounds,
    }
    for name, value in overrides.items():
        if value is not None:
            plan = replace(plan, **{name: value})
    if args.memory_stages:
        stages = tuple(int(x) for x in args.memory_stages.split(","))
        plan = replace(plan, memory_stages=stages, idle_stages=stages, seasoned_stages=stages[:1])
    if args.memory_no_recovery:
        plan = replace(plan, memory_recovery=False)
    command = "python bench/bench_flow.py" + (" --quick" if args.quick else "")
    if only != set(SECTIONS):
        command += f" --only {','.join(p for p in SECTIONS if p in only)}"
    if args.latency_configs:
        command += f" --latency-configs {args.latency_configs!r}"
    for name, value in (*overrides.items(), ("memory_stages", args.memory_stages)):
        if value is not None:
            command += f" --{name.replace('_', '-')} {value}"
    if args.memory_no_recovery:
        command += " --memory-no-recovery"
    return plan, only, command


def parsed_args() -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The command line's parser and what it read."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (< 2 minutes)")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "flow_results.json", help="JSON results"
    )
    parser.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help=f"comma-separated parts to run, of {','.join(SECTIONS)} (default: all)",
    )
    parser.add_argument(
        "--latency-configs",
        metavar="TEXT",
        help="run only the latency configurations whose name contains TEXT",
    )
    parser.add_argument(
        "--memory-no-recovery",
        action="store_true",
        help="memory runs without recovery (python -m bytewax.run), not tsi run --recovery-dir",
    )
    for name, kind, text in (
        ("--requests", int, "N requests (and N feedback) per throughput run"),
        ("--repeats", int, "throughput repeats"),
        ("--latency-seconds", float, "measured seconds of each latency run"),
        ("--latency-rounds", int, "runs of each latency configuration run in rounds"),
        (
            "--memory-stages",
            str,
            "cumulative instances of the memory runs, e.g. 30000,100000 (seasoned: the first)",
        ),
    ):
        parser.add_argument(name, type=kind, help=f"{text} (default: the plan's)")
    return parser, parser.parse_args()


def main() -> None:
    parser, args = parsed_args()
    plan, only, command = chosen_plan(parser, args)
    if "throughput" in only:
        try:
            flow_references.kcat_path()
        except RuntimeError as err:
            parser.error(str(err))
    t0 = time.perf_counter()
    results: dict[str, Any] = {"plan": asdict(plan), "command": command}
    registry = Registry.from_toml(registry_toml())
    with bench_session() as (bk, workdir, registry_path, counter):
        results["machine"] = machine_info(bk)
        if "throughput" in only:
            tp = section(
                results, "throughput", lambda: throughput(bk, plan, registry, counter, workdir)
            )
            if tp:
                inp, unprofiled = tp["separate"]["input"], tp["separate"]["seconds"]
                section(results, "profile", lambda: profile(bk, registry, inp, counter, unprofiled))
        if "latency" in only:
            section(results, "latency", lambda: latency(bk, plan, registry_path, workdir))
        if "memory" in only:
            section(results, "memory", lambda: memory(bk, plan, counter, workdir))
    results["wall_seconds"] = time.perf_counter() - t0
    results["load_average_at_end"] = os.getloadavg()
    text = report(results)
    print(text)
    args.out.write_text(json.dumps(jsonable(results), indent=2) + "\n")
    log(f"raw results written to {args.out}")


if __name__ == "__main__":
    main()
