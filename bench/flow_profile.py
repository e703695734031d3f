"""The profile of ``bench_flow.py``: cProfile of a throughput run, own time put into groups by
file."""

from __future__ import annotations

import cProfile
import pstats
import sys
from pathlib import Path
from typing import Any

from flows.service.instances.registry import Registry

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the modules beside this one
from flow_kafka import Broker, Counter, log
from flow_throughput import Input, run_once

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
