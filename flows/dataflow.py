"""The one dataflow builder: Kafka, files and tests differ only in sources and sinks.

```
requests ─ parse ─ route ─┐                     ┌─ selections ─ serialise ─ sink
feedback ─ parse ─ route ─┼─ merge ─ stateful ──┤
 (events ─ parse ─ route)─┘     (per instance)  └─ dead letters (+ every refusal upstream)
```
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import bytewax.operators as op
from bytewax.dataflow import Dataflow, Stream

from flows.events import (
    DeadLetter,
    Feedback,
    Origin,
    Request,
    parse_event,
    parse_feedback,
    parse_request,
)
from flows.metrics import count_dead_letter
from flows.operator import Routed, logic_builder
from flows.registry import Registry

Message = tuple[bytes, Origin]
KeyedBytes = tuple[str, bytes]


Open = Callable[[Dataflow, str], tuple[Stream[Message], Stream[DeadLetter] | None]]
PARSERS = {"requests": parse_request, "events": parse_event, "feedback": parse_feedback}


@dataclass(frozen=True)
class Wiring:
    """Where messages come from and go to.

    ``inputs`` maps a kind (``requests``, ``feedback``, or ``events`` for a combined stream)
    to a function that adds its source to the flow and returns a stream of raw messages
    with their origin, plus a stream of dead letters for messages the source itself could
    not deliver (e.g. Kafka errors) or None. ``selections`` and ``dead_letters`` consume
    (key, JSON bytes) streams.
    """

    inputs: dict[str, Open]
    selections: Callable[[str, Stream[KeyedBytes]], None]
    dead_letters: Callable[[str, Stream[KeyedBytes]], None]
    parsers: dict[str, Callable[[bytes, Origin], object]] | None = None  # replaces PARSERS[kind]

    def __post_init__(self) -> None:
        unknown = set(self.inputs) - set(PARSERS)
        if unknown or not self.inputs:
            raise ValueError(f"inputs must be some of {sorted(PARSERS)}, got {sorted(self.inputs)}")


def route(registry: Registry, event: Request | Feedback) -> tuple[str, Routed] | DeadLetter:
    """(instance key, (key, event)), or a dead letter for an unknown experiment or unit."""
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
    return key, (key, event)


def build_flow(
    registry: Registry,
    wiring: Wiring,
    clock: Callable[[], float] = time.time,
    flow_id: str = "tsi",
    snapshots: bool = True,
    event_time: bool = False,
) -> Dataflow:
    """The serving dataflow. Step ids are stable: recovery state is keyed by them.

    ``snapshots=False`` when the flow runs without recovery: per-key snapshots are then
    never built (Bytewax asks for them at every epoch close regardless). ``event_time``
    for replays: the events' ``ts`` is the time (see ``flows.operator.InstanceLogic``).
    """
    flow = Dataflow(flow_id)
    dead: list[Stream[DeadLetter]] = []
    routed: list[Stream[tuple[str, Routed]]] = []
    # Requests first: when both topics have a backlog, the source built first is read
    # first, and feedback read before its request would crowd the early-feedback buffer.
    for name in (n for n in PARSERS if n in wiring.inputs):
        source, parse = wiring.inputs[name], (wiring.parsers or PARSERS).get(name, PARSERS[name])
        messages, source_errors = source(flow, f"{name}_in")
        if source_errors is not None:
            dead.append(source_errors)
        parsed = op.map(f"parse_{name}", messages, lambda m, parse=parse: parse(m[0], m[1]))
        keyed = op.map(
            f"route_{name}",
            parsed,
            lambda e: e if isinstance(e, DeadLetter) else route(registry, e),
        )
        split = op.branch(f"split_{name}", keyed, lambda e: isinstance(e, DeadLetter))
        dead.append(split.trues)
        routed.append(split.falses)
    events = op.merge("events", *routed)
    outputs = op.stateful("bandit", events, logic_builder(registry, clock, snapshots, event_time))
    answers = op.branch("split_outputs", outputs, lambda kv: isinstance(kv[1], DeadLetter))
    dead.append(op.map("unkey_dead", answers.trues, lambda kv: kv[1]))
    selections = op.map("selection_json", answers.falses, lambda kv: (kv[0], kv[1].to_json()))
    wiring.selections("selections_out", selections)
    letters = op.map(
        "dead_letter_json",
        op.merge("dead_letters", *dead),
        lambda d: (d.instance or "", count_dead_letter(d).to_json()),  # all of them pass here
    )
    wiring.dead_letters("dead_letters_out", letters)
    return flow
