"""The one dataflow builder: Kafka, files and tests differ only in sources and sinks.

```
requests ─ parse+route by shard ─┐                              ┌─ selections ─ sink
feedback ─ parse+route by shard ─┼─ merge ─ stateful+serialise ─┤
 (events ─ parse+route by shard)─┘        (per shard)           └─ dead letters (+ refusals)
```

Items are batches: a source emits what one read brought (one ``consume`` of a Kafka
partition), every step handles a list, and a shard receives its part of a batch in one
item. Bytewax's cost per item is then paid per batch, not per event. Events are routed by
instance to a fixed number of shards (``flows.service.logic``); a shard is one Bytewax key
and holds many instances.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bytewax.operators as op
from bytewax.dataflow import Dataflow, Stream
from bytewax.operators import StatefulBatchLogic

from flows.service import _parse
from flows.service.deadlines import WakeUps
from flows.service.events import (
    DEFAULT_DEAD_LETTER_RAW,
    DEFAULT_TS_WINDOW,
    DeadLetter,
    Feedback,
    Origin,
    Request,
    parse_event,
    parse_feedback,
    parse_request,
)
from flows.service.instance import Output
from flows.service.logic import Routed, ShardLogic, logic_builder, shard_of
from flows.service.metrics import count_dead_letter
from flows.service.registry import LiveRegistry, Registry
from flows.service.stream_clock import StreamClock

Message = tuple[bytes, Origin]
KeyedBytes = tuple[str, bytes]
Batch = list  # what one item of a stream holds: a list of messages, events or outputs


OpenSource = Callable[[Dataflow, str], tuple[Stream[Batch], Stream[Batch] | None]]
PARSERS = {"requests": parse_request, "events": parse_event, "feedback": parse_feedback}


@dataclass(frozen=True)
class Repartition:
    """An instance-keyed internal topic between the inputs and the stateful step (the
    Kafka Streams repartition pattern): ``sink`` writes batches of routed copies,
    ``source`` reads them back in the log's fixed order (dropping second copies a crash
    made), as batches of (bytes, the input message's own Origin)."""

    sink: Callable[[str, Stream[Any]], None]
    source: OpenSource
    parse: Callable[..., object]  # a copy's parser: its original's (by its origin's topic)


@dataclass(frozen=True)
class Wiring:
    """Where messages come from and go to.

    ``inputs`` maps a kind (``requests``, ``feedback``, or ``events`` for a combined stream)
    to a function that adds its source to the flow and returns a stream of batches of raw
    messages with their origin, plus a stream of batches of dead letters for messages the
    source itself could not deliver (e.g. Kafka errors) or None. ``selections`` and
    ``dead_letters`` consume streams of batches of (key, JSON bytes).
    """

    inputs: dict[str, OpenSource]
    selections: Callable[[str, Stream[KeyedBytes]], None]
    dead_letters: Callable[[str, Stream[KeyedBytes]], None]
    # replaces PARSERS[kind]; called as parse(raw, origin, ts_window=...)
    parsers: dict[str, Callable[..., object]] | None = None
    repartition: Repartition | None = None  # requests and feedback meet in one ordered log
    # an unbounded flow: instances wake up from one queue per worker (``deadlines``), not
    # from Bytewax's per-key timers, whose scan grows with every key waiting for a deadline;
    # the function says when the inputs are ending (the wake-ups end too)
    wake_ups: Callable[[], bool] | None = None
    # replays: each output is keyed by ``trace(what caused it)`` instead of its instance:
    # the event that made it, or the message itself when it was refused before reaching an
    # instance; None for what a wake-up or the end of the input closed (see ``Traced``).
    # ``trace`` is called once per input message.
    trace: Callable[[Any], Any] | None = None

    def __post_init__(self) -> None:
        unknown = set(self.inputs) - set(PARSERS)
        if unknown or not self.inputs:
            raise ValueError(f"inputs must be some of {sorted(PARSERS)}, got {sorted(self.inputs)}")


@dataclass(frozen=True)
class Guards:
    """What the flow refuses before any instance sees it, and how dead letters are bounded.

    ``ts_window``: an event's ``ts`` must lie within this many seconds of the wall clock.
    ``dead_letter_raw``: original bytes a dead letter carries whole (see ``DeadLetter``).
    ``skip``: (topic, partition, offset) of messages an operator chose to skip: each
    becomes a ``skipped`` dead letter carrying its bytes, and changes nothing else.

    >>> Guards(skip=parse_skips(["tsi.requests:0:17"])).skip
    frozenset({('tsi.requests', 0, 17)})
    """

    ts_window: float = DEFAULT_TS_WINDOW
    dead_letter_raw: int = DEFAULT_DEAD_LETTER_RAW
    skip: frozenset[tuple[str, int, int]] = field(default_factory=frozenset)

    def skipped(self, raw: bytes, origin: Origin) -> DeadLetter | None:
        """The dead letter of a message the operator skipped, else None."""
        if (origin.source, origin.partition, origin.offset) not in self.skip:
            return None
        return DeadLetter("skipped", "skipped by the operator (--skip-offset)", raw, origin)


def parse_skips(specs: list[str]) -> frozenset[tuple[str, int, int]]:
    """``TOPIC:PARTITION:OFFSET`` strings as a set (ValueError naming a bad one)."""
    out = set()
    for spec in specs:
        topic, _, rest = spec.rpartition(":")
        topic, _, partition = topic.rpartition(":")
        if not topic or not partition.isdigit() or not rest.isdigit():
            raise ValueError(f"must be TOPIC:PARTITION:OFFSET, got {spec!r}")
        out.add((topic, int(partition), int(rest)))
    return frozenset(out)


def route(registry: Registry, event: Request | Feedback) -> tuple[str, Routed] | DeadLetter:
    """(shard, (instance key, experiment, event)), or a dead letter for an unknown
    experiment or a missing unit. The experiment is looked up here, once per event."""
    experiment = registry.get(event.experiment)
    if experiment is None:
        return DeadLetter(
            "unknown_experiment",
            f"no experiment {event.experiment!r} in the registry",
            event.raw,
            event.origin,
        )
    try:
        key = experiment.instance_key(event.unit)
    except KeyError as exc:
        return DeadLetter("missing_field", exc.args[0], event.raw, event.origin)
    return shard_of(key), (key, experiment, event)


def parse_and_route(
    parse: Callable[..., object],
    guards: Guards,
    live: LiveRegistry,
    batch: Batch,
    grouped: bool = True,
) -> tuple[list, list[DeadLetter]]:
    """A batch of messages as routed events grouped by shard (``by_shard``; not
    ``grouped``: each (key, experiment, event) in the batch's order) and dead letters
    (each message one or the other). The standard parsers' batches take the compiled
    fast lane (``flows.service._parse``), and so do the internal topic's
    (``ParseBySource``); the lane hands every message it cannot decide exactly to the
    Python parser and ``route``."""
    registry, skip, window = live.current, guards.skip, guards.ts_window
    if not skip and _parse.has_lane(parse):
        return _parse.parse_and_route(parse, route, window, registry, batch, grouped)
    routed, dead = [], []
    for raw, origin in batch:
        event = guards.skipped(raw, origin) if skip else None
        if event is None:
            event = parse(raw, origin, ts_window=window)
        if not isinstance(event, DeadLetter):
            event = route(registry, event)
        (dead if isinstance(event, DeadLetter) else routed).append(event)
    if not grouped:
        return [item for _, item in routed], dead
    return by_shard(routed), dead


def _parse_and_route(
    name: str,
    messages: Stream[Batch],
    parse: Callable[..., object],
    guards: Guards,
    live: LiveRegistry,
    dead: list[Stream[Batch]],
    per_shard: bool = True,
) -> Stream:
    """Parse and route each batch; refusals join ``dead``. The routed events go on as
    one item per shard (``per_shard``: what the shards take), else as one item per batch,
    in its order (what the internal topic's copies are written from: its reader drops a
    copy whose input offset is below one it has read, ``_InternalPartition``)."""
    parse_batch = functools.partial(parse_and_route, parse, guards, live, grouped=per_shard)
    both = op.map(f"parse_{name}", messages, parse_batch)
    items = (lambda b: b[0]) if per_shard else (lambda b: [b[0]] if b[0] else [])
    routed = op.flat_map(f"routed_{name}", both, items)
    dead.append(op.flat_map(f"refused_{name}", both, lambda b: [b[1]] if b[1] else []))
    return routed


def unzip_batches(
    pairs: Stream[tuple[list, list]], first: str, second: str
) -> tuple[Stream, Stream]:
    """A stream of (batch, batch) pairs as two streams of batches, steps ``first`` and
    ``second``; empty batches are dropped."""
    return (
        op.flat_map(first, pairs, lambda b: [b[0]] if b[0] else []),
        op.flat_map(second, pairs, lambda b: [b[1]] if b[1] else []),
    )


def _through_internal_topic(
    flow: Dataflow,
    wiring: Wiring,
    routed: list[Stream[Batch]],
    guards: Guards,
    live: LiveRegistry,
    dead: list[Stream[Batch]],
) -> Stream[Batch]:
    """Stage 1 writes each routed event to the internal topic, keyed by instance; stage 2
    reads that one log, so every run sees an instance's events in the same order."""
    copies = op.map(
        "internal_copy",
        op.merge("to_internal", *routed),
        lambda batch: [(key, event.raw, event.origin) for key, _, event in batch],
    )
    wiring.repartition.sink("internal_out", copies)
    messages, errors = wiring.repartition.source(flow, "internal_in")
    if errors is not None:
        dead.append(errors)
    parse = wiring.repartition.parse
    return _parse_and_route("internal", messages, parse, guards, live, dead)


def by_shard(batch: Batch) -> list[tuple[str, list[Routed]]]:
    """Routed events, each (shard, routed), as one item per shard, each shard's events
    in order (the compiled lane of ``parse_and_route`` groups them the same way)."""
    shards: dict[str, list[Routed]] = {}
    for shard, routed in batch:
        events = shards.get(shard)
        if events is None:
            shards[shard] = [routed]
        else:
            events.append(routed)
    return list(shards.items())


def _wake_ups(
    flow: Dataflow, ending: Callable[[], bool], now: Callable[[], float]
) -> Stream[tuple[str, list[Routed]]]:
    """Each worker's due wake-ups, as events of their shards (no experiment attached)."""
    due = op.input("wake_ups", flow, WakeUps(ending, now))
    return op.map("wake_up_events", due, lambda kv: (kv[0], [(kv[0], None, kv[1])]))


class Traced(StatefulBatchLogic[Routed, tuple, Any]):
    """A shard that says which input caused each output: it handles its events one at a
    time and pairs every output with ``trace(event)``; outputs of a wake-up or of the end
    of the input are paired with None. Everything else is the shard's own (``ShardLogic``).
    """

    def __init__(self, logic: ShardLogic, trace: Callable[[Any], Any]) -> None:
        self.logic, self.trace = logic, trace

    def on_batch(self, values: list[list[Routed]]) -> tuple[list[tuple], bool]:
        out: list[tuple[Any, Any]] = []
        handle, trace = self.logic.handle, self.trace
        for batch in values:
            for routed in batch:
                tag = None if type(routed[2]) is str else trace(routed[2])
                out += [(tag, output) for output in handle([routed])]
        return _split_traced(out)

    def on_notify(self) -> tuple[list[tuple], bool]:
        return _split_traced([(None, output) for output in self.logic.wake()])

    def on_eof(self) -> tuple[list[tuple], bool]:
        return _split_traced([(None, output) for output in self.logic.finish()])

    def notify_at(self) -> Any:
        return self.logic.notify_at()

    def snapshot(self) -> Any:
        return self.logic.snapshot()


def _split_traced(outputs: list[tuple[Any, Output]]) -> tuple[list[tuple], bool]:
    """A ``Traced`` shard's outputs as one item, split as a shard's are
    (``flows.service.logic.Split``): selections and dead letters keep their tag."""
    if not outputs:
        return [], StatefulBatchLogic.RETAIN
    selections, dead = [], []
    for tag, out in outputs:
        if type(out) is DeadLetter:
            dead.append((tag, out))
        else:
            selections.append((tag, out.to_json()))
    return [(selections, dead)], StatefulBatchLogic.RETAIN


def _letters_json(raw: int, trace: Callable[[Any], Any] | None, batch: Batch) -> list[KeyedBytes]:
    """Dead letters as (key, JSON bytes), each counted once (all of them pass here): keyed by
    instance, or with ``trace`` by their tag (a refusal's own: ``trace(letter)``)."""
    if trace is None:
        return [(d.instance or "", count_dead_letter(d).to_json(raw)) for d in batch]
    out = []
    for item in batch:
        tag, letter = item if type(item) is tuple else (trace(item), item)
        out.append((tag, count_dead_letter(letter).to_json(raw)))
    return out


def build_flow(
    registry: Registry | LiveRegistry,
    wiring: Wiring,
    clock: Callable[[], float] = time.time,
    flow_id: str = "tsi",
    snapshots: bool = True,
    event_time: bool = False,
    guards: Guards = Guards(),
    stream: StreamClock | None = None,
    store: Path | None = None,
) -> Dataflow:
    """The serving dataflow. Step ids are stable: recovery state is keyed by them.

    ``snapshots=False`` when the flow runs without recovery: per-key snapshots are then
    never built (Bytewax asks for them at every epoch close regardless). ``event_time``
    for replays: the events' ``ts`` is the time (see ``flows.service.logic.ShardLogic``).
    ``guards``: the ts window, the dead letters' size bound, offsets to skip. A
    ``LiveRegistry`` lets the service swap the registry while the flow runs; ``stream``
    runs the time to live on stream time (the Kafka service). ``store``: where the
    shards append what each epoch changed (``flows.service.shard_store``); without it a
    shard's snapshot holds all its instances.
    """
    live = registry if isinstance(registry, LiveRegistry) else LiveRegistry(registry)
    flow = Dataflow(flow_id)
    dead: list[Stream[Batch]] = []
    routed: list[Stream[Batch]] = []
    # Requests first: when both topics have a backlog, the source built first is read
    # first, and feedback read before its request would crowd the early-feedback buffer.
    for name in (n for n in PARSERS if n in wiring.inputs):
        source, parse = wiring.inputs[name], (wiring.parsers or PARSERS).get(name, PARSERS[name])
        messages, source_errors = source(flow, f"{name}_in")
        if source_errors is not None:
            dead.append(source_errors)
        per_shard = wiring.repartition is None
        routed.append(_parse_and_route(name, messages, parse, guards, live, dead, per_shard))
    if wiring.repartition is not None:
        routed = [_through_internal_topic(flow, wiring, routed, guards, live, dead)]
    shards = [op.merge("routed", *routed)]
    if wiring.wake_ups is not None:
        shards.append(_wake_ups(flow, wiring.wake_ups, clock if stream is None else stream.now))
    builder = logic_builder(
        live, clock, snapshots, event_time, stream, wiring.wake_ups is not None, store
    )
    trace, shard = wiring.trace, builder
    if trace is not None:
        builder = lambda resume: Traced(shard(resume), trace)  # noqa: E731
    outputs = op.stateful_batch("shards", op.merge("events", *shards), builder)
    # (shard, (selections, dead letters)): each shard splits its outputs (``logic.Split``)
    selections = op.flat_map("selections", outputs, lambda kv: [kv[1][0]] if kv[1][0] else [])
    answer_dead = op.flat_map("answer_dead", outputs, lambda kv: [kv[1][1]] if kv[1][1] else [])
    dead.append(answer_dead)
    wiring.selections("selections_out", selections)
    letters = op.map(
        "dead_letter_json",
        op.merge("dead_letters", *dead),
        functools.partial(_letters_json, guards.dead_letter_raw, trace),
    )
    wiring.dead_letters("dead_letters_out", letters)
    return flow
