"""The Bytewax side of one instance: a ``StatefulLogic`` around ``flows.instance.Instance``.

The logic is built per key with only the resume state, so every routed item carries its
instance key and experiment. Each event is guarded: an unexpected error becomes a dead
letter for that event and the dataflow keeps running.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from bytewax.operators import StatefulLogic

from flows.events import DeadLetter, Feedback, Request
from flows.instance import Instance, Output
from flows.registry import Registry

Routed = tuple[str, Request | Feedback]  # (instance key, event)


class InstanceLogic(StatefulLogic[Routed, Output, dict[str, Any]]):
    """Holds one ``Instance`` (weights, ψ, V, D, tickets, buffers) for one key."""

    __slots__ = ("clock", "instance", "registry", "snapshots")

    def __init__(
        self,
        registry: Registry,
        resume: dict[str, Any] | None,
        clock: Callable[[], float],
        snapshots: bool = True,
    ) -> None:
        self.registry = registry
        self.clock = clock
        self.snapshots = snapshots
        self.instance: Instance | None = None
        if resume is not None:
            experiment = registry.get(resume["experiment"])
            if experiment is not None:  # an experiment removed from the registry is dropped
                self.instance = Instance.from_dict(experiment, resume)

    def on_item(self, value: Routed) -> tuple[Iterable[Output], bool]:
        key, event = value
        try:
            if self.instance is None:
                self.instance = Instance(self.registry[event.experiment], key)
            now = self.clock()
            if isinstance(event, Request):
                out = self.instance.on_request(event, now)
            else:
                out = self.instance.on_feedback(event, now)
            return out, StatefulLogic.RETAIN
        except Exception as exc:
            dead = DeadLetter(
                "internal_error", f"{type(exc).__name__}: {exc}", event.raw, event.origin, key
            )
            return [dead], StatefulLogic.RETAIN

    def on_notify(self) -> tuple[Iterable[Output], bool]:
        if self.instance is None:
            return [], StatefulLogic.RETAIN
        return self.instance.expire(self.clock()), StatefulLogic.RETAIN

    def notify_at(self) -> datetime | None:
        due = None if self.instance is None else self.instance.next_deadline()
        return None if due is None else datetime.fromtimestamp(due, tz=UTC)

    def snapshot(self) -> dict[str, Any] | None:
        """The instance's state for recovery. Bytewax asks for it at every epoch close, for
        every key touched, recovery or not: without recovery nothing is built."""
        if not self.snapshots or self.instance is None:
            return None
        return self.instance.to_dict()


def logic_builder(
    registry: Registry, clock: Callable[[], float] = time.time, snapshots: bool = True
) -> Callable[[dict[str, Any] | None], InstanceLogic]:
    """The builder ``op.stateful`` calls for each new key (with its resume state).

    ``snapshots=False`` (no recovery configured) skips building snapshots.
    """

    def build(resume: dict[str, Any] | None) -> InstanceLogic:
        return InstanceLogic(registry, resume or None, clock, snapshots)

    return build
