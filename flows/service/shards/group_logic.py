"""The Bytewax keys of the stateful step: key groups, each holding several shards.

A flow's shards are grouped into ``keys.KEY_GROUPS`` Bytewax keys (``keys.group_of``: the
reasoning is there). A ``GroupLogic`` holds a ``logic.ShardLogic`` (its ``ShardStore``)
per shard of its group it has seen, created at the shard's first event or from the
group's resume state, and hands each shard its events: one Bytewax call serves every
shard of the group an activation brings events for. Shards stay what they were: their
store's logs, their changelog partition, which member holds them, their wake-ups.

An epoch's close sends every shard's epoch first (entries and marker), then waits once
for the changelog's acknowledgement of all of them (``shard_store.close_stores``): the
snapshot, {shard: its state}, returns only once everything the epoch wrote is in.

A store from before groups holds one Bytewax key per shard (``shard-007-of-128``).
Bytewax 0.21.1 builds the logic of every resumed key eagerly, when its state is loaded:
at the close of the epoch before the one it resumes at (``stateful_batch`` in its
``src/operators.rs``: loads are applied when their epoch closes, before any item of a
later epoch reaches that worker's logics). Such a key becomes a ``Retired``: its state
goes to the process's ``FlowContext.handover``, the group holding its shard takes it at
its next call, and once that group has snapshotted the shard the old key discards
itself, so its stale state never comes back. Bytewax orders loads before items only
within a worker, so the service also fills the handover from the store before the flow
starts (``runtime.recovery.keys_of_one_shard``): a group finds its shards' states
whichever worker builds their old keys. A shard a group already holds keeps its own
state (the newer one); a cluster of several processes, where the old key and its group
may lie apart, refuses such a store at start-up (``startup.check_cluster_keys``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from bytewax.operators import StatefulBatchLogic

from flows.service.instances.instance import Output
from flows.service.shards.logic import FlowContext, Routed, ShardLogic, Split, split
from flows.service.shards.shard_store import close_stores
from flows.service.wire.keys import group_of

__all__ = ["GroupLogic", "Part", "Retired", "group_builder"]

Part = tuple[str, list[Routed]]  # (shard, its events in order): what a group's item holds
#: How often a retired key looks whether its group has snapshotted its shard.
RETIRED_LOOK = timedelta(seconds=1)


class GroupLogic(StatefulBatchLogic[list[Part], Split, dict[str, Any]]):
    """One key group's shards (``shards``: their ``ShardLogic`` by shard name).

    >>> from flows.service.instances.registry import LiveRegistry, Registry
    >>> from flows.service.wire.events import Origin, parse_request
    >>> live = LiveRegistry(Registry.from_toml('[experiments.e]\\narms = ["a", "b"]'))
    >>> group = GroupLogic(FlowContext(live, clock=lambda: 0.0, shards=1))
    >>> event = parse_request(b'{"experiment":"e","request_id":"r1"}', Origin("t"))
    >>> [answer] = group.handle([("shard-000-of-001", [("e", live.current["e"], event)])])
    >>> answer.round, list(group.snapshot()["shards"])
    (1, ['shard-000-of-001'])
    """

    def __init__(self, context: FlowContext, resume: dict[str, Any] | None = None) -> None:
        self.context = context
        self.group: str | None = None if resume is None else resume["group"]
        self.shards: dict[str, ShardLogic] = {}
        for shard, state in ({} if resume is None else resume["shards"]).items():
            self.shards[shard] = ShardLogic(context, state)

    def on_batch(self, values: list[list[Part]]) -> tuple[Iterable[Split], bool]:
        """Bytewax's call: the items routed to this group, each one (shard, events) per
        shard; one item out, all outputs."""
        return split(self.handle([part for item in values for part in item]))

    def handle(self, parts: list[Part]) -> list[Output]:
        """Each shard's events, in order; their outputs (and problems found restoring)."""
        if self.group is None and parts:
            self.group = group_of(parts[0][0], self.context.shards)
        out = self._adopt()
        for shard, events in parts:
            logic = self.shards.get(shard)
            if logic is None:
                logic = self.shards[shard] = ShardLogic(self.context)
            out += logic.handle(events)
        return out

    def _adopt(self) -> list[Output]:
        """Take the handed-over states of this group's shards (``Retired``): a shard
        it holds already keeps its own (the newer); the problems found restoring."""
        handover, out = self.context.handover, []
        if not handover or self.group is None:
            return out
        shards = self.context.shards
        for shard in [s for s in list(handover) if group_of(s, shards) == self.group]:
            state = handover.pop(shard, None)
            if state is not None and shard not in self.shards:
                self.shards[shard] = ShardLogic(self.context, state)
                out += self.shards[shard].wake()
        return out

    def on_notify(self) -> tuple[Iterable[Split], bool]:
        return split(self.wake())

    def wake(self) -> list[Output]:
        """A timer's call: what is due in each shard, and problems found restoring."""
        out = self._adopt()
        for logic in self.shards.values():
            out += logic.wake()
        return out

    def on_eof(self) -> tuple[Iterable[Split], bool]:
        return split(self.finish())

    def finish(self) -> list[Output]:
        """The end of the input, in every shard (``ShardStore.finish``)."""
        out = self._adopt()
        for shard in sorted(self.shards):
            out += self.shards[shard].finish()
        return out

    def notify_at(self) -> datetime | None:
        """The earliest of its shards' wall-clock wake-ups (``ShardLogic.notify_at``)."""
        due = [at for logic in self.shards.values() if (at := logic.notify_at()) is not None]
        return min(due, default=None)

    def snapshot(self) -> dict[str, Any] | None:
        """Bytewax's call at an epoch's close: every shard's epoch sent, one wait for the
        changelog, then {"group": name, "shards": {shard: its state}} (None without
        recovery)."""
        names = list(self.shards)
        stores = [self.shards[name].store for name in names]
        states = close_stores(self.context.changelog, stores)
        if not self.context.snapshots:
            return None
        held = {name: state for name, state in zip(names, states, strict=True) if state}
        self.context.adopted.update(held)
        return {"group": self.group, "shards": held}


class Retired(StatefulBatchLogic[Any, Split, dict[str, Any]]):
    """A resumed key of one shard (a store from before key groups): its state handed to
    the group now holding that shard (``FlowContext.handover``) and kept as it is until
    that group has snapshotted the shard; then it discards itself. With the flow's
    wake-up queue, the shard is woken at once, so that its group takes it now."""

    def __init__(self, context: FlowContext, state: dict[str, Any]) -> None:
        self.context, self.state, self.shard = context, state, state["shard"]
        context.handover[self.shard] = state
        if context.wake_ups is not None and not context.event_time:
            context.wake_ups.queue().want(self.shard, 0.0)

    def _done(self) -> tuple[list[Split], bool]:
        gone = self.shard in self.context.adopted
        return [], (StatefulBatchLogic.DISCARD if gone else StatefulBatchLogic.RETAIN)

    def on_batch(self, values: list[Any]) -> tuple[list[Split], bool]:
        return self._done()

    def on_notify(self) -> tuple[list[Split], bool]:
        return self._done()

    def on_eof(self) -> tuple[list[Split], bool]:
        return self._done()

    def notify_at(self) -> datetime:
        return datetime.now(UTC) + RETIRED_LOOK

    def snapshot(self) -> dict[str, Any]:
        return self.state


def group_builder(
    context: FlowContext,
) -> Callable[[dict[str, Any] | None], GroupLogic | Retired]:
    """The builder ``op.stateful_batch`` calls for each key (with its resume state): a
    group, or (the state of one shard: a store from before groups) a ``Retired``.
    ``ValueError`` naming a state that is neither.

    >>> from flows.service.instances.registry import LiveRegistry, Registry
    >>> live = LiveRegistry(Registry.from_toml('[experiments.e]\\narms = ["a"]'))
    >>> build = group_builder(FlowContext(live))
    >>> build(None).shards, build({"group": "group-000-of-008", "shards": {}}).group
    ({}, 'group-000-of-008')
    """

    def build(resume: dict[str, Any] | None) -> GroupLogic | Retired:
        if resume is None or "group" in resume:
            return GroupLogic(context, resume)
        if "shard" in resume:
            return Retired(context, resume)
        raise ValueError(
            f"a resumed state of the stateful step that is neither a key group's "
            f"nor a shard's: keys {sorted(resume)}"
        )

    return build
