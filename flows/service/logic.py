"""The Bytewax side of one instance: a ``StatefulLogic`` around ``flows.service.instance.Instance``.

Bytewax builds the logic of a key with only its resume state, so every routed item
carries its instance key and its experiment (looked up once, when the event is routed).
Each event is guarded: an unexpected error becomes a dead letter for that event and the
dataflow keeps running.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from bytewax.operators import StatefulLogic

from flows.service.deadlines import worker_queue
from flows.service.events import DeadLetter, Feedback, Request
from flows.service.instance import Instance, Output
from flows.service.metrics import observe_expired, observe_item, observe_restored
from flows.service.registry import Experiment, LiveRegistry, Registry
from flows.service.stream_clock import StreamClock

log = logging.getLogger(__name__)

Routed = tuple[str, Experiment, Request | Feedback]  # (instance key, its experiment, event)


@dataclass(frozen=True)
class FlowContext:
    """What every instance logic of one dataflow shares: the registry, the clock, whether
    snapshots are built (recovery on), whether the flow runs on event time, and the stream
    clock (the Kafka service: an event's time is its Kafka timestamp and tickets expire on
    stream time, see ``flows.service.stream_clock``)."""

    registry: LiveRegistry
    clock: Callable[[], float] = time.time
    snapshots: bool = True
    event_time: bool = False
    stream: StreamClock | None = None
    wake_ups: bool = False  # wake-ups from the worker's queue instead of Bytewax timers


class InstanceLogic(Instance, StatefulLogic[Routed, Output, dict[str, Any]]):
    """An ``Instance`` that is also the Bytewax logic of its key: one object per key.

    A new key becomes an instance on its first event, which names the experiment.

    On event time (replays, the demo) ``now`` is the event's own ``ts`` (else the clock),
    deadlines pass when an instance's next event or the end of the input passes them, and
    Bytewax's wall-clock notifications are not used: the same input gives the same output.

    The registry may change under an instance (a restart with an edited file, or a live
    reload): it follows its experiment's new definition on restore or on its next event
    (``Instance.follow``). The state of an experiment removed from the registry is kept
    as it is (archived: snapshotted unchanged, shown by ``tsi inspect``) and comes back
    to life if the experiment returns.
    """

    __slots__ = ("_archived", "context")

    def __init__(self, context: FlowContext, resume: dict[str, Any] | None = None) -> None:
        self.context = context
        self.key = None  # not bound to an experiment yet
        self._archived = None
        if resume:
            experiment = context.registry.current.get(resume["experiment"])
            if experiment is None:
                self._archived = resume
                log.warning("instance %r archived: its experiment left the registry", resume["key"])
            else:
                self.restore(experiment, resume)
                observe_restored(self)
                self._wish()

    @property
    def instance(self) -> Instance | None:
        """The instance this logic holds (None until its first event)."""
        return None if self.key is None else self

    def on_item(self, value: Routed) -> tuple[Iterable[Output], bool]:
        key, experiment, event = value
        if isinstance(event, str):  # WAKE_UP: the only event that is not parsed
            return self.on_notify()
        started, now, new = time.perf_counter(), None, self.key is None
        try:
            if new:
                self._bind(experiment, key)
            elif experiment is not self.experiment:
                self.follow(experiment)  # the registry was reloaded
            before: list[Output] = self.take_notices() if self._notices else []
            now = self._time_of(event)
            if self.context.event_time:
                before += self.expire(now)
                observe_expired(self, before)  # never raises
            if isinstance(event, Request):
                out = self.on_request(event, now)
            else:
                out = self.on_feedback(event, now)
        except Exception as exc:
            detail = f"{type(exc).__name__}: {exc}"
            out, before = [DeadLetter("internal_error", detail, event.raw, event.origin, key)], []
        observe_item(experiment.name, event, out, new, started, now)  # never raises
        self._wish()
        return (before + out if before else out), StatefulLogic.RETAIN

    def _time_of(self, event: Request | Feedback) -> float:
        """The time an event happened at: its own ``ts`` on event time, its Kafka timestamp
        on stream time (noted as served), else the clock."""
        context = self.context
        if context.event_time:
            return context.clock() if event.ts is None else event.ts
        origin = event.origin
        if context.stream is None or origin.time is None:
            return context.clock()
        context.stream.note_served(origin.source, origin.partition, origin.time)
        return origin.time

    def _now(self) -> float:
        """What a wake-up or the end of the input expires against: the stream time, or
        the clock."""
        stream = self.context.stream
        return self.context.clock() if stream is None else stream.now()

    def _bind(self, experiment: Experiment, key: str) -> None:
        """The first event of a key: a new instance, or an archived one coming back."""
        archived, self._archived = self._archived, None
        if archived is None:
            Instance.__init__(self, experiment, key)
        else:
            self.restore(experiment, archived)

    def on_notify(self) -> tuple[Iterable[Output], bool]:
        if self.key is None:
            return [], StatefulLogic.RETAIN
        out = self.take_notices() + self.expire(self._now())
        observe_expired(self, out)  # never raises
        self._wish()
        return out, StatefulLogic.RETAIN

    def _due(self) -> float | None:
        """When this instance wants to be woken: now for dead letters waiting to be handed
        out, else its next deadline."""
        return self._now() if self._notices else self.next_deadline()

    def _wish(self) -> None:
        """With wake-ups from the worker's queue, queue this instance's next one."""
        if self.context.wake_ups and not self.context.event_time and self.key is not None:
            worker_queue().want(self.key, self._due())

    def on_eof(self) -> tuple[Iterable[Output], bool]:
        """On event time, the end of the input is the last moment: expire what is due."""
        if self.key is None:
            return [], StatefulLogic.RETAIN
        out = self.take_notices()
        if self.context.event_time:
            out += self.expire(self.context.clock())
        observe_expired(self, out)  # never raises
        return out, StatefulLogic.RETAIN

    def notify_at(self) -> datetime | None:
        """A wall-clock wake-up at the next deadline; on stream time a deadline the stream
        has not reached yet (the service is catching up) is looked at again in a second."""
        if self.key is None or self.context.event_time or self.context.wake_ups:
            return None
        due = self.context.clock() if self._notices else self.next_deadline()
        if due is None:
            return None
        if self.context.stream is not None:  # a past deadline: expire() decides, every second
            due = max(due, time.time() + 1.0)
        return datetime.fromtimestamp(due, tz=UTC)

    def snapshot(self) -> dict[str, Any] | None:
        """The instance's state for recovery. Bytewax asks for it at every epoch close, for
        every key touched, recovery or not: without recovery nothing is built. It is also
        the moment to pack the bandit (``Instance.rest``): busy keys stay live within an
        epoch, the many idle ones stay small. An archived instance keeps its state."""
        if self.key is None:
            return self._archived
        state = self.to_dict() if self.context.snapshots else None
        self.rest()
        return state


def logic_builder(
    registry: Registry | LiveRegistry,
    clock: Callable[[], float] = time.time,
    snapshots: bool = True,
    event_time: bool = False,
    stream: StreamClock | None = None,
    wake_ups: bool = False,
) -> Callable[[dict[str, Any] | None], InstanceLogic]:
    """The builder ``op.stateful`` calls for each new key (with its resume state).

    ``snapshots=False`` (no recovery configured) skips building snapshots;
    ``event_time=True`` runs on the events' own time, ``stream`` on stream time, and
    ``wake_ups`` wakes instances from the worker's queue (see ``FlowContext``).
    """
    live = registry if isinstance(registry, LiveRegistry) else LiveRegistry(registry)
    context = FlowContext(live, clock, snapshots, event_time, stream, wake_ups)
    return lambda resume: InstanceLogic(context, resume)
