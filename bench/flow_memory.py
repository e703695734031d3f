"""Memory per instance of ``bench_flow.py``: a background service's RSS over stages of new units,
and two decompositions."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from flows.service.instances.instance import Instance
from flows.service.instances.registry import Registry
from flows.service.wire.events import Origin, parse_feedback, parse_request

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the modules beside this one
from flow_kafka import Broker, Counter, bulk_producer, log, new_topics, produce_all
from flow_plan import EXPERIMENT, HELPERS, ROOT, RUN_DEFAULT, WARM_UNITS, Plan, registry_toml
from flow_service import check_alive, service_process, wait_for
from flow_throughput import TSI_RUN_RECOVERY
from flow_workload import feedback_value, instance_key, loss_of, request_value


def rss_of(pid: int) -> dict[str, int]:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {
        "rss": psutil.Process(pid).memory_info().rss,
        "hwm": int(fields["VmHWM"].split()[0]) * 1024,
    }


@dataclass(frozen=True)
class MemoryVariant:
    name: str
    feedback_ttl: float
    events: bool  # each request followed by its feedback on the combined events topic
    idle_wait: float  # seconds to wait after the last answer before reading the RSS
    rounds: int = 1  # decisions per unit (with events: each with its loss), round by round


# RSS is read 12 s after the last answer: the 10 s epoch has closed and packed the bandits
# its keys touched (what a service with many more users than active ones holds)
OPEN_TICKETS = MemoryVariant("open ticket (request, no feedback; TTL 3600 s)", 3600.0, False, 12.0)
IDLE = MemoryVariant("idle (request + feedback, events topic; TTL 1 s, expired)", 1.0, True, 12.0)
# a long-lived user's idle instance: its arms have had gaps, so its bandit packs larger
# than after the first loss alone (which makes no gap); measured beside IDLE at one stage
SEASONED = MemoryVariant(
    "seasoned idle (20 rounds of request + feedback, events topic; TTL 1 s, expired)",
    1.0,
    True,
    12.0,
    rounds=20,
)


def memory_messages(
    topics: dict[str, str], units: Iterable[str], rid: str, rounds: int = 1
) -> Iterator[tuple[str, str, bytes]]:
    """One request per unit and round, or request then feedback on the events topic (a
    loss that differs from round to round, so the arms have gaps); round by round, every
    unit in each."""
    units = list(units)
    for r in range(rounds):
        for i, unit in enumerate(units):
            key, ask = instance_key(unit), rid if rounds == 1 else f"{rid}{r}"
            if "events" in topics:
                yield topics["events"], key, request_value(unit, ask, typed=True)
                loss = 1.0 if r == 0 else loss_of(i * rounds + r)
                yield topics["events"], key, feedback_value(unit, ask, loss, typed=True)
            else:
                yield topics["requests"], key, request_value(unit, ask)


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
    logfile = workdir / f"memory-ttl-{variant.feedback_ttl:g}-rounds-{variant.rounds}.log"
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
            units = (f"u{i}" for i in range(done, n))
            produce_all(producer, memory_messages(topics, units, "r", variant.rounds))
            wait_for(counter, topics["sel"], WARM_UNITS + n * variant.rounds, proc, logfile)
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
        "seasoned": memory_run(
            bk, SEASONED, plan.seasoned_stages, counter, workdir, plan.memory_recovery
        ),
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
