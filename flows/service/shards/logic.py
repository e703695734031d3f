"""The Bytewax side of one shard: what a key group holds of each of its shards.

Instances are routed to a fixed number of shards (``keys.shard_of``), each holding many
instances in its ``shard_store.ShardStore``, and shards to a few key groups, the Bytewax
keys (``group_logic.GroupLogic``, which holds a ``ShardLogic`` per shard). Bytewax's cost
per key (its own state, its timers, its snapshot calls) is then paid per group, not per
user, and one call handles all the events an activation brings to a group. A
``ShardLogic`` alone is a flow's one shard as tests and benchmarks drive it. Every routed
item carries its instance key and its experiment (looked up once, when the event is
routed). Each event is guarded: an unexpected error becomes a dead letter for that event
and the dataflow keeps running.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bytewax.operators import StatefulBatchLogic

from flows.service.instances.instance import Output
from flows.service.instances.registry import LiveRegistry, Registry
from flows.service.observe.stream_clock import StreamClock
from flows.service.shards.changelog import Changelog
from flows.service.shards.deadlines import WakeUpScheduler
from flows.service.shards.shard_store import (
    REST_AFTER,
    FlowContext,
    Routed,
    ShardStore,
    close_stores,
)
from flows.service.wire._records import split_outputs
from flows.service.wire.events import DeadLetter
from flows.service.wire.keys import DEFAULT_SHARDS

__all__ = [
    "REST_AFTER",
    "FlowContext",
    "Routed",
    "ShardLogic",
    "Split",
    "flow_context",
    "logic_builder",
    "split",
]

#: A shard's outputs as Bytewax gets them: the selections' JSON keyed by instance, and the
#: dead letters (``flows.service.wire._records.split_outputs``).
Split = tuple[list[tuple[str, bytes]], list[DeadLetter]]


def split(out: list[Output]) -> tuple[list[Split], bool]:
    """What a shard's (or key group's) Bytewax call returns: its outputs as one ``Split``
    item, if any.

    >>> split([])
    ([], False)
    """
    return ([split_outputs(out)] if out else []), StatefulBatchLogic.RETAIN


class ShardLogic(StatefulBatchLogic[Routed, Split, dict[str, Any]]):
    """The Bytewax side of one shard: Bytewax's calls mapped onto the shard's
    ``ShardStore``, and the shard's wake-ups asked for (from the worker's queue, or as
    Bytewax's ``notify_at``). On event time Bytewax's wall-clock notifications are not
    used."""

    def __init__(self, context: FlowContext, resume: dict[str, Any] | None = None) -> None:
        self.store = ShardStore(context, resume)
        self._wish()

    def on_batch(self, values: list[list[Routed]]) -> tuple[Iterable[Split], bool]:
        """Bytewax's call: the batches routed to this shard; one item out, all outputs
        (``Split``: written here, while they are fresh in the cache)."""
        return split(self.handle([event for batch in values for event in batch]))

    def handle(self, events: list[Routed]) -> list[Output]:
        """Handle events in order; their outputs (and problems found restoring) in order."""
        out = self.store.handle(events)
        self._wish()
        return out

    def on_notify(self) -> tuple[Iterable[Split], bool]:
        return split(self.wake())

    def wake(self) -> list[Output]:
        """A timer's call: what is due, and problems found restoring; and resting."""
        return self.store.wake()

    def on_eof(self) -> tuple[Iterable[Split], bool]:
        return split(self.finish())

    def finish(self) -> list[Output]:
        """The end of the input (see ``ShardStore.finish``)."""
        return self.store.finish()

    def notify_at(self) -> datetime | None:
        """A wall-clock wake-up at the shard's next deadline; on stream time a deadline the
        stream has not reached yet (the service is catching up) is looked at again in a
        second."""
        context = self.store.context
        if context.event_time or context.wake_ups:
            return None
        due = self.store.wake_at()
        if due is None:
            return None
        if context.stream is not None:  # a past deadline: expire() decides, every second
            due = max(due, time.time() + 1.0)
        return datetime.fromtimestamp(due, tz=UTC)

    def snapshot(self) -> dict[str, Any] | None:
        """Bytewax's call at an epoch's close of this shard alone (``close_stores``)."""
        return close_stores(self.store.context.changelog, [self.store])[0]

    def _wish(self) -> None:
        """With wake-ups from the flow's scheduler, queue this shard's next one in its
        worker's queue."""
        store = self.store
        if store.context.wake_ups and not store.context.event_time and store.shard is not None:
            store.context.wake_ups.queue().want(store.shard, store.wake_at())


def flow_context(
    registry: Registry | LiveRegistry,
    clock: Callable[[], float] = time.time,
    snapshots: bool = True,
    event_time: bool = False,
    stream: StreamClock | None = None,
    wake_ups: WakeUpScheduler | None = None,
    store: Path | None = None,
    rest_after: float = REST_AFTER,
    changelog: Changelog | None = None,
    holds: Callable[[int], bool] | None = None,
    shards: int = DEFAULT_SHARDS,
    handover: dict[str, dict[str, Any]] | None = None,
) -> FlowContext:
    """What a flow's shards share (``FlowContext``).

    ``snapshots=False`` (no recovery configured) skips building snapshots;
    ``event_time=True`` runs on the events' own time, ``stream`` on stream time, and
    ``wake_ups`` wakes shards from the worker's queue of that scheduler (the one the
    flow's ``WakeUps`` source reads), ``store`` keeps the shards' logs,
    ``rest_after`` is how long an unchanged instance stays live (see ``FlowContext``),
    ``changelog`` (with ``store``) mirrors each shard's log (``shards.changelog``),
    ``holds`` says which shards are this member's (``FlowContext``), ``shards`` is the
    flow's shard count, ``handover`` the states of keys of one shard the flow resumes
    (``FlowContext.handover``: a store from before key groups, read before it starts).

    >>> from flows.service.instances.registry import Registry
    >>> flow_context(Registry.from_toml("[experiments.e]\\narms = ['a']"), shards=4).shards
    4
    """
    live = registry if isinstance(registry, LiveRegistry) else LiveRegistry(registry)
    return FlowContext(
        live,
        clock,
        snapshots,
        event_time,
        stream,
        wake_ups,
        store,
        rest_after,
        changelog,
        holds,
        shards,
        dict(handover or {}),
    )


def logic_builder(*args: Any, **kwargs: Any) -> Callable[[dict[str, Any] | None], ShardLogic]:
    """A builder of one shard's logic (with its resume state), over
    ``flow_context(*args, **kwargs)``: a flow's one shard, as tests and benchmarks
    drive it (a flow's builder is ``group_logic.group_builder``)."""
    context = flow_context(*args, **kwargs)
    return lambda resume: ShardLogic(context, resume)
