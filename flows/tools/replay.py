"""``tsi replay``: a logged stream through the serving dataflow, on event time, in order.

**Input, read lazily** (``flows.tools.replay_input``). The combined events file as it
is; or requests and feedback merged by ``ts`` (``merge_by_time``, a heap merge: each file
keeps its own order, a line without a valid ``ts`` keeps the time of the line before it in
its file, ties go to the requests); or Kafka topic ranges merged across partitions and
topics by Kafka timestamp (``kafka_range``, a k-way merge): a combined topic, the two
input topics (each of one kind, ``TopicLog``), or the service's internal topic, its
copies read as the service reads them (each as its original; a second copy dropped; a
message that is no copy its ``not_a_copy`` dead letter). Nothing holds the whole log:
memory is one epoch of outputs plus the instances' own state.

**Time.** Every line is handled at its event time (``flows.service.shards.logic.ShardLogic``
expires an instance's deadlines when its next event passes them):

* read from Kafka: its Kafka timestamp, whatever its ``ts``, as the service's stream time
  has it (``flows.service.shards.stream_clock``), so that a window closed by
  ``default_loss`` closes where it closed in the service;
* else its own ``ts`` when it is valid: a finite number of Unix seconds within
  [``TS_MIN``, ``TS_MAX``] = [0, 1e11], 1970 to about the year 5100. The service's window
  around the wall clock does not apply here: a log may be older than ten years;
* no ``ts``: the time of the previous event (the last line that reached an instance; 0
  before any), never a later line's;
* a numeric ``ts`` out of range (``1e308``, ``-1``): the dead letter ``ts_out_of_range``;
  a ``ts`` that is not a number (``"NaN"``, ``true``): ``wrong_type``, the service's own.
  Like every dead letter these change nothing: no instance sees them and the clock does
  not move (a ``ts`` is checked on Kafka too). Neither does a line refused for any other
  reason (bad JSON, unknown experiment, ...).

**The end of the log** is the end of time: what is still pending there -- open tickets
whose feedback never came, feedback whose request never came -- is closed with the
service's own reasons, ``ticket_expired`` and ``unknown_ticket``, each detail ending with
``AT_END``, and kept apart (``Replayed.at_end``, ``pending_at_end.jsonl``): the dead letters
are what the lines themselves caused, as the service wrote them.

**Accounting.** Every line ends as a selection (a request served, or a retry answered
again), an applied feedback, or a dead letter about it: ``Replayed.unaccounted`` is 0. A
``ticket_expired`` letter is a second outcome of a served request, not a line of its own.

**Order.** Outputs follow the lines that caused them: each is tagged with the position of
its cause (``flows.service.dataflow.Outputs.trace``), and each sink sorts what an epoch
brought when Bytewax closes that epoch (everything of it has arrived then, nothing later
has) and writes it. Within one line, the service's order: an expiry the event caused
comes before its own answer. The letters at the end come last, in the order of the lines
they are about (file and line; partition and offset). So a replay of a served log writes
its selections byte for byte in order: the demo's ``selections.jsonl`` from its
``events.jsonl``.

>>> from flows.service.instances.registry import Registry
>>> reg = Registry.from_toml('[experiments.home]\\narms = ["a", "b"]')
>>> raw = b'{"type":"request","experiment":"home","request_id":"r1","ts":1767225600}'
>>> out = replay([(raw, Origin("f", None, 1)), (b"{", Origin("f", None, 2))], reg)
>>> [s["arm_name"] in ("a", "b") for s in out.selections], [d["reason"] for d in out.dead_letters]
([True], ['malformed_json'])
>>> [d["reason"] for d in out.at_end], out.unaccounted
(['ticket_expired'], 0)
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import bytewax.operators as op
import orjson
from bytewax.dataflow import Dataflow, Stream
from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
from bytewax.outputs import FixedPartitionedSink, StatefulSinkPartition
from bytewax.testing import run_main

from flows.service import dataflow
from flows.service.dataflow import Message, build_flow, route
from flows.service.instances.registry import Registry
from flows.service.wire.events import (
    DeadLetter,
    Feedback,
    Origin,
    Request,
    parse_event,
    parse_feedback,
    parse_request,
)
from flows.tools.replay_input import TS_MAX, TS_MIN, ReplayError, valid_ts

#: lines per item of the dataflow's input
BATCH = 500
#: how often Bytewax closes an epoch: the outputs held before they are sorted and written
EPOCH = timedelta(milliseconds=100)
#: appended to the detail of what the end of the log closed
AT_END = " (still pending at the end of the log)"
#: dead letters about a feedback line (the others are about a request or any line)
FEEDBACK_REASONS = frozenset(
    {"duplicate_feedback", "late_feedback", "early_buffer_full", "arm_mismatch", "unknown_ticket"}
)
#: dead letters that are a second outcome of a served request, not the outcome of a line
SECOND_OUTCOMES = frozenset({"ticket_expired", "arm_retired", "context_retired"})

Lines = Callable[[list[bytes]], None]


@dataclass
class Outputs:
    """Where a replay writes, each a function given JSON lines (no newline) in order; None
    keeps them in the ``Replayed``. ``events`` sees every event that reached its instance,
    at its event time (``ts`` filled in)."""

    selections: Lines | None = None
    dead_letters: Lines | None = None
    at_end: Lines | None = None
    events: Callable[[Request | Feedback], None] | None = None


@dataclass
class Replayed:
    """What a replay produced (the lists only for outputs it was not given a writer for)
    and what became of every line."""

    selections: list[dict[str, Any]] = field(default_factory=list)
    dead_letters: list[dict[str, Any]] = field(default_factory=list)
    at_end: list[dict[str, Any]] = field(default_factory=list)  # closed by the end of the log
    selection_lines: list[bytes] = field(default_factory=list)  # as the service writes them
    events: int = 0  # lines read
    last_ts: float = 0.0  # the event time the log ended at
    served: int = 0  # selections written (a retry answered again counts)
    requests: int = 0  # requests that reached their instance
    feedback: int = 0  # feedback that reached its instance
    reasons: Counter[str] = field(default_factory=Counter)  # dead letters by reason
    at_end_reasons: Counter[str] = field(default_factory=Counter)

    @property
    def applied_feedback(self) -> int:
        """Feedback that updated its bandit: it reached its instance, and no dead letter
        (duplicate, late, arm mismatch, never matched, ...) is about it."""
        refused = sum(self.reasons[r] + self.at_end_reasons[r] for r in FEEDBACK_REASONS)
        return self.feedback - refused

    @property
    def unaccounted(self) -> int:
        """Lines that are neither a selection, nor an applied feedback, nor the subject of
        a dead letter: 0 when every line is accounted for."""
        letters = sum(
            n
            for counts in (self.reasons, self.at_end_reasons)
            for reason, n in counts.items()
            if reason not in SECOND_OUTCOMES
        )
        return self.events - self.served - letters - self.applied_feedback


class _Run:
    """What the source, the parser, the trace and the sinks of one replay share."""

    def __init__(
        self, registry: Registry, kinds: dict[str, str], outputs: Outputs, result: Replayed
    ) -> None:
        parsers = {"request": parse_request, "feedback": parse_feedback}
        self.parsers = {source: parsers[kind] for source, kind in kinds.items()}
        self.registry, self.result = registry, result
        writers = (outputs.selections, outputs.dead_letters, outputs.at_end)
        self.outputs = Outputs(
            *(None if w is None else self._guarded(w) for w in writers), outputs.events
        )
        self.now = TS_MIN  # the time of the last event that reached an instance
        self.ended = False  # the source has read everything
        self.read = 0  # lines parsed: the position of the next one
        # of the lines parsed, until traced; lines of one origin (not from the readers
        # here): first come, first traced
        self.positions: dict[Origin, deque[int]] = {}
        self.error: ReplayError | None = None

    def _guarded(self, write: Lines) -> Lines:
        """``write``, whose failure to write (a full disk) stops the replay as an error."""

        def guarded(lines: list[bytes]) -> None:
            if self.error is None:
                try:
                    write(lines)
                except OSError as exc:
                    self.error = ReplayError(f"cannot write the outputs: {exc.strerror or exc}")

        return guarded

    def clock(self) -> float:
        """The flow's clock: events carry their time, so it only counts at the end of the
        input, which is the end of time (everything pending closes)."""
        return math.inf if self.ended else self.now

    def parse(self, raw: bytes, origin: Origin, **_: Any) -> Request | Feedback | DeadLetter:
        """A line as the event the flow handles (its event time filled in), or its dead
        letter; only an event that reaches its instance moves the clock."""
        held = self.positions.get(origin)
        if held is None:
            held = self.positions[origin] = deque()
        held.append(self.read)
        self.read += 1
        if isinstance(raw, DeadLetter):  # what the reader made of it (no internal copy)
            return raw
        event = self.parsers.get(origin.source, parse_event)(raw, origin, ts_window=math.inf)
        if isinstance(event, DeadLetter):
            return event
        if event.ts is not None and valid_ts(event.ts) is None:
            detail = f"ts {event.ts!r} is not within [{TS_MIN:g}, {TS_MAX:g}] (Unix seconds)"
            return DeadLetter("ts_out_of_range", detail, event.raw, origin)
        if origin.time is not None:  # read from Kafka: its timestamp, as the service did
            event = dataclasses.replace(event, ts=origin.time)
        elif event.ts is None:
            event = dataclasses.replace(event, ts=self.now)
        routed = route(self.registry, event)
        if isinstance(routed, DeadLetter):
            return routed
        self.now = event.ts
        if isinstance(event, Request):
            self.result.requests += 1
        else:
            self.result.feedback += 1
        if self.outputs.events is not None:
            self.outputs.events(event)
        return event

    def trace(self, cause: Request | Feedback | DeadLetter) -> int | None:
        """The position of the line that caused an output (once per line)."""
        held = self.positions.get(cause.origin)
        if held is None:
            return None
        if len(held) == 1:
            del self.positions[cause.origin]
        return held.popleft()

    def selections(self, held: list[tuple[Any, bytes]]) -> None:
        lines = [raw for _, raw in held]
        self.result.served += len(lines)
        _write(lines, self.outputs.selections, self.result.selection_lines)
        if self.outputs.selections is None:
            self.result.selections += [orjson.loads(raw) for raw in lines]

    def dead_letters(self, held: list[tuple[Any, bytes]]) -> None:
        lines, closing = [], []
        for tag, raw in held:
            letter = orjson.loads(raw)
            if tag is None:  # the end of the input closed it
                letter["detail"] += AT_END
                closing.append(letter)
                self.result.at_end_reasons[letter["reason"]] += 1
            else:
                lines.append(raw)
                self.result.reasons[letter["reason"]] += 1
                if self.outputs.dead_letters is None:
                    self.result.dead_letters.append(letter)
        _write(lines, self.outputs.dead_letters, None)
        closing.sort(key=_about)
        _write([orjson.dumps(d) for d in closing], self.outputs.at_end, None)
        if self.outputs.at_end is None:
            self.result.at_end += closing


def _about(letter: dict[str, Any]) -> tuple[str, int, int]:
    """Where the line a dead letter is about comes from, as a sort key."""
    partition, offset = letter["partition"], letter["offset"]
    return letter["source"], -1 if partition is None else partition, offset or 0


def _write(lines: list[bytes], to: Lines | None, keep: list[bytes] | None) -> None:
    """``lines`` to their writer, or kept (if ``keep``) when there is none."""
    if to is not None:
        if lines:
            to(lines)
    elif keep is not None:
        keep += lines


class _Partition(StatefulSourcePartition[list[Message], None]):
    def __init__(self, messages: Iterator[Message], run: _Run, tick: Callable[[int], None]):
        self.messages, self.run, self.tick = messages, run, tick

    def next_batch(self) -> list[list[Message]]:
        batch: list[Message] = []
        try:
            if self.run.error is None:
                batch = list(itertools.islice(self.messages, BATCH))
        except ReplayError as exc:  # raised again once the flow has stopped
            self.run.error = exc
        if not batch:
            self.run.ended = True
            raise StopIteration
        self.run.result.events += len(batch)
        self.tick(len(batch))
        return [batch]

    def snapshot(self) -> None:
        return None

    def close(self) -> None:
        close = getattr(self.messages, "close", None)
        if close is not None:
            close()


class _Source(FixedPartitionedSource[list[Message], None]):
    def __init__(self, messages: Iterator[Message], run: _Run, tick: Callable[[int], None]):
        self.messages, self.run, self.tick = messages, run, tick

    def list_parts(self) -> list[str]:
        return ["log"]

    def build_part(self, step_id: str, for_part: str, resume_state: None) -> _Partition:
        return _Partition(self.messages, self.run, self.tick)


class _InOrder(StatefulSinkPartition[tuple[Any, bytes], None]):
    """Outputs tagged with the position of their cause, held until their epoch closes,
    then written in that order (the end of the input's, tagged None, last)."""

    def __init__(self, write: Callable[[list[tuple[Any, bytes]]], None]) -> None:
        self.write, self.held = write, []

    def write_batch(self, items: list[tuple[Any, bytes]]) -> None:
        # compact copies: orjson's bytes keep a buffer many times a selection's size
        # (bench/RESULTS.md, "Figures behind the code": records built in C)
        self.held += [(tag, bytes(memoryview(raw))) for tag, raw in items]

    def snapshot(self) -> None:  # Bytewax's call when the epoch closes
        self._flush()

    def close(self) -> None:
        self._flush()

    def _flush(self) -> None:
        if self.held:
            held, self.held = self.held, []
            held.sort(key=lambda item: (item[0] is None, item[0] or 0))  # stable
            self.write(held)


class _Sink(FixedPartitionedSink[tuple[Any, bytes], None]):
    def __init__(self, write: Callable[[list[tuple[Any, bytes]]], None]) -> None:
        self.write = write

    def list_parts(self) -> list[str]:
        return ["out"]

    def build_part(self, step_id: str, for_part: str, resume_state: None) -> _InOrder:
        return _InOrder(self.write)


def _in_order(step: str, up: Stream[list], write: Callable) -> None:
    keyed = op.flat_map(f"{step}_items", up, lambda batch: [("out", item) for item in batch])
    op.output(step, keyed, _Sink(write))


def replay(
    messages: Iterable[Message],
    registry: Registry,
    kinds: dict[str, str] | None = None,
    seed: int | None = None,
    progress: Callable[[int], None] | None = None,
    outputs: Outputs | None = None,
) -> Replayed:
    """Run ``messages`` through the serving dataflow on event time (see the module).

    ``kinds`` maps a message's origin source to ``request`` or ``feedback`` (logs without
    a ``type`` field); other messages are read as the combined stream. A message whose
    bytes are a ``DeadLetter`` is that dead letter (what the reader made of it). ``seed``
    replaces every experiment's seed (the hashed draws). ``outputs`` writes the outputs as
    they come instead of keeping them. Raises ``ReplayError`` if the log cannot be read.
    Messages are ordered by their origins: lines sharing one may come out in another order.
    """
    if seed is not None:
        registry = Registry(
            {n: dataclasses.replace(e, seed=seed) for n, e in registry.experiments.items()}
        )
    result = Replayed()
    run = _Run(registry, kinds or {}, outputs or Outputs(), result)
    source = _Source(iter(messages), run, progress or _ignore)

    def events(flow: Dataflow, step: str) -> tuple[Stream, None]:
        return op.input(step, flow, source), None

    wiring = dataflow.Wiring(
        dataflow.Inputs({"events": events}, parsers={"events": run.parse}),
        dataflow.Outputs(
            selections=lambda step, up: _in_order(step, up, run.selections),
            dead_letters=lambda step, up: _in_order(step, up, run.dead_letters),
            trace=run.trace,
        ),
    )
    flow = build_flow(registry, wiring, run.clock, "tsi-replay", snapshots=False, event_time=True)
    run_main(flow, epoch_interval=EPOCH)
    if run.error is not None:
        raise run.error
    result.last_ts = run.now
    return result


def _ignore(_: int) -> None:
    return None
