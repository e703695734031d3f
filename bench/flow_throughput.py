"""Steady throughput of ``bench_flow.py``: the service's setups, the ladder's rungs and the Python
and kcat references, repeat by repeat."""

from __future__ import annotations

import contextlib
import cProfile
import resource
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import bytewax.operators as op
from bytewax.dataflow import Dataflow
from bytewax.operators import StatefulBatchLogic
from bytewax.testing import run_main

from flows.service.connectors.kafka import kafka_wiring
from flows.service.connectors.topics import Topics
from flows.service.dataflow import PARSERS, Guards, parse_route
from flows.service.instances.registry import LiveRegistry, Registry
from flows.service.runtime.gc_freezer import freeze_long_lived
from flows.service.runtime.process import Service
from flows.service.shards.logic import Routed
from flows.service.wire.events import Origin, Request
from flows.testing import kafka_broker

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the modules beside this one
import flow_references
from flow_kafka import Broker, Counter, answer_times, bulk_producer, log, new_topics, produce_all
from flow_plan import RUN_DEFAULT, Plan, registry_toml
from flow_service import check_alive, service_process
from flow_workload import workload


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
