"""A shard's changelog layer: what its store writes through, and the exactly-once guard.

The outermost of a shard's tiers (Kafka Streams' layered stores: cache -> store ->
changelog, the guard in front): ``ShardStore`` keeps its instances live and resting and
writes its log; a ``ChangelogLayer`` mirrors those writes to the shard's changelog
(``changelog.Mirror``), ends each epoch with a marker, and holds what the shard's state
includes of its input (``Mirrored.seen``). ``begin`` decides, once, what the shard starts
from (``changelog.start``): the restored state and the input positions it includes are
decided together, and ``admit`` drops what a shard rebuilt from its changelog already
holds (``guard``), so that each input event is applied once.

>>> from flows.service.instances.resting import Entry
>>> from flows.service.shards.changelog import MemoryChangelog
>>> layer = ChangelogLayer(MemoryChangelog())
>>> layer.begin("shard-000-of-001", {}, None, None)  # a first start: nothing anywhere
({}, None, False)
>>> len(layer.write([Entry("e", "e", "state", {})])) > 0, layer.unmarked
(True, True)
>>> layer.mark()["seq"]  # the epoch's marker, acknowledged
1
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flows.service.instances.instance import Early, Instance
from flows.service.instances.registry import Experiment
from flows.service.instances.resting import Entry
from flows.service.shards.changelog import Changelog, Mirror, Mirrored, encode, start
from flows.service.wire.events import Feedback, Request

Routed = tuple[str, Experiment, Request | Feedback]  # (instance key, its experiment, event)
#: Where a guarded request's instance is, live or built from its resting bytes (None: not
#: held, or it cannot be built); one built is live from then on.
Held = Callable[[str, Experiment], Instance | None]


class ChangelogLayer:
    """One shard's changelog: the mirror its writes go to (``mirror``), where the
    changelog stands (``mirrored``), the input a rebuilt shard already holds (``guard``:
    per input partition, events at or below that offset are dropped), whether
    anything was sent since the last marker (``unmarked``) and whether a marker waits to
    be settled (``sent``)."""

    def __init__(self, changelog: Changelog) -> None:
        self.changelog = changelog
        self.mirror: Mirror | None = None  # set by ``begin``
        self.mirrored: Mirrored | None = None
        self.guard: dict[tuple[str, int], int] = {}
        self.unmarked = False
        self.sent = False  # a marker sent, not yet settled

    def begin(
        self,
        shard: str,
        entries: dict[str, Entry],
        damaged: str | None,
        resume: dict[str, Any] | None,
    ) -> tuple[dict[str, Entry], str | None, bool]:
        """The entries shard ``shard`` starts from (its log's ``entries``, read as of
        ``resume``, or rebuilt from the changelog: ``changelog.start``), the problem
        found, if any, and whether it was rebuilt (a new generation of its log holds it).

        >>> from flows.service.shards.changelog import MemoryChangelog
        >>> layer = ChangelogLayer(MemoryChangelog())
        >>> layer.begin("shard-000-of-001", {}, None, None), layer.mirrored.seq
        (({}, None, False), 0)
        """
        mirrored = resume and resume.get("changelog")
        begun = start(self.changelog, shard, entries, damaged, mirrored)
        self.mirror = self.changelog.mirror(shard)
        self.mirrored, self.guard = begun.mirrored, begun.guard
        return begun.entries, begun.problem, begun.rebuilt

    def admit(self, events: list[Routed], now: Callable[[], float], held: Held) -> list[Routed]:
        """Note the input the state now includes (``Marker.seen``), and drop what a shard
        rebuilt from its changelog already holds (``guard``), but for the requests it
        answers again (``_answers_again``); ``now``: what a kept answer's age is measured
        against, ``held``: where a request's instance is.

        >>> from flows.service.shards.changelog import MemoryChangelog
        >>> layer = ChangelogLayer(MemoryChangelog())
        >>> _ = layer.begin("shard-000-of-001", {}, None, None)
        >>> layer.admit([], lambda: 0.0, lambda key, experiment: None), layer.unmarked
        ([], False)
        """
        seen, guard = self.mirrored.seen, self.guard
        kept = [] if guard else events
        for routed in events:
            if routed[1] is None:  # a wake-up (``_event_loop``): no input
                if guard:
                    kept.append(routed)
                continue
            origin = routed[2].origin
            offset = origin.offset
            if offset is None or origin.partition is None:  # not from Kafka
                if guard:
                    kept.append(routed)
                continue
            where = (origin.source, origin.partition)
            if guard:
                if offset <= guard.get(where, -1) and not _answers_again(routed, now, held):
                    continue
                kept.append(routed)
            if offset > seen.get(where, -1):
                seen[where] = offset
                self.unmarked = True  # the next marker says so; a wake-up alone does not
        return kept

    def write(self, entries: list[Entry]) -> bytes:
        """The log's records of ``entries``, one each, each also sent to the changelog
        keyed by its instance (each entry pickled once, the same bytes in both)."""
        records = [(entry.key, encode([entry])) for entry in entries]
        if records:
            self.mirror.extend(records)
            self.unmarked = True
        return b"".join([record for _, record in records])

    def send_mark(self) -> bool:
        """An epoch's close, its first phase: its marker sent after its entries (if
        anything was sent since the last one), not waited for; whether one was sent. The
        close is not over until ``settled`` has the marker's acknowledgement."""
        if not self.unmarked:
            return False
        self.mirror.mark(self.mirrored.marker())
        self.unmarked, self.sent = False, True
        return True

    def settled(self, offset: int | None) -> dict[str, Any]:
        """An epoch's close, its second phase, once the changelog acknowledged everything
        sent (``Changelog.settle``: it raises if anything was refused, and the epoch is not
        committed): ``offset`` is the marker's, if ``send_mark`` sent one; where the
        changelog now stands (``Mirrored``, as a dict)."""
        now = self.mirrored
        if self.sent:
            now.seq, now.offset, self.sent = now.seq + 1, offset, False
        return {**vars(now), "seen": dict(now.seen)}

    def mark(self) -> dict[str, Any]:
        """An epoch's close of this shard alone: ``send_mark``, the acknowledgement waited
        for, ``settled``."""
        offset = self.mirror.acknowledged() if self.send_mark() else None
        return self.settled(offset)


def _answers_again(routed: Routed, now: Callable[[], float], held: Held) -> bool:
    """Whether a request a rebuilt shard already holds goes on to its instance all the
    same: its answer may be one the crash kept from being written (the changelog had the
    epoch, the selections' topic not yet), and an instance that still holds the request
    answers it again as a retry, changing nothing. One too old to be held is not looked
    up (no instance is revived for it)."""
    key, experiment, event = routed
    if not isinstance(event, Request) or event.origin.time is None:
        return False
    if event.origin.time + experiment.feedback_ttl + experiment.retry_window < now():
        return False
    instance = held(key, experiment)
    if instance is None:
        return False
    answer = instance.get(event.request_id)  # an answer; not feedback waiting for it
    return answer is not None and not isinstance(answer, Early)
