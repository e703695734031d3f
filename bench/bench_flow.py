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
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import os
import platform
import pstats
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import tracemalloc
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import bytewax
import bytewax.operators as op
import confluent_kafka
import numpy as np
import orjson
import psutil
from bytewax.dataflow import Dataflow
from bytewax.operators import StatefulBatchLogic
from bytewax.testing import run_main
from confluent_kafka import Producer

from flows.service.connectors.kafka import kafka_wiring
from flows.service.connectors.topics import Topics
from flows.service.dataflow import PARSERS, Guards, parse_route
from flows.service.instances.instance import Instance
from flows.service.instances.registry import LiveRegistry, Registry
from flows.service.runtime.gc_freezer import freeze_long_lived
from flows.service.runtime.process import Service
from flows.service.shards.logic import Routed
from flows.service.wire.events import Origin, Request, parse_feedback, parse_request
from flows.testing import kafka_broker

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the modules beside this one
import flow_references
import open_loop
from flow_kafka import (
    Broker,
    Counter,
    answer_times,
    broker,
    bulk_producer,
    log,
    new_topics,
    produce_all,
    topic_reader,
)

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = "bench"
N_ARMS = 10
WARM_UNITS = 100  # warm-up requests of the memory run
# the targets: steady throughput against the same-work Python reference of the same run,
# open-loop p99 at 2,000 requests/s with feedback (recovery on), bytes per 10-arm
# instance at 10^6 by state (at the peak)
TARGET_REFERENCE_RATIO = 0.8
TARGET_P99_MS = 20.0
SLOW_MS = 50.0  # the share of answers slower than this is reported too
TARGET_BYTES_PER_INSTANCE = {"open_tickets": 400, "idle": 250}


def registry_toml(feedback_ttl: float = 3600.0) -> str:
    arms = ", ".join(f'"arm{i}"' for i in range(N_ARMS))
    return (
        f"[experiments.{EXPERIMENT}]\narms = [{arms}]\nper_unit = true\nseed = 7\n"
        f"feedback_ttl = {feedback_ttl}\n"
    )


# ------------------------------------------------------------------------------ plan


@dataclass(frozen=True)
class LatencyConfig:
    name: str
    server: tuple[str, ...]  # arguments after the Python executable
    epoch: str
    feedback: bool = False
    events: bool = False  # requests and feedback on the combined events topic (one hop)


@dataclass(frozen=True)
class Plan:
    mode: str
    requests: int  # N: throughput runs have 2N events
    units: int
    repeats: int
    short_epoch_ms: float | None  # extra throughput run with a short epoch (None: skip)
    latency_rate: float
    latency_seconds: float
    latency_warmup_seconds: float
    latency_rounds: int  # runs of each of latency_configs, one of each a round
    latency_configs: tuple[LatencyConfig, ...]
    latency_once: tuple[LatencyConfig, ...]  # run once each, after the rounds
    memory_stages: tuple[int, ...]  # cumulative numbers of instances, open tickets
    idle_stages: tuple[int, ...]  # the same, idle instances
    # the memory runs' service: ``tsi run --recovery-dir DIR`` (what users run: recovery
    # and its changelog on), else ``python -m bytewax.run`` without recovery
    memory_recovery: bool = True


RUN_DEFAULT = LatencyConfig(
    "python -m bytewax.run flows.service.main:flow",
    ("-m", "bytewax.run", "flows.service.main:flow"),
    "10 s",
)
RUN_S1 = LatencyConfig(
    "python -m bytewax.run flows.service.main:flow -s 1",
    ("-m", "bytewax.run", "flows.service.main:flow", "-s", "1"),
    "1 s",
)
HELPERS = str(ROOT / "bench" / "flow_helpers.py")
SERVER_100MS = LatencyConfig("bench/flow_helpers.py serve 100", (HELPERS, "serve", "100"), "100 ms")
SERVER_10MS = LatencyConfig("bench/flow_helpers.py serve 10", (HELPERS, "serve", "10"), "10 ms")
NO_SNAPSHOT = LatencyConfig(
    "diagnostic: serve 10000 --no-snapshot",
    (HELPERS, "serve", "10000", "--no-snapshot"),
    "10 s",
)
NO_SNAPSHOT_NO_GC = LatencyConfig(
    "diagnostic: serve 10000 --no-snapshot --no-gc",
    (HELPERS, "serve", "10000", "--no-snapshot", "--no-gc"),
    "10 s",
)
PASSTHROUGH_ONE_HOP = LatencyConfig(
    "reference: raw passthrough, one hop, + feedback",
    (HELPERS, "passthrough", "1"),
    "-",
    feedback=True,
)
PASSTHROUGH_TWO_HOPS = LatencyConfig(
    "reference: raw passthrough, two hops (the internal topic's), + feedback",
    (HELPERS, "passthrough", "2"),
    "-",
    feedback=True,
)
RUN_RECOVERY_FEEDBACK = LatencyConfig(
    "tsi run --recovery-dir DIR (recovery on), + feedback",
    ("-m", "flows.cli", "run", "--recovery-dir", "{recovery}"),
    "10 s",
    feedback=True,
)
RUN_RECOVERY_S1_FEEDBACK = LatencyConfig(
    "tsi run --recovery-dir DIR --snapshot-every 1, + feedback",
    ("-m", "flows.cli", "run", "--recovery-dir", "{recovery}", "--snapshot-every", "1"),
    "1 s",
    feedback=True,
)
# no epoch closes within the measured window: what recovery costs the calls, apart from
# the closes' pauses
RUN_RECOVERY_NO_CLOSE_FEEDBACK = LatencyConfig(
    "diagnostic: tsi run --recovery-dir DIR --snapshot-every 60 (no close measured), + feedback",
    ("-m", "flows.cli", "run", "--recovery-dir", "{recovery}", "--snapshot-every", "60"),
    "60 s",
    feedback=True,
)
RUN_DEFAULT_FEEDBACK = LatencyConfig(
    "python -m bytewax.run flows.service.main:flow, + feedback",
    RUN_DEFAULT.server,
    "10 s",
    feedback=True,
)
RUN_EVENTS_FEEDBACK = LatencyConfig(
    "python -m bytewax.run flows.service.main:flow, events topic, + feedback",
    RUN_DEFAULT.server,
    "10 s",
    feedback=True,
    events=True,
)
#: the configuration users run (a recovery directory, a snapshot every 10 s): the target's
HEADLINE_LATENCY = RUN_RECOVERY_FEEDBACK
RECOVERY_OFF_LATENCY = RUN_DEFAULT_FEEDBACK

FULL = Plan(
    mode="full",
    requests=100_000,
    units=10_000,
    repeats=5,
    short_epoch_ms=100.0,
    latency_rate=2000.0,
    latency_seconds=20.0,
    latency_warmup_seconds=2.0,
    latency_rounds=3,
    latency_configs=(HEADLINE_LATENCY, RECOVERY_OFF_LATENCY, PASSTHROUGH_TWO_HOPS),
    latency_once=(
        PASSTHROUGH_ONE_HOP,
        RUN_EVENTS_FEEDBACK,
        RUN_RECOVERY_S1_FEEDBACK,
        RUN_DEFAULT,
    ),
    memory_stages=(100_000, 300_000, 1_000_000),
    idle_stages=(100_000, 300_000, 1_000_000),
)
QUICK = Plan(
    mode="quick",
    requests=50_000,
    units=10_000,
    repeats=1,
    short_epoch_ms=None,
    latency_rate=2000.0,
    latency_seconds=8.0,
    latency_warmup_seconds=1.0,
    latency_rounds=1,
    latency_configs=(HEADLINE_LATENCY, RECOVERY_OFF_LATENCY),
    latency_once=(),
    memory_stages=(30_000, 100_000),
    idle_stages=(30_000, 100_000),
)
#: run only when named (``--latency-configs TEXT``): what an earlier tail was made of
DIAGNOSTIC_LATENCY = (
    RUN_S1,
    SERVER_100MS,
    SERVER_10MS,
    RUN_RECOVERY_NO_CLOSE_FEEDBACK,
    NO_SNAPSHOT,
    NO_SNAPSHOT_NO_GC,
)


# ------------------------------------------------------------------------------ workload


def instance_key(unit: str) -> str:
    return f"{EXPERIMENT}\x1f{unit}"


def request_value(unit: str, rid: str, typed: bool = False, ts: float | None = None) -> bytes:
    event: dict[str, Any] = {"experiment": EXPERIMENT, "unit": unit, "request_id": rid}
    if typed:
        event["type"] = "request"
    if ts is not None:
        event["ts"] = ts
    return orjson.dumps(event)


def feedback_value(unit: str, rid: str, loss: float, typed: bool = False) -> bytes:
    event: dict[str, Any] = {"experiment": EXPERIMENT, "unit": unit, "request_id": rid}
    if typed:
        event["type"] = "feedback"
    event["loss"] = loss
    return orjson.dumps(event)


def loss_of(i: int) -> float:
    return (i * 7919 % 1000) / 10.0  # any finite numbers: the algorithm needs no range


def workload(topics: dict[str, str], n: int, units: int) -> Iterator[tuple[str, str, bytes]]:
    """n requests then their n feedback events (separate topics), or request i followed by
    its feedback (the combined ``events`` topic)."""
    if "events" in topics:
        for i in range(n):
            unit, rid = f"u{i % units}", f"r{i}"
            key = instance_key(unit)
            yield topics["events"], key, request_value(unit, rid, typed=True)
            yield topics["events"], key, feedback_value(unit, rid, loss_of(i), typed=True)
        return
    for i in range(n):
        unit = f"u{i % units}"
        yield topics["requests"], instance_key(unit), request_value(unit, f"r{i}")
    for i in range(n):
        unit = f"u{i % units}"
        yield topics["feedback"], instance_key(unit), feedback_value(unit, f"r{i}", loss_of(i))


# ------------------------------------------------------------------------------ throughput


@dataclass
class Input:
    """Pre-produced input topics of one throughput mode."""

    mode: str  # "separate" or "events"
    topics: dict[str, str]
    events: int

    def service_topics(self, out: dict[str, str]) -> Topics:
        if self.mode == "events":
            return Topics(
                selections=out["sel"], dead_letters=out["dlq"], events=self.topics["events"]
            )
        return Topics(
            requests=self.topics["requests"],
            feedback=self.topics["feedback"],
            selections=out["sel"],
            dead_letters=out["dlq"],
        )


def prepare_input(bk: Broker, mode: str, n: int, units: int) -> Input:
    kinds = ("events",) if mode == "events" else ("requests", "feedback")
    topics = new_topics(bk.bootstrap, kinds)
    producer = bulk_producer(bk.bootstrap)
    t0 = time.perf_counter()
    events = produce_all(producer, workload(topics, n, units))
    log(f"  produced {events:,} {mode} events in {time.perf_counter() - t0:.1f} s")
    return Input(mode, topics, events)


def run_once(
    bk: Broker,
    registry: Registry,
    inp: Input,
    counter: Counter,
    epoch_ms: float | None = None,
    profiler: cProfile.Profile | None = None,
) -> dict[str, Any]:
    """One ``run_main`` of the Kafka flow from the start of ``inp`` to EOF."""
    out = new_topics(bk.bootstrap, ("sel", "dlq"))
    # without recovery the service starts from its group's offsets: a fresh group that
    # has none reads from the start ("earliest"; the service's own default is "latest")
    flow = Service(
        registry,
        [bk.bootstrap],
        inp.service_topics(out),
        consumer_config={"auto.offset.reset": "earliest"},
        group_id=f"bench-{uuid.uuid4().hex[:12]}",
    ).flow(tail=False, recovery=False)
    epoch = None if epoch_ms is None else timedelta(milliseconds=epoch_ms)
    broker0 = bk.cpu_seconds()
    usage0 = resource.getrusage(resource.RUSAGE_SELF)
    thread0 = time.thread_time()
    t0 = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    try:
        run_main(flow, epoch_interval=epoch)
    finally:
        if profiler is not None:
            profiler.disable()
    seconds = time.perf_counter() - t0
    thread = time.thread_time() - thread0
    usage1 = resource.getrusage(resource.RUSAGE_SELF)
    broker1 = bk.cpu_seconds()
    process = (usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime)
    requests = inp.events // 2
    selections = counter.count(out["sel"])
    dead = counter.count(out["dlq"], 1)
    if selections != requests or dead:
        log(f"  WARNING: {selections} selections for {requests} requests, {dead} dead letters")
    first, last = answer_times(bk.bootstrap, out["sel"], selections)
    return {
        "seconds": seconds,
        "events": inp.events,
        "events_per_s": inp.events / seconds,
        "steady_events_per_s": inp.events / (last - first),
        "worker_thread_cpu": thread / seconds,
        "process_cpu": process / seconds,
        "broker_cpu": None if broker0 is None or broker1 is None else (broker1 - broker0) / seconds,
        "selections": selections,
        "dead_letters": dead,
    }


def stack_flow(bk: Broker, inp: Input, out: dict[str, str]) -> Dataflow:
    """The first rung of the same-run ladder: what Bytewax and the service's connectors
    carry. The same batched sources and delivery-checked sink as the service, every
    message written back as it came: no parsing, no routing, no bandit."""
    wiring = kafka_wiring([bk.bootstrap], inp.service_topics(out), tail=False)
    flow = Dataflow("stack")
    outputs = []
    for name, source in wiring.inputs.sources.items():
        batches, _errors = source(flow, f"{name}_in")
        outputs.append(op.map(f"echo_{name}", batches, _echo_raw))
    wiring.outputs.selections("out", op.merge("all", *outputs))
    return flow


def _echo_raw(batch: list[tuple[bytes, Origin]]) -> list[tuple[None, bytes]]:
    return [(None, raw) for raw, _origin in batch]


class _EchoShard(StatefulBatchLogic):
    """A key group that keeps nothing: each request answered with its own bytes, feedback
    dropped (one output per request, as the service answers)."""

    def on_batch(self, values: list[list[tuple[str, list[Routed]]]]) -> tuple[list[list], bool]:
        out = [
            (key, event.raw)
            for item in values
            for _, batch in item
            for key, _, event in batch
            if isinstance(event, Request)
        ]
        return ([out] if out else []), StatefulBatchLogic.RETAIN

    def snapshot(self) -> None:
        return None


def shape_flow(bk: Broker, inp: Input, out: dict[str, str]) -> Dataflow:
    """The second rung: the service's shape with no state. The stack of ``stack_flow``
    plus the service's own compiled parsing and routing into one item per key group
    (``parse_and_route``) and Bytewax's keyed stateful step, whose shards keep nothing
    (``_EchoShard``). What the service spends beyond it is its shards' state: instances,
    tickets, draws, the kernel, deadlines, metrics."""
    live = LiveRegistry(Registry.from_toml(registry_toml()))
    wiring = kafka_wiring([bk.bootstrap], inp.service_topics(out), tail=False)
    flow = Dataflow("shape")
    routed = []  # the workload has no refusals: the errs go nowhere
    for name, source in wiring.inputs.sources.items():
        batches, _errors = source(flow, f"{name}_in")
        parsed = parse_route(f"parse_{name}", batches, PARSERS[name], Guards(), live)
        routed.append(parsed.oks)
    shards = op.merge("routed", *routed)  # one item per key group
    answers = op.stateful_batch("shards", shards, lambda _resume: _EchoShard())
    wiring.outputs.selections("out", op.map("answers", answers, lambda kv: kv[1]))
    return flow


LADDER = {"stack": stack_flow, "shape": shape_flow}


def run_rung(bk: Broker, inp: Input, counter: Counter, rung: str) -> dict[str, Any]:
    """One run of a rung of the ladder (``LADDER``), timed as the service is."""
    out = new_topics(bk.bootstrap, ("sel", "dlq"))
    flow = LADDER[rung](bk, inp, out)
    thread0 = time.thread_time()
    t0 = time.perf_counter()
    run_main(flow)
    seconds = time.perf_counter() - t0
    thread = time.thread_time() - thread0
    expected = inp.events if rung == "stack" else inp.events // 2
    written = counter.count(out["sel"])
    if written != expected:
        log(f"  WARNING: the {rung} rung wrote {written} of {expected}")
    first, last = answer_times(bk.bootstrap, out["sel"], written)
    return {
        "seconds": seconds,
        "events_per_s": inp.events / seconds,
        "steady_events_per_s": inp.events / (last - first),
        "worker_us_per_event": thread / inp.events * 1e6,
    }


def run_reference(bk: Broker, inp: Input, counter: Counter, kind: str, hops: int) -> float:
    """One run of a reference (``flow_references``: ``kind`` python or kcat, one hop or
    two): the service's work on ``inp`` (every input consumed, one answer per request),
    timed as the service is, from its first answer to its last (their Kafka timestamps);
    its steady events/s (input events over that time)."""
    out = new_topics(bk.bootstrap, ("sel",))["sel"]
    internal = new_topics(bk.bootstrap, ("internal",))["internal"] if hops == 2 else None
    flow_references.run(kind, bk.bootstrap, list(inp.topics.values()), out, inp.events, internal)
    requests = inp.events // 2
    written = counter.count(out)
    if written != requests:
        raise RuntimeError(f"the {kind} reference ({hops} hops) wrote {written} of {requests}")
    first, last = answer_times(bk.bootstrap, out, requests)
    return inp.events / (last - first)


def run_deployed(
    bk: Broker,
    inp: Input,
    counter: Counter,
    registry_path: Path,
    workdir: Path,
    processes: int = 1,
    server: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The service as deployed, in tail mode: ``server`` (arguments after the Python
    executable, ``{recovery}`` standing for a fresh recovery directory; by default
    ``python -m bytewax.run flows.service.main:flow``, no recovery) in ``processes``
    processes of one cluster (``-i``/``-a``, one worker each; ``bytewax.run`` only), on the
    combined topic or the two topics with their internal topic (the default setup, which
    a bounded ``run_once`` cannot show: it reads the two topics directly, as it cannot
    know when the internal topic is complete). Timed from its first answer to its last
    (their Kafka timestamps), as ``run_once``'s steady rate is."""
    server = server or RUN_DEFAULT.server
    if processes > 1 and server != RUN_DEFAULT.server:
        raise ValueError("a cluster runs python -m bytewax.run flows.service.main:flow only")
    out = new_topics(bk.bootstrap, ("sel", "dlq"))
    topics = {**inp.topics, **out}
    internal = None if inp.mode == "events" else new_topics(bk.bootstrap, ("internal",))["internal"]
    addresses = ";".join(f"127.0.0.1:{kafka_broker.free_port()}" for _ in range(processes))
    requests = inp.events // 2
    group = f"bench-{uuid.uuid4().hex[:12]}"  # the cluster's processes share it
    with contextlib.ExitStack() as stack:
        procs = []
        for index in range(processes):
            cluster = ("-i", str(index), "-a", addresses) if processes > 1 else ()
            logfile = workdir / f"deployed-{uuid.uuid4().hex[:8]}-{index}.log"
            recovery = str(logfile.with_suffix(".recovery"))
            args = tuple(a.replace("{recovery}", recovery) for a in server) + cluster
            proc = service_process(bk, args, topics, registry_path, logfile, internal, group)
            procs.append((stack.enter_context(proc), logfile))
        deadline = time.perf_counter() + 300
        while counter.count(out["sel"]) < requests:
            for proc, logfile in procs:
                check_alive(proc, logfile)
            if time.perf_counter() > deadline:
                raise TimeoutError(f"the service answered {counter.count(out['sel'])}")
            time.sleep(0.2)
    first, last = answer_times(bk.bootstrap, out["sel"], requests)
    dead = counter.count(out["dlq"], 1)
    if dead:
        log(f"  WARNING: the service wrote {dead} dead letters")
    return {"seconds": last - first, "events_per_s": inp.events / (last - first), "dead": dead}


#: ``tsi run --recovery-dir DIR``: the configuration users run (recovery on, a snapshot
#: every 10 s), the throughput's headline
TSI_RUN_RECOVERY = ("-m", "flows.cli", "run", "--recovery-dir", "{recovery}")

#: every measure of a throughput repeat: (key, what it is, hops its events cross Kafka
#: (the references it is compared with)); references and measures alternate in a repeat
MEASURES = (
    ("deployed_recovery", "`tsi run --recovery-dir DIR` (recovery on, snapshots every 10 s), "
     "tail mode", None),
    ("deployed", "`python -m bytewax.run flows.service.main:flow` (no recovery), tail mode",
     None),
    ("service", "`run_main(Service(...).flow(tail=False))`, bounded, no recovery; two topics "
     "read directly (no internal topic)", 1),
    ("stack", "ladder: Bytewax + the service's connectors, every message written back "
     "(`stack_flow`)", 1),
    ("shape", "ladder: + parsing, routing by shard, the keyed step; shards keep nothing "
     "(`shape_flow`)", 1),
)  # fmt: skip
REFERENCES = (("python", 1), ("kcat", 1), ("python", 2), ("kcat", 2))


def hops_of(mode: str, key: str) -> int:
    """The Kafka hops of a measure's events: the deployed default two-topic setup crosses
    its internal topic (2), everything else one."""
    fixed = {k: hops for k, _, hops in MEASURES}[key]
    return fixed or (2 if mode == "separate" else 1)


def reference_key(kind: str, hops: int) -> str:
    return f"{kind}_{hops}"


def throughput_repeat(
    bk: Broker,
    registry: Registry,
    inp: Input,
    counter: Counter,
    workdir: Path,
) -> dict[str, Any]:
    """One repeat, every measure and reference once, alternating: events/s of each (steady:
    first to last answer), the service's own figures (CPU, dead letters), and each
    measure's ratio to the references of its hops."""
    rates: dict[str, float] = {}
    hops_needed = {1, 2} if inp.mode == "separate" else {1}
    for kind, hops in REFERENCES:
        if hops in hops_needed:
            rates[reference_key(kind, hops)] = run_reference(bk, inp, counter, kind, hops)
    rungs = {rung: run_rung(bk, inp, counter, rung) for rung in LADDER}
    r = run_once(bk, registry, inp, counter)
    for rung, run in rungs.items():
        rates[rung] = run["steady_events_per_s"]
        r[f"{rung}_us_per_event"] = run["worker_us_per_event"]
    rates["service"] = r["steady_events_per_s"]
    deployed = run_deployed(bk, inp, counter, workdir / "registry.toml", workdir)
    rates["deployed"] = deployed["events_per_s"]
    recovered = run_deployed(
        bk, inp, counter, workdir / "registry.toml", workdir, server=TSI_RUN_RECOVERY
    )
    rates["deployed_recovery"] = recovered["events_per_s"]
    r["deployed_dead_letters"] = deployed["dead"] + recovered["dead"]
    r["worker_us_per_event"] = r["worker_thread_cpu"] * r["seconds"] / inp.events * 1e6
    r["rates"] = rates
    r["ratios"] = {
        f"{key}/{reference_key(kind, hops)}": rates[key] / rates[reference_key(kind, hops)]
        for key, _, _ in MEASURES
        for kind, hops in REFERENCES
        if hops == hops_of(inp.mode, key)
    }
    # the fields bench_ab.py compares
    r["ratio_to_passthrough"] = r["ratios"]["service/python_1"]
    r["default_setup_events_per_s"] = rates["deployed"]
    return r


def spread(values: list[float]) -> dict[str, Any]:
    """Median, min and max of every run (none dropped), and the runs."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "runs": values,
    }


def throughput(
    bk: Broker, plan: Plan, registry: Registry, counter: Counter, workdir: Path
) -> dict[str, Any]:
    freeze_long_lived()  # the GC settings every service process runs with (and the references)
    results: dict[str, Any] = {}
    for mode in ("separate", "events"):
        log(f"throughput, {mode} topics: {plan.requests:,} requests + feedback")
        inp = prepare_input(bk, mode, plan.requests, plan.units)
        runs = []
        for k in range(plan.repeats):
            r = throughput_repeat(bk, registry, inp, counter, workdir)
            log(
                f"  repeat {k + 1}: "
                + "; ".join(f"{key} {rate:,.0f}" for key, rate in r["rates"].items())
                + f" events/s; {r['worker_us_per_event']:.1f} us an event"
            )
            runs.append(r)
        results[mode] = {
            "runs": runs,
            "rates": {key: spread([r["rates"][key] for r in runs]) for key in runs[0]["rates"]},
            "ratios": {key: spread([r["ratios"][key] for r in runs]) for key in runs[0]["ratios"]},
            "raw_events_per_s": statistics.median(r["events_per_s"] for r in runs),
            "seconds": statistics.median(r["seconds"] for r in runs),
            "worker_us_per_event": statistics.median(r["worker_us_per_event"] for r in runs),
            "input": inp,
        }
        for rung in LADDER:
            results[mode][f"{rung}_us_per_event"] = statistics.median(
                r[f"{rung}_us_per_event"] for r in runs
            )
        if mode == "separate" and plan.short_epoch_ms is not None:
            log(f"throughput, separate topics, epoch {plan.short_epoch_ms:g} ms (1 run)")
            r = run_once(bk, registry, inp, counter, epoch_ms=plan.short_epoch_ms)
            r["epoch_ms"] = plan.short_epoch_ms
            results["separate_short_epoch"] = r
    return results


# ------------------------------------------------------------------------------ profile

GROUPS = (
    "Bytewax runtime (Rust run loop, operator shims)",
    "JSON (orjson)",
    "Kafka client (confluent-kafka, Bytewax connector, flows/service/connectors/kafka*.py)",
    "parsing/validation/serialisation (flows/service/wire/events.py)",
    "per-instance logic (flows/service/instances/instance.py, logic.py, deadlines.py)",
    "routing and glue (flows/service/dataflow.py, registry.py, metrics.py, stream_clock.py)",
    "algorithm (tsi_core)",
    "other (imports, stdlib)",
)
BYTEWAX, JSON_, KAFKA, EVENTS, INSTANCE, ROUTING, ALGORITHM, OTHER = GROUPS
FuncKey = tuple[str, int, str]


def group_of(key: FuncKey) -> str | None:
    """The group of a function, or None for built-ins and generated code (-> callers)."""
    filename, _, name = key
    if filename == "~":
        if "orjson" in name:
            return JSON_
        if "cimpl" in name or "confluent_kafka" in name:
            return KAFKA
        if "bytewax" in name:
            return BYTEWAX
        return None
    if filename.startswith("<") and not filename.startswith("<frozen"):
        return None
    path = filename.replace("\\", "/")
    if "/bytewax/connectors/kafka" in path or "/confluent_kafka/" in path:
        return KAFKA
    if "flows/service/connectors/kafka" in path:
        return KAFKA
    if "/bytewax/" in path:
        return BYTEWAX
    service = "flows/service/"
    if path.endswith(service + "events.py"):
        return EVENTS
    if path.endswith(
        tuple(service + f for f in ("instance.py", "logic.py", "group_logic.py", "deadlines.py"))
    ):
        return INSTANCE
    glue = ("dataflow.py", "registry.py", "metrics.py", "stream_clock.py")
    if path.endswith(tuple(service + f for f in glue)):
        return ROUTING
    if "/tsi_core/" in path:
        return ALGORITHM
    return OTHER


def attribute(stats: dict[FuncKey, Any], key: FuncKey, depth: int = 0) -> dict[str, float]:
    """Group shares of a function: its own group, or its callers' in proportion."""
    group = group_of(key)
    if group is not None:
        return {group: 1.0}
    callers = stats[key][4]
    total = sum(edge[2] for edge in callers.values())
    if depth > 6 or not callers or total <= 0:
        return {OTHER: 1.0}
    shares: dict[str, float] = {}
    for caller, edge in callers.items():
        if caller not in stats:
            continue
        for g, share in attribute(stats, caller, depth + 1).items():
            shares[g] = shares.get(g, 0.0) + share * edge[2] / total
    return shares or {OTHER: 1.0}


def short_name(key: FuncKey) -> str:
    filename, line, name = key
    if filename == "~":
        return name
    parts = Path(filename).parts
    for anchor in ("site-packages", "main"):
        if anchor in parts:
            parts = parts[parts.index(anchor) + 1 :]
            break
    return f"{'/'.join(parts)}:{line}({name})"


def profile(
    bk: Broker, registry: Registry, inp: Input, counter: Counter, unprofiled_s: float
) -> dict[str, Any]:
    log(f"profile: cProfile on the separate-topics run ({inp.events:,} events)")
    profiler = cProfile.Profile()
    run = run_once(bk, registry, inp, counter, profiler=profiler)
    stats = pstats.Stats(profiler).stats
    groups = dict.fromkeys(GROUPS, 0.0)
    for key, (_, _, tottime, _, _) in stats.items():
        for g, share in attribute(stats, key).items():
            groups[g] += tottime * share
    total = sum(groups.values())
    top = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:20]

    def calls(path_end: str, name: str) -> dict[str, float] | None:
        for (filename, _, fname), (cc, _, _, ct, _) in stats.items():
            if fname == name and filename.replace("\\", "/").endswith(path_end):
                return {"calls": cc, "cumtime_s": ct}
        return None

    requests = inp.events // 2
    feedback_calls = calls("flows/instance.py", "on_feedback")
    early = None
    if feedback_calls is not None:
        early = (feedback_calls["calls"] - requests) / requests  # early feedback runs twice
    return {
        "run": run,
        "profiled_seconds": run["seconds"],
        "unprofiled_seconds": unprofiled_s,
        "total_tottime_s": total,
        "groups": {g: {"seconds": s, "share": s / total} for g, s in groups.items()},
        "us_per_event": {g: s / inp.events * 1e6 for g, s in groups.items()},
        "top": [
            {
                "function": short_name(key),
                "group": max(attribute(stats, key).items(), key=lambda kv: kv[1])[0],
                "calls": v[0],
                "tottime_s": v[2],
                "cumtime_s": v[3],
            }
            for key, v in top
        ],
        "snapshot": calls("flows/operator.py", "snapshot"),
        "instance_to_dict": calls("flows/instance.py", "to_dict"),
        "early_feedback_share": early,
    }


# ------------------------------------------------------------------------------ services


@contextlib.contextmanager
def service_process(
    bk: Broker,
    args: tuple[str, ...],
    topics: dict[str, str],
    registry_path: Path,
    logfile: Path,
    internal: str | None = None,
    group: str | None = None,
) -> Iterator[subprocess.Popen]:
    """The Kafka service in a background process (tail mode), stopped at the end; in the
    two-topic setup with the internal topic ``internal`` (the processes of one cluster
    share it), else a new one; in consumer group ``group``, else a new one."""
    env = dict(
        os.environ,
        TSI_REGISTRY=str(registry_path),
        KAFKA_BOOTSTRAP_SERVERS=bk.bootstrap,
        TSI_TOPIC_SELECTIONS=topics["sel"],
        TSI_TOPIC_DLQ=topics["dlq"],
        # a group of its own: a fresh recovery directory refuses a group with progress
        TSI_GROUP_ID=group or f"bench-{uuid.uuid4().hex[:12]}",
    )
    # and a changelog of its own (with a recovery directory tsi run creates it): one
    # shared with an earlier run would rebuild that run's state
    env["TSI_TOPIC_CHANGELOG"] = f"{env['TSI_GROUP_ID']}-changelog"
    for name in ("TSI_TOPIC_REQUESTS", "TSI_TOPIC_FEEDBACK", "TSI_TOPIC_EVENTS"):
        env.pop(name, None)
    # without recovery the service starts from its (fresh) group's offsets: read from the
    # start, so that what is produced before its consumers are assigned is not skipped
    config = logfile.with_suffix(".kafka.toml")
    config.write_text('[kafka.consumer]\nauto.offset.reset = "earliest"\n')
    env["TSI_KAFKA_CONFIG"] = str(config)
    env.pop("TSI_STOP_AT_END", None)  # tail mode: the service waits for new messages
    if "events" in topics:
        env["TSI_TOPIC_EVENTS"] = topics["events"]
    else:  # the default two-topic setup also needs its internal topic
        env["TSI_TOPIC_REQUESTS"] = topics["requests"]
        env["TSI_TOPIC_FEEDBACK"] = topics["feedback"]
        env["TSI_TOPIC_INTERNAL"] = internal or new_topics(bk.bootstrap, ("internal",))["internal"]
    with open(logfile, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, *args], env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        yield proc
    finally:
        stop_process(proc, 15)


def stop_process(proc: subprocess.Popen, seconds: float) -> None:
    """SIGTERM, and SIGKILL if ``proc`` has not ended ``seconds`` later."""
    proc.terminate()
    try:
        proc.wait(seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(15)


def check_alive(proc: subprocess.Popen, logfile: Path) -> None:
    if proc.poll() is not None:
        tail = logfile.read_text(errors="replace").splitlines()[-20:]
        raise RuntimeError(f"service exited with {proc.returncode}:\n" + "\n".join(tail))


# ------------------------------------------------------------------------------ latency


class SelectionReader:
    """A thread that records when each request_id's selection is consumed."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.received: dict[str, float] = {}
        self._consumer = topic_reader(bootstrap, topic)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # poll() returns as soon as one message is there (consume(n, t) waits to fill n).
        while not self._stop.is_set():
            msg = self._consumer.poll(0.05)
            if msg is None or msg.error() is not None:
                continue
            now = time.perf_counter()
            self.received[orjson.loads(msg.value())["request_id"]] = now

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._consumer.close()


class RequestSender:
    """Requests produced one by one at their intended times (``open_loop.schedule``), with
    both the intended and the actual time of each (``time.perf_counter``); requests and
    feedback go to the ``events`` topic when ``topics`` has one."""

    def __init__(self, bootstrap: str, topics: dict[str, str]) -> None:
        # No linger (nothing waits to fill a batch); idempotence caps the requests in flight
        # at 5, so under load messages batch while earlier requests are in flight (without it
        # every message is its own produce request, and the broker and the service's
        # consumers pay).
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "linger.ms": 0, "enable.idempotence": True}
        )
        self.typed = "events" in topics
        self.requests = topics["events" if self.typed else "requests"]
        self.feedback_topic = topics["events" if self.typed else "feedback"]
        self.intended: dict[str, float] = {}
        self.sent: dict[str, float] = {}

    def send(self, rid: str, unit: str, intended: float | None = None) -> None:
        """Request ``rid`` of ``unit``, due at ``intended`` (default: now)."""
        value = request_value(unit, rid, typed=self.typed, ts=time.time())
        t = time.perf_counter()
        self.producer.produce(self.requests, key=instance_key(unit), value=value)
        self.producer.poll(0)
        self.sent[rid] = t
        self.intended[rid] = t if intended is None else intended

    def feedback(self, rid: str, unit: str, loss: float) -> None:
        """The feedback of request ``rid`` of ``unit``."""
        self.producer.produce(
            self.feedback_topic,
            key=instance_key(unit),
            value=feedback_value(unit, rid, loss, typed=self.typed),
        )


def await_ready(
    proc: subprocess.Popen, logfile: Path, reader: SelectionReader, sender: RequestSender
) -> tuple[float, float]:
    """Probe requests until one is answered: (start time, seconds until ready)."""
    t0 = time.perf_counter()
    k = 0
    while not reader.received:  # ready: a probe request has been answered
        check_alive(proc, logfile)
        if time.perf_counter() - t0 > 90:
            raise TimeoutError("the service answered no request within 90 s")
        sender.send(f"probe{k}", f"probe{k}")
        k += 1
        time.sleep(0.2)
    return t0, time.perf_counter() - t0


def send_load(plan: Plan, cfg: LatencyConfig, sender: RequestSender) -> float:
    """Warm-up, then the measured requests, on one open-loop schedule at the plan's rate
    (request k due at start + k / rate; ``w`` ids in the warm-up seconds, ``m`` after);
    the intended time of the first measured one. With feedback, each request's comes
    0.5 s after it, warm-up included: the first feedback a topic and a service see (a new
    producer, the topic's first writes) is a transient that the measured seconds would
    otherwise begin with (bench/RESULTS.md, "the engine measured alone, latency on both
    topologies")."""
    lag = round(plan.latency_rate * 0.5)
    warm = round(plan.latency_rate * plan.latency_warmup_seconds)
    seconds = plan.latency_warmup_seconds + plan.latency_seconds
    sent: list[tuple[str, str]] = []  # (request id, unit), in the order sent
    t_start = float("nan")
    for k, due in open_loop.schedule(plan.latency_rate, seconds):
        rid, unit = (f"w{k}" if k < warm else f"m{k - warm}"), f"u{k % plan.units}"
        if k == warm:
            t_start = due
        sender.send(rid, unit, due)
        sent.append((rid, unit))
        if cfg.feedback and len(sent) > lag:
            sender.feedback(*sent[len(sent) - 1 - lag], loss_of(len(sent)))
    return t_start


def await_answers(
    reader: SelectionReader, measured: list[str], proc: subprocess.Popen, logfile: Path
) -> None:
    """Wait up to 10 s for every measured answer, then 0.5 s more (the unanswered count
    as infinitely slow)."""
    deadline = time.perf_counter() + 10
    while time.perf_counter() < deadline and not all(rid in reader.received for rid in measured):
        time.sleep(0.1)
    time.sleep(0.5)
    check_alive(proc, logfile)


def gc2_pauses(cfg: LatencyConfig, logfile: Path) -> list[float] | None:
    """Full collections in the service (logged by flow_helpers.py serve), else None."""
    if cfg.server[0] != HELPERS:
        return None
    return [
        float(line.split()[1])
        for line in logfile.read_text(errors="replace").splitlines()
        if line.startswith("GC2 ")
    ]


def latency_run(
    bk: Broker, plan: Plan, cfg: LatencyConfig, registry_path: Path, workdir: Path
) -> dict[str, Any]:
    inputs = ("events",) if cfg.events else ("requests", "feedback")
    topics = new_topics(bk.bootstrap, (*inputs, "sel", "dlq"))
    logfile = workdir / f"latency-{len(list(workdir.glob('latency-*')))}.log"
    recovery = str(logfile.with_suffix(".recovery"))  # a fresh directory per run
    server = tuple(arg.replace("{recovery}", recovery) for arg in cfg.server)
    reader = SelectionReader(bk.bootstrap, topics["sel"])
    sender = RequestSender(bk.bootstrap, topics)
    try:
        with service_process(bk, server, topics, registry_path, logfile) as proc:
            t0, ready_s = await_ready(proc, logfile, reader, sender)
            t_start = send_load(plan, cfg, sender)
            sender.producer.flush(10)
            measured = [rid for rid in sender.sent if rid.startswith("m")]
            await_answers(reader, measured, proc, logfile)
    finally:
        reader.close()
    received = dict(reader.received)
    return {
        "config": asdict(cfg),
        "rate": plan.latency_rate,
        "seconds": plan.latency_seconds,
        "ready_s": ready_s,
        "measured_from_s": t_start - t0,
        **open_loop.figures(measured, sender.intended, sender.sent, received, SLOW_MS),
        "timeline": open_loop.timeline(measured, sender.intended, received, t0),
        "gc2_pauses_ms": gc2_pauses(cfg, logfile),
    }


def latency(bk: Broker, plan: Plan, registry_path: Path, workdir: Path) -> list[dict[str, Any]]:
    """Every configuration of the plan in rounds (``latency_rounds``; one run of each a
    round, alternating), then the ``latency_once`` ones; every run is reported."""
    # a fresh broker answers slower until its JIT has warmed up (the first configuration
    # run read a p50 several times the same one's run second: bench/RESULTS.md, "the
    # compiled hot path"): one run is discarded as the broker's warm-up (not a run of the
    # measured configurations)
    log("latency: warm-up run of the broker (not reported)")
    latency_run(bk, plan, plan.latency_configs[0], registry_path, workdir)
    rounds = [(k, cfg) for k in range(plan.latency_rounds) for cfg in plan.latency_configs]
    order = rounds + [(0, cfg) for cfg in plan.latency_once]
    out = []
    for k, cfg in order:
        log(f"latency: {cfg.name} (epoch {cfg.epoch}), {plan.latency_rate:g} requests/s, "
            f"run {k + 1}")  # fmt: skip
        r = latency_run(bk, plan, cfg, registry_path, workdir)
        r["round"] = k + 1
        log(
            f"  open loop p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, max "
            f"{r['max_ms']:.1f} ms ({r['answered']:,} of {r['sent']:,} answered); closed loop "
            f"p99 {r['closed_loop_p99_ms']:.1f}; sender lag up to {r['sender_max_lag_ms']:.1f} ms"
        )
        out.append(r)
    return out


# ------------------------------------------------------------------------------ memory


def rss_of(pid: int) -> dict[str, int]:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {
        "rss": psutil.Process(pid).memory_info().rss,
        "hwm": int(fields["VmHWM"].split()[0]) * 1024,
    }


def wait_for(
    counter: Counter, topic: str, target: int, proc: subprocess.Popen, logfile: Path
) -> None:
    last, last_change = -1, time.perf_counter()
    while True:
        n = counter.count(topic)
        if n >= target:
            return
        check_alive(proc, logfile)
        if n != last:
            last, last_change = n, time.perf_counter()
        elif time.perf_counter() - last_change > 60:
            raise TimeoutError(f"{topic}: stuck at {n} of {target} messages for 60 s")
        time.sleep(0.25)


@dataclass(frozen=True)
class MemoryVariant:
    name: str
    feedback_ttl: float
    events: bool  # each request followed by its feedback on the combined events topic
    idle_wait: float  # seconds to wait after the last answer before reading the RSS


# RSS is read 12 s after the last answer: the 10 s epoch has closed and packed the bandits
# its keys touched (what a service with many more users than active ones holds)
OPEN_TICKETS = MemoryVariant("open ticket (request, no feedback; TTL 3600 s)", 3600.0, False, 12.0)
IDLE = MemoryVariant("idle (request + feedback, events topic; TTL 1 s, expired)", 1.0, True, 12.0)


def memory_messages(
    topics: dict[str, str], units: Iterable[str], rid: str
) -> Iterator[tuple[str, str, bytes]]:
    """One request per unit, or request then feedback on the events topic."""
    for unit in units:
        key = instance_key(unit)
        if "events" in topics:
            yield topics["events"], key, request_value(unit, rid, typed=True)
            yield topics["events"], key, feedback_value(unit, rid, 1.0, typed=True)
        else:
            yield topics["requests"], key, request_value(unit, rid)


def memory_run(
    bk: Broker,
    variant: MemoryVariant,
    stages: tuple[int, ...],
    counter: Counter,
    workdir: Path,
    recovery: bool = True,
) -> dict[str, Any]:
    """RSS of the service process after cumulative stages of new instances; with
    ``recovery`` the service is ``tsi run --recovery-dir`` (a fresh directory), else
    ``python -m bytewax.run`` without one."""
    kinds = ("events", "sel", "dlq") if variant.events else ("requests", "feedback", "sel", "dlq")
    topics = new_topics(bk.bootstrap, kinds)
    registry_path = workdir / f"registry-ttl-{variant.feedback_ttl:g}.toml"
    registry_path.write_text(registry_toml(variant.feedback_ttl))
    logfile = workdir / f"memory-ttl-{variant.feedback_ttl:g}.log"
    directory = str(logfile.with_suffix(".recovery"))
    server = tuple(a.replace("{recovery}", directory) for a in TSI_RUN_RECOVERY)
    producer = bulk_producer(bk.bootstrap)
    results: list[dict[str, Any]] = []
    with service_process(
        bk, server if recovery else RUN_DEFAULT.server, topics, registry_path, logfile
    ) as proc:
        log(f"memory, {variant.name}: {WARM_UNITS} warm-up instances")
        produce_all(producer, memory_messages(topics, (f"w{i}" for i in range(WARM_UNITS)), "w"))
        wait_for(counter, topics["sel"], WARM_UNITS, proc, logfile)
        time.sleep(variant.idle_wait)
        base = rss_of(proc.pid)
        done = 0
        for n in stages:
            log(f"memory, {variant.name}: {n:,} instances")
            t0 = time.perf_counter()
            produce_all(producer, memory_messages(topics, (f"u{i}" for i in range(done, n)), "r"))
            wait_for(counter, topics["sel"], WARM_UNITS + n, proc, logfile)
            seconds = time.perf_counter() - t0
            time.sleep(variant.idle_wait)
            results.append(memory_stage(n, (n - done) / seconds, base, rss_of(proc.pid)))
            done = n
        check_alive(proc, logfile)
        dead = counter.count(topics["dlq"], 1)
    xs = np.array([0] + [r["instances"] for r in results], dtype=float)
    ys = np.array([base["rss"]] + [r["rss"] for r in results], dtype=float)
    return {
        "variant": asdict(variant),
        "baseline_rss": base["rss"],
        "baseline_hwm": base["hwm"],
        "stages": results,
        "slope_bytes_per_instance": float(np.polyfit(xs, ys, 1)[0]),
        "dead_letters": dead,
    }


def memory_stage(
    n: int, arrivals: float, base: dict[str, int], now: dict[str, int]
) -> dict[str, Any]:
    """A stage's figures (logged): ``n`` instances held, arriving at ``arrivals`` a second,
    the RSS ``now`` over the ``base`` at rest and at the peak."""
    stage = {
        "instances": n,
        "rss": now["rss"],
        "hwm": now["hwm"],
        "bytes_per_instance": (now["rss"] - base["rss"]) / n,
        # the peak (VmHWM: the most the process ever held) over the same baseline
        "peak_bytes_per_instance": (now["hwm"] - base["rss"]) / n,
        "new_instances_per_s": arrivals,
    }
    log(
        f"  RSS {now['rss'] / 2**20:,.0f} MiB, {stage['bytes_per_instance']:,.0f} B per "
        f"instance; peak {now['hwm'] / 2**20:,.0f} MiB, {stage['peak_bytes_per_instance']:,.0f} B"
    )
    return stage


def memory(bk: Broker, plan: Plan, counter: Counter, workdir: Path) -> dict[str, Any]:
    n = plan.idle_stages[-1]
    log(f"memory: Bytewax's own memory per key ({n:,} keys, flow_helpers.py floor)")
    floor = subprocess.run(
        [sys.executable, HELPERS, "floor", str(n)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return {
        "recovery": plan.memory_recovery,
        "open_tickets": memory_run(
            bk, OPEN_TICKETS, plan.memory_stages, counter, workdir, plan.memory_recovery
        ),
        "idle": memory_run(bk, IDLE, plan.idle_stages, counter, workdir, plan.memory_recovery),
        "python_breakdown": python_breakdown(),
        "bytewax_floor": json.loads(floor.stdout.strip().splitlines()[-1]),
    }


def python_breakdown(n: int = 10_000) -> dict[str, float]:
    """tracemalloc bytes per ``Instance`` (Python objects only), in three states.

    Message bytes are copied to exact-size objects, as Kafka hands them over: orjson.dumps
    returns a bytes object with an allocation many times the message, which the open
    ticket would keep (bench/RESULTS.md, "Figures behind the code").
    """
    registry = Registry.from_toml(registry_toml())
    exp = registry[EXPERIMENT]
    out: dict[str, float] = {}
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        insts = []
        for i in range(n):
            raw = bytes(bytearray(request_value(f"u{i}", "r")))
            inst = Instance(exp, instance_key(f"u{i}"))
            inst.on_request(parse_request(raw, Origin("requests", 0, i)), now=0.0)
            inst.rest()  # as the operator does when the epoch closes
            insts.append(inst)
        out["open_ticket"] = (tracemalloc.get_traced_memory()[0] - before) / n
        for i, inst in enumerate(insts):
            raw = bytes(bytearray(feedback_value(f"u{i}", "r", 1.0)))
            inst.on_feedback(parse_feedback(raw, Origin("feedback", 0, i)), now=0.0)
            inst.rest()
        out["settled"] = (tracemalloc.get_traced_memory()[0] - before) / n
        for inst in insts:
            inst.expire(now=1e9)
            inst.rest()
        out["idle_after_expiry"] = (tracemalloc.get_traced_memory()[0] - before) / n
    finally:
        tracemalloc.stop()
    return out


# ------------------------------------------------------------------------------ report


def machine_info(bk: Broker) -> dict[str, Any]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "flows", "tsi_core"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.split("\n")
    return {
        "cpu_model": cpu,
        "cpu_count": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "memory_gib": psutil.virtual_memory().total / 2**30,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "bytewax": getattr(bytewax, "__version__", None) or _version("bytewax"),
        "confluent_kafka": confluent_kafka.__version__,
        "librdkafka": confluent_kafka.libversion()[0],
        "kcat": flow_references.kcat_version(),
        "broker": (
            "project broker, deploy/kafka (Kafka 4.1.1, single node), started by this run"
            if bk.started_here
            else f"external, KAFKA_BOOTSTRAP_SERVERS={bk.bootstrap}"
        ),
        "load_average_at_start": os.getloadavg(),
        "git_commit": commit,
        "uncommitted_files_in_flows_tsi_core": len([x for x in dirty if x.strip()]),
    }


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def fmt_load(load: Iterable[float]) -> str:
    return " / ".join(f"{x:.2f}" for x in load)


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f}%"


MODES = (("separate", "requests + feedback topics"), ("events", "events topic"))
MEMORY_STATES = (("open_tickets", "open ticket"), ("idle", "idle"))
REFERENCE_TEXT = {
    "python_1": "Python (confluent-kafka, one thread), one hop",
    "kcat_1": "C: kcat consuming, grep, kcat producing (three processes), one hop",
    "python_2": "Python, two hops (internal topic; both stages in one thread, at once)",
    "kcat_2": "C: kcat, two hops (two pipelines at once)",
}


def mib(n: float) -> str:
    return f"{n / 2**20:,.1f}"


def report_machine(results: dict[str, Any]) -> list[str]:
    """Title and the machine, code and workload of the run."""
    m, plan = results["machine"], results["plan"]
    return [
        "# Streaming service benchmark (bench/bench_flow.py)",
        "",
        f"- CPU: {m['cpu_model']} ({m['cpu_count']} logical, {m['usable_cpus']} usable), "
        f"{m['memory_gib']:.0f} GiB RAM; {m['platform']}",
        f"- Python {m['python']}, Bytewax {m['bytewax']}, confluent-kafka "
        f"{m['confluent_kafka']} (librdkafka {m['librdkafka']}); kcat: {m['kcat']}",
        f"- Broker: {m['broker']}; broker, service and load generator share the machine",
        f"- Code: git {m['git_commit']} ({m['uncommitted_files_in_flows_tsi_core']} uncommitted "
        "files in flows/ and tsi_core/)",
        f"- Mode: {plan['mode']}; {results['wall_seconds']:.0f} s in all; command: "
        f"`{results['command']}`",
        f"- Workload: one per-unit experiment, {N_ARMS} arms; one process, one worker",
        f"- Load average (1, 5, 15 min) at start {fmt_load(m['load_average_at_start'])}, at end "
        f"{fmt_load(results['load_average_at_end'])} (other jobs on the machine skew figures)",
        "",
    ]


def fmt_spread(s: dict[str, Any], digits: int = 0) -> str:
    """``median (min - max)`` of every run."""
    if digits:
        return f"{s['median']:.{digits}f} ({s['min']:.{digits}f} - {s['max']:.{digits}f})"
    return f"{s['median']:,.0f} ({s['min']:,.0f} - {s['max']:,.0f})"


def report_throughput(tp: dict[str, Any], plan: dict[str, Any]) -> list[str]:
    """The references, then every measure with its ratios to the references of its hops."""
    n = plan["requests"]
    modes = [(mode, label) for mode, label in MODES if tp.get(mode)]
    repeats = len(tp[modes[0][0]]["runs"]) if modes else 0
    lines = [
        f"## Throughput, end to end ({n:,} requests + {n:,} feedback, {plan['units']:,} "
        f"units; {repeats} repeats, every run counted)",
        "",
        "Every figure is steady events/s: input events over the time from the first answer "
        "to the last (their Kafka timestamps), the median of every repeat's run (min - max). "
        "In each repeat the references and the service's setups run once each, in turn. The "
        "references do the service's work (`bench/flow_references.py`): every request and "
        "feedback event consumed, one answer written per request, pipelined.",
        "",
        "| Reference | " + " | ".join(label for _, label in modes) + " |",
        "|---|" + "---:|" * len(modes),
    ]
    for key, text in REFERENCE_TEXT.items():
        cells = [
            fmt_spread(tp[mode]["rates"][key]) if key in tp[mode]["rates"] else "-"
            for mode, _ in modes
        ]
        lines.append(f"| {text} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Each setup against the references of as many Kafka hops (the default two-topic "
        "setup crosses its internal topic: two); ratios are the median of the repeats' "
        "ratios (each repeat's run over the same repeat's reference), min - max. Target: "
        f">= {TARGET_REFERENCE_RATIO:g} of the Python reference (the kcat ratio has no "
        "target: it says how far the service is from what the broker and librdkafka carry).",
        "",
        "| Setup | Input | Hops | events/s | / Python reference | Target | | / kcat |",
        "|---|---|---:|---:|---:|---:|---|---:|",
    ]
    for key, text, _ in MEASURES:
        for mode, label in modes:
            hops = hops_of(mode, key)
            py = tp[mode]["ratios"][f"{key}/python_{hops}"]
            kc = tp[mode]["ratios"][f"{key}/kcat_{hops}"]
            ok = py["median"] >= TARGET_REFERENCE_RATIO
            target = (  # the target is the service's; a ladder's rung is a diagnostic
                "- | -" if key in LADDER else f">= {TARGET_REFERENCE_RATIO:g} | {verdict(ok)}"
            )
            head = "**headline** " if key == "deployed_recovery" else ""
            lines.append(
                f"| {head}{text} | {label} | {hops} | {fmt_spread(tp[mode]['rates'][key])} | "
                f"{fmt_spread(py, 2)} | {target} | {fmt_spread(kc, 2)} |"
            )
    return lines + throughput_notes(tp, modes)


def throughput_notes(tp: dict[str, Any], modes: list[tuple[str, str]]) -> list[str]:
    """The bounded run's CPU, the ladder's CPU an event, the short epoch, clean runs."""
    lines = [""]
    for mode, label in modes:
        r = tp[mode]
        mid = r["runs"][len(r["runs"]) // 2]
        lines.append(
            f"- {label}, the bounded run (`run_main`): {r['seconds']:.2f} s start to EOF "
            f"(raw {r['raw_events_per_s']:,.0f} events/s); worker thread "
            f"{r['worker_us_per_event']:.1f} us an event (stack {r['stack_us_per_event']:.1f}, "
            f"shape {r['shape_us_per_event']:.1f}); in the middle repeat the worker thread "
            f"used {pct(mid['worker_thread_cpu'])} of a core, the process "
            f"{pct(mid['process_cpu'])}, the broker {pct(mid['broker_cpu'])}."
        )
    short = tp.get("separate_short_epoch")
    if short:
        lines.append(
            f"- Two topics read directly, epoch {short['epoch_ms']:g} ms (1 run, bounded): "
            f"{short['steady_events_per_s']:,.0f} events/s steady."
        )
    all_runs = [r for mode, _ in modes for r in tp[mode]["runs"]]
    clean = all(
        r["dead_letters"] == 0
        and 2 * r["selections"] == r["events"]
        and not r["deployed_dead_letters"]
        for r in all_runs
    )
    lines += [
        "- Every run answered every request with no dead letter: "
        + ("yes." if clean else "NO (see JSON)."),
        "",
    ]
    return lines


def by_config(lat: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The runs of each configuration, in the order first run."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in lat:
        out.setdefault(r["config"]["name"], []).append(r)
    return out


def latency_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median over the runs of each percentile, every run's p99, and the verdict (on
    the median p99; how many runs met the target alone)."""
    med = {k: statistics.median(r[k] for r in runs) for k in LATENCY_KEYS}
    p99s = [r["p99_ms"] for r in runs]
    return {
        **med,
        "p99_runs": p99s,
        "runs_meeting_target": sum(p <= TARGET_P99_MS for p in p99s),
        "answered": sum(r["answered"] for r in runs),
        "sent": sum(r["sent"] for r in runs),
        "ok": med["p99_ms"] <= TARGET_P99_MS,
    }


LATENCY_KEYS = (
    "p50_ms",
    "p90_ms",
    "p99_ms",
    "p99_9_ms",
    "max_ms",
    "closed_loop_p99_ms",
    "sender_max_lag_ms",
)


def report_latency(lat: list[dict[str, Any]], plan: dict[str, Any]) -> list[str]:
    """The latency table, one row per configuration (medians over its runs)."""
    lines = [
        f"## Decision latency, open loop, at {plan['latency_rate']:,.0f} requests/s for "
        f"{plan['latency_seconds']:g} s (after {plan['latency_warmup_seconds']:g} s warm-up "
        "at the same load)",
        "",
        "Request k is due at t0 + k / rate; latency = the answer's arrival - the request's "
        "intended send time, so a sender that falls behind is counted (`bench/open_loop.py`); "
        "an unanswered request counts as infinitely slow; nearest-rank percentiles in ms. "
        "Each figure is the median over the configuration's runs (configurations with "
        "several runs ran in rounds, alternating). `closed loop p99` is the p99 from the "
        "actual send, what a closed-loop generator would report; `sender lag` the most a "
        "request went out after its intended time. The headline is the configuration users "
        "run: `tsi run --recovery-dir DIR` (snapshots every 10 s).",
        "",
        "| Service | Epoch | Feedback | Runs | Answered | p50 | p90 | p99 | p99 of each run | "
        f"p99.9 | max | closed loop p99 | sender lag | Target p99 <= {TARGET_P99_MS:g} | |",
        "|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, runs in by_config(lat).items():
        c, s = runs[0]["config"], latency_summary(runs)
        fb = f"{runs[0]['rate']:,.0f}/s, 0.5 s later" if c["feedback"] else "none"
        head = "**headline** " if name == HEADLINE_LATENCY.name else ""
        each = ", ".join(f"{p:.1f}" for p in s["p99_runs"])
        lines.append(
            f"| {head}`{name.replace(', + feedback', '')}` | {c['epoch']} | {fb} | {len(runs)} | "
            f"{s['answered']:,} / {s['sent']:,} | {s['p50_ms']:.1f} | {s['p90_ms']:.1f} | "
            f"{s['p99_ms']:.1f} | {each} | {s['p99_9_ms']:.1f} | {s['max_ms']:.1f} | "
            f"{s['closed_loop_p99_ms']:.1f} | {s['sender_max_lag_ms']:.1f} | "
            f"<= {TARGET_P99_MS:g} | {verdict(s['ok'])} ({s['runs_meeting_target']} of "
            f"{len(runs)} runs) |"
        )
    return lines + latency_slow_seconds(lat)


def latency_slow_seconds(lat: list[dict[str, Any]]) -> list[str]:
    """Per run, the seconds whose slowest answer took over 100 ms."""
    lines = [
        "",
        "Seconds (since the service process started; requests due in that second) whose "
        "slowest answer took over 100 ms:",
        "",
    ]
    for r in lat:
        slow = [f"{sec} s: {worst:.0f} ms" for sec, _, _, _, worst in r["timeline"] if worst > 100]
        gcs = r["gc2_pauses_ms"]
        gc_note = (
            ""
            if gcs is None
            else f"; full GCs in the service: {len(gcs)}"
            + (f", longest {max(gcs):.0f} ms" if gcs else "")
        )
        lines.append(
            f"- `{r['config']['name']}` run {r['round']} (measured from "
            f"{r['measured_from_s']:.1f} s): " + (", ".join(slow) if slow else "none") + gc_note
        )
    lines.append("")
    return lines


def report_memory(mem: dict[str, Any]) -> list[str]:
    """The RSS table, one row per stage and state: at rest and the peak."""
    lines = [
        "## Memory per instance (RSS of the service process)",
        "",
        (
            "`tsi run --recovery-dir DIR` (recovery and its changelog on"
            if mem.get("recovery", False)
            else "`python -m bytewax.run flows.service.main:flow` (no recovery"
        )
        + ", epoch 10 s); new units in cumulative stages; "
        f"baseline = RSS after {WARM_UNITS} warm-up instances. Open ticket: one "
        "request per unit, the selection waits for its feedback (TTL 3600 s). Idle: request "
        "then feedback on the events topic with feedback_ttl = 1 s, RSS read once the "
        "settled answers have expired, so only the instance (bandit state) remains. At rest: "
        "the RSS 12 s after the stage's last answer; peak: the process's VmHWM (the most it "
        "ever held), both over the same baseline.",
        "",
        "| Instances | State | Baseline (MiB) | RSS at rest (MiB) | Peak RSS (MiB) | "
        "at rest: (RSS - baseline) / instances (B) | peak: (VmHWM - baseline) / instances "
        "(B) | New instances/s |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for key, label in MEMORY_STATES:
        run = mem.get(key)
        for st in run["stages"] if run else ():
            lines.append(
                f"| {st['instances']:,} | {label} | {mib(run['baseline_rss'])} | "
                f"{mib(st['rss'])} | {mib(st['hwm'])} | {st['bytes_per_instance']:,.0f} | "
                f"{st['peak_bytes_per_instance']:,.0f} | {st['new_instances_per_s']:,.0f} |"
            )
    lines.append("")
    return lines + memory_notes(mem)


def memory_notes(mem: dict[str, Any]) -> list[str]:
    """Verdict per state (at rest and at the peak), then the Python and Bytewax
    decompositions."""
    lines = []
    for key, label in MEMORY_STATES:
        run = mem.get(key)
        if not run:
            continue
        last = run["stages"][-1]
        target = TARGET_BYTES_PER_INSTANCE[key]
        rest, peak = last["bytes_per_instance"], last["peak_bytes_per_instance"]
        lines.append(
            f"- {label}, {last['instances']:,} instances: at rest {rest:,.0f} B per instance "
            f"(least-squares slope {run['slope_bytes_per_instance']:,.0f} B), peak "
            f"{peak:,.0f} B; target <= {target:,} B for the peak: **{verdict(peak <= target)}** "
            f"(at rest: {verdict(rest <= target)}); dead letters: {run['dead_letters']}."
        )
    b, floor = mem["python_breakdown"], mem["bytewax_floor"]
    return [
        *lines,
        f"- Python objects of one `Instance` alone (tracemalloc, 10,000 instances, in this "
        f"process, without Bytewax's per-key state): open ticket {b['open_ticket']:,.0f} B, "
        f"settled (answer kept for the TTL) {b['settled']:,.0f} B, idle after expiry "
        f"{b['idle_after_expiry']:,.0f} B.",
        f"- Bytewax's own state per key (`op.stateful` with a logic that keeps nothing, "
        f"{floor['keys']:,} keys, RSS, `bench/flow_helpers.py floor`): "
        f"{floor['bytes_per_key']:,.0f} B.",
        "",
    ]


def report_profile(prof: dict[str, Any], plan: dict[str, Any]) -> list[str]:
    """Own time by group, then the top functions."""
    lines = [
        f"## Profile (cProfile, requests + feedback topics, {plan['requests'] * 2:,} events)",
        "",
        f"Profiled run {prof['profiled_seconds']:.1f} s vs {prof['unprofiled_seconds']:.1f} s "
        "unprofiled: cProfile inflates Python calls more than C calls, so shares of Python "
        "code are upper bounds. Own time (tottime) by group; built-ins and generated code "
        "count for their callers.",
        "",
        "| Group | Seconds | Share | µs per event (profiled) |",
        "|---|---:|---:|---:|",
    ]
    for g, v in sorted(prof["groups"].items(), key=lambda kv: -kv[1]["seconds"]):
        lines.append(
            f"| {g} | {v['seconds']:.2f} | {pct(v['share'])} | {prof['us_per_event'][g]:.1f} |"
        )
    lines += ["", "Top functions by own time:", "", "| Function | Group | Calls | Own s |"]
    lines.append("|---|---|---:|---:|")
    for t in prof["top"][:15]:
        lines.append(
            f"| `{t['function']}` | {t['group'].split(' (')[0]} | {t['calls']:,} | "
            f"{t['tottime_s']:.3f} |"
        )
    return lines + profile_notes(prof)


def profile_notes(prof: dict[str, Any]) -> list[str]:
    """Snapshot calls and the share of feedback that came before its request."""
    snap, to_dict = prof["snapshot"], prof["instance_to_dict"]
    lines = [""]
    if snap:
        lines.append(
            f"`ShardLogic.snapshot` was called {snap['calls']:,} times "
            f"({snap['cumtime_s']:.2f} s cumulative; `Instance.to_dict` "
            f"{(to_dict or {}).get('calls', 0):,} times) in a run without recovery."
        )
    if prof.get("early_feedback_share") is not None:
        lines.append(
            f"Feedback that arrived before its request (buffered, then applied): "
            f"{pct(prof['early_feedback_share'])}."
        )
    lines.append("")
    return lines


def report_errors(errors: dict[str, str]) -> list[str]:
    lines = ["## Errors", ""]
    for name, err in errors.items():
        lines += [f"- {name}:", "", "```", err.strip(), "```", ""]
    return lines


def report(results: dict[str, Any]) -> str:
    """The Markdown report: the machine, then a section per part that ran."""
    plan = results["plan"]
    lines = report_machine(results)
    if tp := results.get("throughput"):
        lines += report_throughput(tp, plan)
    if lat := results.get("latency"):
        lines += report_latency(lat, plan)
    if mem := results.get("memory"):
        lines += report_memory(mem)
    if prof := results.get("profile"):
        lines += report_profile(prof, plan)
    if errors := results.get("errors", {}):
        lines += report_errors(errors)
    return "\n".join(lines)


# ------------------------------------------------------------------------------ main


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


@contextlib.contextmanager
def bench_session() -> Iterator[tuple[Broker, Path, Path, Counter]]:
    """The broker (``broker``), a work directory holding the workload's registry file,
    and a counter of topics, for one bench run; all closed at the end."""
    with tempfile.TemporaryDirectory(prefix="tsi-bench-") as tmp, broker() as bk:
        workdir = Path(tmp)
        registry_path = workdir / "registry.toml"
        registry_path.write_text(registry_toml())
        counter = Counter(bk.bootstrap)
        try:
            yield bk, workdir, registry_path, counter
        finally:
            counter.close()


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
        plan = replace(plan, memory_stages=stages, idle_stages=stages)
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


def main() -> None:
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
        ("--memory-stages", str, "cumulative instances of the memory runs, e.g. 30000,100000"),
    ):
        parser.add_argument(name, type=kind, help=f"{text} (default: the plan's)")
    args = parser.parse_args()
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
