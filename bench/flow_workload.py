"""The workload of ``bench_flow.py``: its keys, its messages and the topics they are produced into
before a throughput run."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the modules beside this one
from flow_plan import EXPERIMENT


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
