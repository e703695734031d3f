"""The one dataflow builder: Kafka, files and tests differ only in sources and sinks.

```
requests ─ parse_requests ─┐                          wake_ups ─┐
feedback ─ parse_feedback ─┼─ (internal topic) ─ routed ─ events ─┴─ shards ─ served ─ selections
 (events ─ parse_events) ──┘
the sources' and every step's errs ─ merged ─ dead letters (served's errs among them)
```

Each stage is a named composite step (Bytewax's ``@operator``) that returns ``OksErrs``:
what it passes on and what it refused, as Bytewax's own Kafka operators do; ``build_flow``
merges every ``errs`` into the dead letters. A flow's wiring is two objects: ``Inputs``
(the sources, their parsers, the internal topic, whether the inputs are unbounded) and
``Outputs`` (the sinks of the selections and the dead letters).

Items are batches: a source emits what one read brought (one ``consume`` of a Kafka
partition), every step handles a list, and a key group receives its part of a batch in
one item: (group, [(shard, events), ...]). Bytewax's cost per item is then paid per batch,
not per event. Events are routed by instance to a fixed number of shards, each holding
many instances, and shards to a few key groups, the Bytewax keys
(``flows.service.shards.group_logic``, ``keys.group_of``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bytewax.operators as op
from bytewax.dataflow import Dataflow, Stream, operator
from bytewax.operators import StatefulBatchLogic

from flows.service.instances.instance import Output
from flows.service.instances.registry import LiveRegistry, Registry
from flows.service.observe.metrics import count_dead_letter
from flows.service.observe.stream_clock import StreamClock
from flows.service.shards.changelog import Changelog
from flows.service.shards.deadlines import WakeUps, WakeUpScheduler
from flows.service.shards.group_logic import GroupLogic, Part, group_builder
from flows.service.shards.logic import Routed, flow_context
from flows.service.wire import _parse
from flows.service.wire._records import selection_json
from flows.service.wire.events import (
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
from flows.service.wire.keys import DEFAULT_SHARDS, group_of, in_groups, shard_name, shard_of

Message = tuple[bytes, Origin]
KeyedBytes = tuple[str, bytes]
Batch = list  # what one item of a stream holds: a list of messages, events or outputs


#: Adds a source to the flow as the step it is given: (batches of messages, batches of dead
#: letters for messages the source itself could not deliver, or None).
OpenSource = Callable[[Dataflow, str], tuple[Stream[Batch], Stream[Batch] | None]]
#: Adds a sink to the flow as the step it is given, writing a stream of batches.
OpenSink = Callable[[str, Stream[Batch]], None]
PARSERS = {"requests": parse_request, "events": parse_event, "feedback": parse_feedback}


@dataclass(frozen=True)
class Repartition:
    """An instance-keyed internal topic between the inputs and the stateful step (the
    Kafka Streams repartition pattern): ``sink`` writes batches of routed copies,
    ``source`` reads them back in the log's fixed order (dropping second copies a crash
    made), as batches of (bytes, the input message's own Origin)."""

    sink: OpenSink
    source: OpenSource
    parse: Callable[..., object]  # a copy's parser: its original's (by its origin's topic)


@dataclass(frozen=True)
class Inputs:
    """Where messages come from.

    ``sources`` maps a kind (``requests``, ``feedback``, or ``events`` for a combined
    stream) to the function that adds its source to the flow (``OpenSource``): batches of
    raw messages with their origin.
    """

    sources: dict[str, OpenSource]
    # replaces PARSERS[kind]; called as parse(raw, origin, ts_window=...)
    parsers: dict[str, Callable[..., object]] | None = None
    repartition: Repartition | None = None  # requests and feedback meet in one ordered log
    # unbounded inputs: says when they are ending. Such a flow wakes its instances from one
    # queue per worker (``deadlines.WakeUpScheduler``), not from Bytewax's per-key timers,
    # whose scan grows with every key waiting for a deadline; its wake-ups end with it
    ending: Callable[[], bool] | None = None

    def __post_init__(self) -> None:
        unknown = set(self.sources) - set(PARSERS)
        if unknown or not self.sources:
            kinds = sorted(self.sources)
            raise ValueError(f"sources must be some of {sorted(PARSERS)}, got {kinds}")

    def parser(self, kind: str) -> Callable[..., object]:
        """The parser of ``kind``'s messages."""
        return (self.parsers or PARSERS).get(kind, PARSERS[kind])


@dataclass(frozen=True)
class Outputs:
    """Where the flow's outputs go: ``selections`` and ``dead_letters`` write streams of
    batches of (key, JSON bytes) (``OpenSink``)."""

    selections: OpenSink
    dead_letters: OpenSink
    # replays: each output is keyed by ``trace(what caused it)`` instead of its instance:
    # the event that made it, or the message itself when it was refused before reaching an
    # instance; None for what a wake-up or the end of the input closed (see ``Traced``).
    # ``trace`` is called once per input message.
    trace: Callable[[Any], Any] | None = None


@dataclass(frozen=True)
class Wiring:
    """A flow's inputs and outputs: Kafka, files, memory and replays differ only here."""

    inputs: Inputs
    outputs: Outputs


@dataclass(frozen=True)
class OksErrs:
    """What a composite step passes on (``oks``) and what it refused (``errs``: batches of
    dead letters), as Bytewax's own composite Kafka operators return their streams."""

    oks: Stream[Batch]
    errs: Stream[Batch]


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


def route(
    registry: Registry, event: Request | Feedback, shards: int = DEFAULT_SHARDS
) -> tuple[str, Routed] | DeadLetter:
    """(shard of ``shards``, (instance key, experiment, event)), or a dead letter for an
    unknown experiment or a missing unit. The experiment is looked up here, once per
    event."""
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
    return shard_of(key, shards), (key, experiment, event)


def parse_and_route(
    parse: Callable[..., object],
    guards: Guards,
    live: LiveRegistry,
    batch: Batch,
    grouped: bool = True,
    shards: int = DEFAULT_SHARDS,
) -> tuple[list, list[DeadLetter]]:
    """A batch of messages as routed events grouped by key group and shard of ``shards``
    (``by_group``; not ``grouped``: each (key, experiment, event) in the batch's order)
    and dead letters (each message one or the other). The standard parsers' batches take
    the compiled fast lane (``flows.service.wire._parse``), and so do the internal topic's
    (``ParseBySource``); the lane hands every message it cannot decide exactly to the
    Python parser and ``route``."""
    registry, skip, window = live.current, guards.skip, guards.ts_window
    if not skip and _parse.has_lane(parse):
        return _parse.parse_and_route(parse, route, window, registry, batch, grouped, shards)
    routed, dead = [], []
    for raw, origin in batch:
        event = guards.skipped(raw, origin) if skip else None
        if event is None:
            event = parse(raw, origin, ts_window=window)
        if not isinstance(event, DeadLetter):
            event = route(registry, event, shards)
        (dead if isinstance(event, DeadLetter) else routed).append(event)
    if not grouped:
        return [item for _, item in routed], dead
    return by_group(routed, shards), dead


@operator
def parse_route(
    step_id: str,
    messages: Stream[Batch],
    parse: Callable[..., object],
    guards: Guards,
    live: LiveRegistry,
    per_shard: bool = True,
    shards: int = DEFAULT_SHARDS,
) -> OksErrs:
    """Parse and route each batch: ``oks`` the routed events, ``errs`` the refusals (a
    malformed message, an unknown experiment, a skipped offset, ...). The routed events go
    on as one item per key group (``per_shard``: what the stateful step takes,
    ``by_group``), else as one item per batch, in its order (what the internal topic's
    copies are written from: its reader drops a copy whose input offset is below one it
    has read, ``InternalPartition``). ``shards``: the flow's shard count."""
    parse_batch = functools.partial(
        parse_and_route, parse, guards, live, grouped=per_shard, shards=shards
    )
    both = op.map("parse", messages, parse_batch)
    items = (lambda b: b[0]) if per_shard else (lambda b: [b[0]] if b[0] else [])
    return OksErrs(
        op.flat_map("routed", both, items),
        op.flat_map("refused", both, lambda b: [b[1]] if b[1] else []),
    )


def unzip_batches(
    pairs: Stream[tuple[list, list]], first: str, second: str
) -> tuple[Stream, Stream]:
    """A stream of (batch, batch) pairs as two streams of batches, steps ``first`` and
    ``second``; empty batches are dropped."""
    return (
        op.flat_map(first, pairs, lambda b: [b[0]] if b[0] else []),
        op.flat_map(second, pairs, lambda b: [b[1]] if b[1] else []),
    )


@operator
def copy_routed(step_id: str, *routed: Stream[Batch]) -> Stream[Batch]:
    """Batches of routed events as batches of (instance key, raw bytes, origin): what the
    internal topic's sink writes."""
    return op.map(
        "copy",
        op.merge("merge", *routed),
        lambda batch: [(key, event.raw, event.origin) for key, _, event in batch],
    )


def through_internal_topic(
    flow: Dataflow,
    repartition: Repartition,
    routed: list[Stream[Batch]],
    guards: Guards,
    live: LiveRegistry,
    shards: int = DEFAULT_SHARDS,
) -> OksErrs:
    """The internal topic's round trip: each routed event is written to the internal topic,
    keyed by instance (``to_internal``), and that one log is read back and routed again
    (``parse_internal``), so every run sees an instance's events in the same order.
    ``oks``: the events read back, by key group; ``errs``: the reader's refusals.

    Its two composite steps are ``@operator`` steps; the sink and source between them stay
    steps of the flow itself (``internal_out``, ``internal_in``): recovery keys the
    source's offsets by its step id, which an operator around it would change
    (``flow.step.internal_in``)."""
    repartition.sink("internal_out", copy_routed("to_internal", *routed))
    messages, unread = repartition.source(flow, "internal_in")
    read = parse_route("parse_internal", messages, repartition.parse, guards, live, shards=shards)
    errs = read.errs if unread is None else op.merge("internal_refused", unread, read.errs)
    return OksErrs(read.oks, errs)


def by_group(batch: Batch, shards: int = DEFAULT_SHARDS) -> list[tuple[str, list[Part]]]:
    """Routed events, each (shard of ``shards``, routed), as one item per key group:
    (group, [(shard, its events in order), ...]) (``keys.in_groups``; the compiled lane of
    ``parse_and_route`` groups them the same way).

    >>> routed = [("shard-001-of-002", "a"), ("shard-000-of-002", "b"), ("shard-001-of-002", "c")]
    >>> by_group(routed, 2)  # doctest: +NORMALIZE_WHITESPACE
    [('group-001-of-002', [('shard-001-of-002', ['a', 'c'])]),
     ('group-000-of-002', [('shard-000-of-002', ['b'])])]
    """
    return in_groups(by_shard(batch), shards)


def by_shard(batch: Batch) -> list[tuple[str, list[Routed]]]:
    """Routed events, each (shard, routed), as one item per shard, each shard's events
    in order."""
    shards: dict[str, list[Routed]] = {}
    for shard, routed in batch:
        events = shards.get(shard)
        if events is None:
            shards[shard] = [routed]
        else:
            events.append(routed)
    return list(shards.items())


def wake_up_events(
    flow: Dataflow,
    scheduler: WakeUpScheduler,
    ending: Callable[[], bool],
    now: Callable[[], float],
    shards: int = DEFAULT_SHARDS,
) -> Stream[tuple[str, list[Part]]]:
    """Each worker's due wake-ups in ``scheduler``, as events of their shards (no
    experiment attached), each to its shard's key group of a flow of ``shards``; the
    ``wake_ups`` source, until ``ending()``."""
    due = op.input("wake_ups", flow, WakeUps(scheduler, ending, now))
    return op.map("wake_up_events", due, functools.partial(_wake_up_event, shards))


def _wake_up_event(shards: int, due: tuple[str, Any]) -> tuple[str, list[Part]]:
    """A wake-up of a shard as its key group's item."""
    shard = due[0]
    return group_of(shard, shards), [(shard, [(shard, None, due[1])])]


def shard_step(
    events: Stream[tuple[str, list[Part]]],
    builder: Callable[[Any], StatefulBatchLogic],
) -> OksErrs:
    """The stateful step ``shards`` (one ``builder`` logic per key group) and its outputs
    split (``served``): ``oks`` the selections' batches of (key, JSON), ``errs`` the dead
    letters the shards wrote. The stateful step stays a step of the flow itself: recovery
    keys the groups' state by its id, ``flow.shards``."""
    return split_served("served", op.stateful_batch("shards", events, builder))


@operator
def split_served(step_id: str, served: Stream[tuple[str, tuple[list, list]]]) -> OksErrs:
    """A key group's (group, (selections, dead letters)) items (``logic.Split``) as two
    streams of non-empty batches."""
    return OksErrs(
        op.flat_map("selections", served, lambda kv: [kv[1][0]] if kv[1][0] else []),
        op.flat_map("dead", served, lambda kv: [kv[1][1]] if kv[1][1] else []),
    )


class Traced(StatefulBatchLogic[list[Part], tuple, Any]):
    """A key group that says which input caused each output: it handles its events one
    at a time and pairs every output with ``trace(event)``; outputs of a wake-up or of the
    end of the input are paired with None. Everything else is the group's own
    (``GroupLogic``).
    """

    def __init__(self, logic: GroupLogic, trace: Callable[[Any], Any]) -> None:
        self.logic, self.trace = logic, trace

    def on_batch(self, values: list[list[Part]]) -> tuple[list[tuple], bool]:
        out: list[tuple[Any, Any]] = []
        handle, trace = self.logic.handle, self.trace
        for item in values:
            for shard, events in item:
                for routed in events:
                    tag = None if routed[1] is None else trace(routed[2])  # a wake-up: no input
                    out += [(tag, output) for output in handle([(shard, [routed])])]
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
    """A ``Traced`` group's outputs as one item, split as a group's are
    (``flows.service.shards.logic.Split``): selections and dead letters keep their tag."""
    if not outputs:
        return [], StatefulBatchLogic.RETAIN
    selections, dead = [], []
    for tag, out in outputs:
        if out.dead_letter:
            dead.append((tag, out))
        else:
            selections.append((tag, selection_json(out)))
    return [(selections, dead)], StatefulBatchLogic.RETAIN


def _traced(trace: Callable[[Any], Any], batch: Batch) -> list[tuple[Any, DeadLetter]]:
    """Refusals paired with their tag, as a ``Traced`` group pairs its dead letters: a
    refusal's own, ``trace(letter)``."""
    return [(trace(letter), letter) for letter in batch]


def _letters_json(raw: int, tagged: bool, batch: Batch) -> list[KeyedBytes]:
    """Dead letters as (key, JSON bytes), each counted once (all of them pass here): keyed by
    instance, or (``tagged``: each a (tag, letter) pair, ``Traced``) by their tag."""
    if not tagged:
        return [(d.instance or "", count_dead_letter(d).to_json(raw)) for d in batch]
    return [(tag, count_dead_letter(d).to_json(raw)) for tag, d in batch]


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
    changelog: Changelog | None = None,
    holds: Callable[[int], bool] | None = None,
    shards: int = DEFAULT_SHARDS,
    handover: dict[str, dict[str, Any]] | None = None,
) -> Dataflow:
    """The serving dataflow. Step ids are stable: recovery state is keyed by them.

    ``snapshots=False`` when the flow runs without recovery: per-key snapshots are then
    never built (Bytewax asks for them at every epoch close regardless). ``event_time``
    for replays: the events' ``ts`` is the time (see ``flows.service.shards.logic.ShardLogic``).
    ``guards``: the ts window, the dead letters' size bound, offsets to skip. A
    ``LiveRegistry`` lets the service swap the registry while the flow runs; ``stream``
    runs the time to live on stream time (the Kafka service). ``store``: where the
    shards append what each epoch changed (``flows.service.shards.shard_log``); without it a
    shard's snapshot holds all its instances. ``changelog`` (with ``store``): where each
    shard's log is mirrored (``flows.service.shards.changelog``). ``holds``: members, whether
    this member holds a shard index (``Members.holds``; the others it resumes lie dormant).
    ``shards``: the flow's shard count (its store's: ``flows.service.runtime.shard_count``);
    it moves instances between shards, never changes what they serve. ``handover``: the
    resumed states of keys of one shard (a store from before key groups,
    ``group_logic.Retired``), read from the store before the flow starts, so that a key
    group finds them whichever worker builds the old key.
    """
    live = registry if isinstance(registry, LiveRegistry) else LiveRegistry(registry)
    inputs, outputs = wiring.inputs, wiring.outputs
    flow = Dataflow(flow_id)
    routed, errs = _read_inputs(flow, inputs, guards, live, shards)
    events = [op.merge("routed", *routed)]
    now, first = (clock if stream is None else stream.now), _restored(changelog, holds, shards)
    scheduler = _wake_ups(flow, inputs, events, now, first, shards)
    context = flow_context(
        live,
        clock,
        snapshots,
        event_time,
        stream,
        scheduler,
        store,
        changelog=changelog,
        holds=holds,
        shards=shards,
        handover=handover,
    )
    builder = _traced_builder(group_builder(context), outputs.trace)
    served = shard_step(op.merge("events", *events), builder)
    outputs.selections("selections_out", served.oks)
    _write_dead_letters(outputs, errs, served.errs, guards.dead_letter_raw)
    return flow


def _wake_ups(
    flow: Dataflow,
    inputs: Inputs,
    events: list[Stream],
    now: Callable[[], float],
    first: list[str],
    shards: int,
) -> WakeUpScheduler | None:
    """With unbounded inputs, the flow's wake-up scheduler (its first wake-ups: ``first``)
    and its source, added to ``events``: the shards wish their wake-ups into it and the
    source reads them back as events of the shards. None for bounded inputs."""
    if inputs.ending is None:
        return None
    scheduler = WakeUpScheduler(first)
    events.append(wake_up_events(flow, scheduler, inputs.ending, now, shards))
    return scheduler


def _restored(
    changelog: Changelog | None, holds: Callable[[int], bool] | None, shards: int
) -> list[str]:
    """The shards a start restores (with a changelog: every one this member holds), each
    woken as the flow starts so that it starts then (``WakeUpScheduler.first``)."""
    if changelog is None:
        return []
    return [shard_name(i, shards) for i in range(shards) if holds is None or holds(i)]


def _read_inputs(
    flow: Dataflow, inputs: Inputs, guards: Guards, live: LiveRegistry, shards: int
) -> tuple[list[Stream[Batch]], list[Stream[Batch]]]:
    """Every source parsed and routed (through the internal topic when there is one): the
    streams of routed events, and every refusal's stream (the sources' own among them)."""
    routed: list[Stream[Batch]] = []
    errs: list[Stream[Batch]] = []
    per_shard = inputs.repartition is None
    # Requests first: when both topics have a backlog, the source built first is read
    # first, and feedback read before its request would crowd the early-feedback buffer.
    for name in (n for n in PARSERS if n in inputs.sources):
        messages, unread = inputs.sources[name](flow, f"{name}_in")
        parsed = parse_route(
            f"parse_{name}", messages, inputs.parser(name), guards, live, per_shard, shards
        )
        routed.append(parsed.oks)
        errs += [parsed.errs] if unread is None else [unread, parsed.errs]
    if inputs.repartition is not None:
        internal = through_internal_topic(flow, inputs.repartition, routed, guards, live, shards)
        return [internal.oks], [*errs, internal.errs]
    return routed, errs


def _traced_builder(
    builder: Callable[[Any], StatefulBatchLogic], trace: Callable[[Any], Any] | None
) -> Callable[[Any], StatefulBatchLogic]:
    """``builder``, its key groups wrapped in ``Traced`` when the outputs are traced."""
    if trace is None:
        return builder

    def traced(resume: Any) -> StatefulBatchLogic:
        logic = builder(resume)
        return Traced(logic, trace) if isinstance(logic, GroupLogic) else logic

    return traced


def _write_dead_letters(
    outputs: Outputs, refusals: list[Stream[Batch]], shard_letters: Stream[Batch], raw: int
) -> None:
    """Every refusal and the shards' dead letters, as JSON, to the dead-letter sink; traced
    outputs tag the refusals too (every dead letter a (tag, letter) pair)."""
    if outputs.trace is not None:
        refused = op.merge("refusals", *refusals)
        refusals = [op.map("traced_refusals", refused, functools.partial(_traced, outputs.trace))]
    letters = op.map(
        "dead_letter_json",
        op.merge("dead_letters", *refusals, shard_letters),
        functools.partial(_letters_json, raw, outputs.trace is not None),
    )
    outputs.dead_letters("dead_letters_out", letters)
