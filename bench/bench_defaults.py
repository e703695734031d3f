"""The configuration users get, measured against the same work done without the service.

Run from the repository root (about 25 minutes; ``--quick``: about 5)::

    .venv/bin/python bench/bench_defaults.py
    .venv/bin/python bench/bench_defaults.py --quick

Every service run is ``tsi run --recovery-dir DIR`` with nothing else changed: the topics
``tsi topics create`` makes (3 partitions an input topic, the internal topic and the
changelog named from the consumer group, 128 shards), recovery and the changelog on. Each
run has its own group (so its own changelog and internal topic) and recovery directory;
its consumers start from the beginning of the inputs (``auto.offset.reset = earliest``, the
one setting given: the inputs are produced before the service starts).

Throughput, on both topologies (two topics through the internal topic; one events topic),
``--repeats`` rounds, each round every measure once, in turn:

* ``reference``: the Python passthrough of as many Kafka hops (``flow_references``: every
  input consumed, one answer per request written, pipelined, the service's producer
  settings);
* ``defaults``: ``tsi run --recovery-dir DIR``;
* ``no_changelog``: the same with ``--no-changelog`` (its topics made with it too);
* ``shards_32``: the same with ``--shards 32`` (its changelog made with 32 partitions): what
  the default 128 shards cost per event against 32.

Each gives its steady events/s (input events / the time from its first answer to its last,
their Kafka timestamps), and each service run its fixed cost (seconds from the process's
start to its first answer) and CPU-seconds (all of them, and those spent from its first
answer on: serving, without the start's). Ratios are taken within a round; the report
gives the median of every round (none dropped) with min - max.

Latency, open loop (``open_loop``): 2,000 requests/s, each with its feedback 0.5 s later,
spread over 10^3 users and over 10^5 users (each of those a new instance: the load brings
them), ``--latency-rounds`` rounds, each round the two-hop Python passthrough (the reference,
``flow_helpers.py passthrough 2``) and the defaults on each user count, in turn. Latency =
the time the answer is consumed - the request's intended send time.

Targets (``TARGETS``: throughput against the reference and against ``no_changelog``, the
fixed cost, the p99) are the project's, named under the report; nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import open_loop
from flow_kafka import Broker, Counter, answer_times, broker, bulk_producer, log, produce_all
from flow_latency import latency_run as flow_latency_run
from flow_load import RequestSender, SelectionReader, measure_open_loop
from flow_plan import PASSTHROUGH_TWO_HOPS, QUICK, RUN_RECOVERY_FEEDBACK, Plan, registry_toml
from flow_service import check_alive, stop_process
from flow_throughput import Input, run_reference
from flow_workload import workload

ROOT = Path(__file__).resolve().parents[1]
TSI = [sys.executable, "-m", "flows.cli"]
TARGETS = {"reference": 0.8, "no_changelog": 0.9, "fixed_s": 2.0, "p99_ms": 20.0}
MODES = {"two topics": ("requests", "feedback"), "events topic": ("events",)}
SETUPS = {"defaults": (), "no_changelog": ("--no-changelog",), "shards_32": ("--shards", "32")}


def new_names(kinds: tuple[str, ...]) -> dict[str, str]:
    """Fresh topic names, by kind."""
    tag = uuid.uuid4().hex[:10]
    return {kind: f"bench-{kind}-{tag}" for kind in kinds}


def topic_options(topics: dict[str, str]) -> list[str]:
    """The ``tsi`` options naming ``topics`` (inputs, selections, dead letters)."""
    flags = {
        "requests": "--requests-topic",
        "feedback": "--feedback-topic",
        "events": "--events-topic",
        "sel": "--selections-topic",
        "dlq": "--dlq-topic",
    }
    return [part for kind, name in topics.items() for part in (flags[kind], name)]


def create_topics(bk: Broker, topics: dict[str, str], group: str, extra: tuple[str, ...]) -> None:
    """``tsi topics create`` for ``topics`` and ``group``'s own (with ``extra`` options)."""
    command = [*TSI, "topics", "create", "--brokers", bk.bootstrap, "--group-id", group]
    subprocess.run([*command, *topic_options(topics), *extra], check=True, capture_output=True)


@contextlib.contextmanager
def service(
    bk: Broker, topics: dict[str, str], extra: tuple[str, ...], workdir: Path, registry: Path
) -> Iterator[tuple[subprocess.Popen, Path, float]]:
    """``tsi run --recovery-dir DIR`` (plus ``extra``) on ``topics`` with a group, topics and
    directory of its own: (process, its log, its start time), stopped at the end."""
    group = f"bench-{uuid.uuid4().hex[:10]}"
    create_topics(bk, topics, group, extra)
    config = workdir / f"{group}.kafka.toml"
    config.write_text('[kafka.consumer]\nauto.offset.reset = "earliest"\n')
    logfile = workdir / f"{group}.log"
    args = [*TSI, "run", "--brokers", bk.bootstrap, "--registry", str(registry),
            "--group-id", group, "--recovery-dir", str(workdir / f"{group}.recovery"),
            "--kafka-config", str(config), *topic_options(topics), *extra]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TSI_", "KAFKA_"))}
    with open(logfile, "ab") as out:
        started = time.time()
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc, logfile, started
    finally:
        stop_process(proc, 30)


def service_run(
    bk: Broker, inp: Input, extra: tuple[str, ...], counter: Counter, workdir: Path
) -> dict[str, float]:
    """One service run over ``inp`` to its last answer: steady events/s, fixed cost, CPU."""
    out = new_names(("sel", "dlq"))
    requests = inp.events // 2
    with service(bk, {**inp.topics, **out}, extra, workdir, workdir / "registry.toml") as (
        proc,
        logfile,
        started,
    ):
        deadline, serving_from = time.monotonic() + 600, None
        while (answered := counter.count(out["sel"])) < requests:
            check_alive(proc, logfile)
            if time.monotonic() > deadline:
                raise TimeoutError(f"answered {answered} of {requests}")
            if answered and serving_from is None:
                serving_from = cpu_seconds(proc.pid)
            time.sleep(0.2)
        cpu = cpu_seconds(proc.pid)
    first, last = answer_times(bk.bootstrap, out["sel"], requests)
    dead = counter.count(out["dlq"])
    return {
        "events_per_s": inp.events / (last - first),
        "fixed_s": first - started,
        "cpu_s": cpu,
        "serving_cpu_s": cpu - (serving_from or 0.0),
        "dead_letters": dead,
    }


def cpu_seconds(pid: int) -> float:
    """CPU-seconds of process ``pid`` and its children so far."""
    process = psutil.Process(pid)
    return sum(sum(p.cpu_times()[:2]) for p in [process, *process.children(recursive=True)])


def reference_run(bk: Broker, inp: Input, counter: Counter, hops: int) -> float:
    """The Python passthrough's steady events/s over ``inp`` (``hops`` Kafka hops)."""
    return run_reference(bk, inp, counter, "python", hops)


def throughput(bk: Broker, args: argparse.Namespace, counter: Counter, workdir: Path) -> dict:
    """Every round of both topologies: each measure's runs, and the ratios of each round."""
    results: dict[str, Any] = {}
    for mode, kinds in MODES.items():
        inputs = new_names(kinds)
        create_topics(bk, inputs, f"bench-inputs-{uuid.uuid4().hex[:6]}", ("--no-changelog",))
        t0 = time.perf_counter()
        events = produce_all(
            bulk_producer(bk.bootstrap), workload(inputs, args.requests, args.units)
        )
        log(f"{mode}: {events:,} events produced in {time.perf_counter() - t0:.1f} s")
        inp = Input("events" if mode == "events topic" else "separate", inputs, events)
        rounds = []
        for k in range(args.repeats):
            hops = 2 if mode == "two topics" else 1  # through the internal topic: two
            run = {"reference": {"events_per_s": reference_run(bk, inp, counter, hops)}}
            for name, extra in SETUPS.items():
                run[name] = service_run(bk, inp, extra, counter, workdir)
            run["ratios"] = {
                "reference": run["defaults"]["events_per_s"] / run["reference"]["events_per_s"],
                "no_changelog": run["defaults"]["events_per_s"]
                / run["no_changelog"]["events_per_s"],
                "cpu_per_event_vs_32": run["defaults"]["serving_cpu_s"]
                / run["shards_32"]["serving_cpu_s"],
            }
            log(f"{mode}, round {k + 1}: " + json.dumps(run))
            rounds.append(run)
        results[mode] = rounds
    return results


def latency_run(
    bk: Broker, plan: Plan, workdir: Path, registry: Path, extra: tuple[str, ...] = ()
) -> dict[str, Any]:
    """One open-loop run of the defaults (two topics; plus ``extra`` options), as
    ``flow_latency.latency_run`` runs its configurations: ready first (a probe answered),
    then the plan's schedule."""
    topics = new_names(("requests", "feedback", "sel", "dlq"))
    reader = SelectionReader(bk.bootstrap, topics["sel"])
    sender = RequestSender(bk.bootstrap, topics)
    cfg = replace(RUN_RECOVERY_FEEDBACK, name="tsi run --recovery-dir DIR (defaults)")
    try:
        with service(bk, topics, extra, workdir, registry) as (proc, logfile, _):
            t0, ready_s, _, measured = measure_open_loop(plan, cfg, sender, reader, proc, logfile)
    finally:
        reader.close()
    received = dict(reader.received)
    return {
        "ready_s": ready_s,
        **open_loop.figures(measured, sender.intended, sender.sent, received, 50.0),
        "timeline": open_loop.timeline(measured, sender.intended, received, t0),
    }


def latency(bk: Broker, args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    """Rounds of: the two-hop passthrough, then the defaults with 10^3 and 10^5 users."""
    registry = workdir / "registry.toml"
    base = replace(QUICK, latency_seconds=args.latency_seconds, latency_warmup_seconds=2.0)
    log("latency: a warm-up run of the broker (not reported)")
    flow_latency_run(bk, base, PASSTHROUGH_TWO_HOPS, registry, workdir)
    out = []
    for k in range(args.latency_rounds):
        ref = flow_latency_run(bk, base, PASSTHROUGH_TWO_HOPS, registry, workdir)
        out.append({"round": k + 1, "what": "reference", "users": base.units, **_figures(ref)})
        for users in (1_000, 100_000):
            r = latency_run(bk, replace(base, units=users), workdir, registry)
            out.append({"round": k + 1, "what": "defaults", "users": users, **_figures(r)})
            log(f"latency round {k + 1}: {users} users p99 {r['p99_ms']:.1f} ms, "
                f"reference p99 {ref['p99_ms']:.1f} ms")  # fmt: skip
    return out


def _figures(run: dict[str, Any]) -> dict[str, Any]:
    keys = ("p50_ms", "p99_ms", "p999_ms", "max_ms", "sent", "answered", "timeline")
    return {key: run[key] for key in keys if key in run}


def spread(values: list[float]) -> str:
    """``median (min - max)`` of every run."""
    return f"{statistics.median(values):.2f} ({min(values):.2f} - {max(values):.2f})"


def report(results: dict[str, Any]) -> str:
    """The Markdown report: throughput, fixed cost and CPU by topology; latency by users."""
    t = TARGETS
    lines = [
        f"`{results['command']}`; {results['machine']}",
        "",
        f"Targets: defaults >= {t['reference']} of the reference and >= {t['no_changelog']} of "
        f"--no-changelog, fixed cost <= {t['fixed_s']} s, p99 <= {t['p99_ms']} ms.",
        "",
    ]
    if tp := results.get("throughput"):
        lines += [
            "| topology | defaults / reference | defaults / --no-changelog | defaults events/s "
            "| reference events/s | fixed cost: defaults; --no-changelog (s) "
            "| CPU-s: defaults; --no-changelog; --shards 32 | serving CPU defaults / --shards 32 |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for mode, rounds in tp.items():

            def col(setup: str, key: str, rounds: list = rounds) -> list[float]:
                return [r[setup][key] for r in rounds]

            lines.append(
                f"| {mode} | {spread([r['ratios']['reference'] for r in rounds])} "
                f"| {spread([r['ratios']['no_changelog'] for r in rounds])} "
                f"| {spread(col('defaults', 'events_per_s'))} "
                f"| {spread(col('reference', 'events_per_s'))} "
                f"| {spread(col('defaults', 'fixed_s'))}; {spread(col('no_changelog', 'fixed_s'))} "
                f"| {spread(col('defaults', 'cpu_s'))}; {spread(col('no_changelog', 'cpu_s'))}; "
                f"{spread(col('shards_32', 'cpu_s'))} "
                f"| {spread([r['ratios']['cpu_per_event_vs_32'] for r in rounds])} |"
            )
    if lat := results.get("latency"):
        lines += ["", "| latency, 2,000 requests/s | users | p50 ms | p99 ms | answered |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for what, users in sorted({(r["what"], r["users"]) for r in lat}):
            runs = [r for r in lat if (r["what"], r["users"]) == (what, users)]
            answered = sum(r["answered"] for r in runs), sum(r["sent"] for r in runs)
            lines.append(
                f"| {what} | {users:,} | {spread([r['p50_ms'] for r in runs])} "
                f"| {spread([r['p99_ms'] for r in runs])} | {answered[0]:,} of {answered[1]:,} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="a short check (~5 minutes)")
    parser.add_argument("--requests", type=int, help="requests per throughput run (100,000)")
    parser.add_argument("--units", type=int, default=10_000, help="users of the throughput runs")
    parser.add_argument("--repeats", type=int, help="throughput rounds (3)")
    parser.add_argument("--latency-rounds", type=int, help="latency rounds (3)")
    parser.add_argument("--latency-seconds", type=float, help="measured seconds a run (20)")
    parser.add_argument("--only", choices=("throughput", "latency"), help="one part only")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "defaults_results.json")
    args = parser.parse_args()
    quick = {"requests": 20_000, "repeats": 1, "latency_rounds": 1, "latency_seconds": 5.0}
    full = {"requests": 100_000, "repeats": 3, "latency_rounds": 3, "latency_seconds": 20.0}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    flags = " ".join(f"--{k.replace('_', '-')} {getattr(args, k)}" for k in full)
    command = f"python bench/bench_defaults.py {flags}" + (
        f" --only {args.only}" if args.only else ""
    )
    results: dict[str, Any] = {
        "command": command,
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    with tempfile.TemporaryDirectory(prefix="tsi-defaults-") as tmp, broker() as bk:
        workdir = Path(tmp)
        (workdir / "registry.toml").write_text(registry_toml())
        cpu = platform.processor() or platform.machine()
        load = os.getloadavg()[0]
        results["machine"] = f"{cpu}, {os.cpu_count()} cores, load at start {load:.2f}"
        counter = Counter(bk.bootstrap)
        try:
            if args.only in (None, "throughput"):
                results["throughput"] = throughput(bk, args, counter, workdir)
            if args.only in (None, "latency"):
                results["latency"] = latency(bk, args, workdir)
        finally:
            counter.close()
    results["load_at_end"] = os.getloadavg()
    print(report(results))
    args.out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    log(f"raw results written to {args.out}")


if __name__ == "__main__":
    main()
