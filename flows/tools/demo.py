"""``tsi demo``: the real dataflow, in this process, on generated traffic that answers back.

A closed loop: the source emits the demo's events in time order; every selection the
dataflow emits goes to ``Demo.respond``, whose feedback is queued at its (later) time.
Before the source emits the next request it waits until every earlier request has been
answered, so feedback is always queued before anything that comes after it in time: the
run is exactly what a live service would have seen, only faster. Time is the events' own
``ts`` (the flow runs on event time), so a run is reproducible.

The loop counts what it puts in on purpose (``injected``): broken messages, lost,
duplicated and late feedback, so the report can set the dead letters beside them.

>>> run = run_demo(generate(n_requests=300, seed=2))
>>> len(run.selections) >= 300 - 10, {d["reason"] for d in run.dead_letters} >= {"malformed_json"}
(True, True)
>>> {f.what: f.count for f in injected(run).faults}["broken message: not valid JSON"]
2
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from bytewax.dataflow import Dataflow, Stream
from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
from bytewax.outputs import DynamicSink, StatelessSinkPartition
from bytewax.testing import run_main

from flows.service.connectors.memory import one_per_batch, unbatched
from flows.service.dataflow import Inputs, Outputs, Wiring, build_flow
from flows.service.instances.registry import Registry
from flows.service.wire.events import Origin
from flows.tools.report_data import Fault, Injected, ServedLog, log_events, request_contexts
from flows.tools.traffic import Demo, _ts, generate, registry_toml

SOURCE = "demo"


@dataclass
class Loop:
    """The shared state of the closed loop (one worker, one process)."""

    demo: Demo
    progress: Callable[[int], None] | None = None
    ttl: dict[str, float] = field(default_factory=dict)  # feedback_ttl of each experiment
    defaulting: frozenset[str] = frozenset()  # the experiments with a default_loss
    waiting: list[tuple[float, int, bytes]] = field(default_factory=list)  # heap by time
    unanswered: set[int] = field(default_factory=set)  # offsets of requests in flight
    selections: list[dict[str, Any]] = field(default_factory=list)
    dead_letters: list[dict[str, Any]] = field(default_factory=list)
    sent: list[bytes] = field(default_factory=list)  # every message, in the order served
    now: float = 0.0
    lost: Counter[str] = field(default_factory=Counter)  # requests never answered (or converted)
    duplicated: Counter[str] = field(default_factory=Counter)  # feedback sent twice
    late: Counter[str] = field(default_factory=Counter)  # feedback after the TTL
    delayed: Counter[str] = field(default_factory=Counter)  # feedback sent (all delayed)
    _next: int = 0
    _offsets: itertools.count = field(default_factory=itertools.count)
    _request_of: dict[str, int] = field(default_factory=dict)
    _times: list[float] = field(default_factory=list)  # of demo.events, read once

    def __post_init__(self) -> None:
        self._times = [_ts(raw) for raw in self.demo.events]

    def next_event(self) -> tuple[bytes, Origin] | None:
        """The next event in time order, or None while requests are in flight."""
        events = self.demo.events
        pending = self._next < len(events)
        due = self.waiting[0][0] if self.waiting else None
        if pending and (due is None or self._times[self._next] <= due):
            if self.unanswered:
                return None  # its feedback may not be queued yet
            raw = events[self._next]
            self._next += 1
            offset = next(self._offsets)
            self.unanswered.add(offset)
            if self.progress is not None:
                self.progress(1)
            rid = _request_id(raw)
            if rid is not None:
                self._request_of[rid] = offset
            self.now = max(self.now, self._times[self._next - 1])
        elif due is not None:
            _, _, raw = heapq.heappop(self.waiting)
            offset = next(self._offsets)
            self.now = max(self.now, due)
        else:
            raise StopIteration
        self.sent.append(raw)
        return raw, Origin(SOURCE, 0, offset)

    def on_selection(self, selection: dict[str, Any]) -> None:
        self.selections.append(selection)
        self.unanswered.discard(self._request_of.get(selection["request_id"], -1))
        answers = self.demo.respond(selection)
        experiment, requested, _ = self.demo.truth[selection["request_id"]]
        if not answers:
            self.lost[experiment] += 1
        elif len(answers) > 1:
            self.duplicated[experiment] += len(answers) - 1
        for raw in answers:
            self.delayed[experiment] += 1
            heapq.heappush(self.waiting, (_ts(raw), next(self._offsets), raw))
        if answers and _ts(answers[0]) - requested > self.ttl.get(experiment, float("inf")):
            self.late[experiment] += 1

    def on_dead_letter(self, letter: dict[str, Any]) -> None:
        self.dead_letters.append(letter)
        if letter["reason"] != "ticket_expired":  # that one names its request again
            self.unanswered.discard(letter["offset"])


def _request_id(raw: bytes) -> str | None:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return data.get("request_id") if isinstance(data, dict) else None


class _LoopPartition(StatefulSourcePartition[tuple[bytes, Origin], None]):
    def __init__(self, loop: Loop) -> None:
        self.loop = loop

    def next_batch(self) -> list[tuple[bytes, Origin]]:
        event = self.loop.next_event()
        return [] if event is None else [event]

    def snapshot(self) -> None:
        return None


class _LoopSource(FixedPartitionedSource[tuple[bytes, Origin], None]):
    def __init__(self, loop: Loop) -> None:
        self.loop = loop

    def list_parts(self) -> list[str]:
        return ["loop"]

    def build_part(self, step_id: str, for_part: str, resume_state: None) -> _LoopPartition:
        return _LoopPartition(self.loop)


class _CallbackPartition(StatelessSinkPartition[tuple[str, bytes]]):
    def __init__(self, callback: Callable[[dict[str, Any]], None]) -> None:
        self.callback = callback

    def write_batch(self, items: list[tuple[str, bytes]]) -> None:
        for _key, raw in items:
            self.callback(orjson.loads(raw))


class _CallbackSink(DynamicSink[tuple[str, bytes]]):
    def __init__(self, callback: Callable[[dict[str, Any]], None]) -> None:
        self.callback = callback

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _CallbackPartition:
        return _CallbackPartition(self.callback)


def loop_wiring(loop: Loop) -> Wiring:
    """The one dataflow's wiring for the closed loop: one combined input, callback sinks."""

    def source(flow: Dataflow, step: str) -> tuple[Stream, None]:
        return one_per_batch(flow, step, _LoopSource(loop)), None

    return Wiring(
        Inputs({"events": source}),
        Outputs(
            selections=lambda step, up: unbatched(step, up, _CallbackSink(loop.on_selection)),
            dead_letters=lambda step, up: unbatched(step, up, _CallbackSink(loop.on_dead_letter)),
        ),
    )


def run_demo(
    demo: Demo, registry: Registry | None = None, progress: Callable[[int], None] | None = None
) -> Loop:
    """Run the serving dataflow on the demo's traffic; returns everything that went by."""
    registry = registry or Registry.from_toml(registry_toml(demo.scenarios, demo.seed))
    ttl = {name: e.feedback_ttl for name, e in registry.experiments.items()}
    defaulting = frozenset(n for n, e in registry.experiments.items() if e.default_loss is not None)
    loop = Loop(demo, progress, ttl, defaulting)
    flow = build_flow(
        registry, loop_wiring(loop), clock=lambda: loop.now, flow_id="tsi-demo", event_time=True
    )
    run_main(flow)
    return loop


def _broken_kind(raw: bytes, demo: Demo) -> tuple[str, str]:
    """(what is wrong with a message the demo broke on purpose, the dead letter it gives)."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return "broken message: not valid JSON", "malformed_json"
    scenario = {s.name: s for s in demo.scenarios}.get(data.get("experiment"))
    if scenario is None:
        return "broken message: an experiment that does not exist", "unknown_experiment"
    if scenario.units and "unit" not in data:
        return "broken message: a per-user request without its unit", "missing_field"
    return "broken message: other", "?"


def injected(loop: Loop) -> Injected:
    """What the demo put into the stream on purpose, counted as it went (for the report).

    Broken messages are the events that are not one of the demo's requests.
    """
    demo = loop.demo
    broken = Counter(
        _broken_kind(raw, demo) for raw in demo.events if _request_id(raw) not in demo.truth
    )
    faults = [Fault(what, n, (reason,)) for (what, reason), n in sorted(broken.items())]
    lost, silent = _split(loop.lost, loop.defaulting)
    late, late_defaulted = _split(loop.late, loop.defaulting)
    faults += [
        Fault("feedback sent twice", sum(loop.duplicated.values()), ("duplicate_feedback",)),
        Fault("feedback never sent (lost)", lost, ("ticket_expired",)),
        Fault(
            "feedback later than its experiment's TTL", late, ("ticket_expired", "late_feedback")
        ),
    ]
    if loop.defaulting:  # a window without feedback ends with default_loss: no dead letter
        faults += [
            Fault("no feedback (no conversion) where `default_loss` is set", silent),
            Fault(
                "feedback later than the TTL where `default_loss` is set",
                late_defaulted,
                ("late_feedback",),
            ),
        ]
    faults.append(
        Fault("feedback delayed (all of it; see the delay plot)", sum(loop.delayed.values()))
    )
    feedback = {s.name: (s.delay_mean, s.missing) for s in demo.scenarios}
    return Injected(tuple(faults), feedback)


def _split(counts: Counter[str], defaulting: frozenset[str]) -> tuple[int, int]:
    """(total over the experiments without a default_loss, total over those with one)."""
    with_default = sum(n for name, n in counts.items() if name in defaulting)
    return sum(counts.values()) - with_default, with_default


def served_log(loop: Loop) -> ServedLog:
    """The stream as the report reads it: what was served, the feedback sent, the truth."""
    messages = [(raw, Origin(SOURCE)) for raw in loop.sent]
    request_ts, feedback = log_events(messages)
    truth = {rid: means for rid, (_, _, means) in loop.demo.truth.items()}
    return ServedLog(
        loop.selections, feedback, loop.dead_letters, request_ts, truth, request_contexts(messages)
    )


__all__ = ["Loop", "generate", "injected", "loop_wiring", "run_demo", "served_log"]
