"""Input partitions whose consumer stopped fetching.

librdkafka refetches by itself after a broker outage, but a partition's fetcher can stay
stuck after one (seen after a broker's hang on a loaded host: one partition of two not
read for minutes while librdkafka called it "active", the other served, the broker up).
Its own statistics cannot tell: a fetcher that does not fetch learns no new end either.
So a thread of the process asks each read partition's end of its leader every
``ASK_EVERY_S`` (one batched ListOffsets, off the worker), and a partition whose fetch
position has not moved for ``STALL_S`` while its end lay beyond it rebuilds its consumer
at its own position (``kafka_partition.ObservedPartition``): nothing is skipped or read
twice.

>>> stalled(End(10, at=100.0), position=5, moved_at=30.0)
True
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flows.service.connectors.kafka_admin import LATEST, offsets_at

log = logging.getLogger(__name__)

#: Seconds a partition's fetch position may stay put while its end lies beyond it.
#: librdkafka's own retries (reconnects, leader changes, offset validation) take seconds.
STALL_S = 60.0
#: Seconds between two asks of the ends.
ASK_EVERY_S = 10.0
#: Seconds one ask of the ends may take.
ASK_TIMEOUT_S = 5.0
#: Seconds between two reads of a partition after which its stillness counts afresh: the
#: worker was held elsewhere (an epoch's close waiting for the brokers), not the fetcher.
WORKER_AWAY_S = 5.0
#: Seconds between two looks at whether a partition's fetcher stopped.
LOOK_EVERY_S = 0.5


@dataclass(frozen=True)
class End:
    """A partition's end offset, asked at ``at`` (``time.monotonic()``), the brokers
    answering every ask ``since`` then."""

    offset: int
    at: float
    since: float = float("-inf")


def stalled(end: End | None, position: int, moved_at: float, stall_s: float = STALL_S) -> bool:
    """Whether a partition's fetcher has stopped: when ``end`` was asked it lay beyond
    ``position`` (the next offset to fetch), which had not moved for ``stall_s`` by then,
    counted while the brokers answered (after an outage librdkafka resumes by itself).

    >>> stalled(End(10, at=100.0), position=5, moved_at=50.0)  # moved 50 s before
    False
    >>> stalled(End(10, at=100.0, since=90.0), position=5, moved_at=0.0)  # brokers back
    False
    >>> stalled(End(5, at=100.0), position=5, moved_at=0.0)  # nothing to read
    False
    >>> stalled(None, position=5, moved_at=0.0)  # the end is not known
    False
    """
    if end is None or end.offset <= position:
        return False
    return end.at - max(moved_at, end.since) >= stall_s


class EndWatch:
    """The ends of the partitions this process reads, asked from a daemon thread.

    ``watch`` a partition (with its consumer's settings, for the connection), read its
    ``end``, ``forget`` it when it closes; ``ask`` asks once (the thread's step). A failed
    ask (brokers away) leaves the ends as they were and is asked again.

    >>> watch = EndWatch(ask=lambda config, parts: [7 for _ in parts], start=False)
    >>> watch.watch("t", 0, {"bootstrap.servers": "b:9092"})
    >>> watch.ask(); watch.end("t", 0).offset
    7
    """

    def __init__(
        self,
        ask: Callable[[dict[str, Any], list[tuple[str, int]]], list[int]] | None = None,
        every_s: float = ASK_EVERY_S,
        start: bool = True,
    ) -> None:
        self._ask = ask or self._ask_leaders
        self._every_s = every_s
        self._start = start
        self._lock = threading.Lock()
        self._configs: dict[tuple[str, int], dict[str, Any]] = {}
        self._ends: dict[tuple[str, int], End] = {}
        self._thread: threading.Thread | None = None
        self._client: tuple[dict[str, Any], Any] | None = None  # its settings, a consumer
        self._since: float | None = None  # the first of the asks answered since

    def watch(self, topic: str, partition: int, config: dict[str, Any]) -> None:
        """Ask ``topic[partition]``'s end from now on, connecting as ``config`` says."""
        settings = {k: v for k, v in config.items() if not callable(v)}
        with self._lock:
            self._configs[(topic, partition)] = settings
            if self._start and self._thread is None:
                self._thread = threading.Thread(target=self._run, name="tsi-end-watch", daemon=True)
                self._thread.start()

    def forget(self, topic: str, partition: int) -> None:
        """Stop asking ``topic[partition]``'s end."""
        with self._lock:
            self._configs.pop((topic, partition), None)
            self._ends.pop((topic, partition), None)

    def end(self, topic: str, partition: int) -> End | None:
        """The last end asked of ``topic[partition]``, or None."""
        return self._ends.get((topic, partition))

    def ask(self) -> None:
        """Ask every watched partition's end once (one batched ask)."""
        with self._lock:
            parts = list(self._configs)
            config = next(iter(self._configs.values()), None)
        if config is None:
            self._close_client()
            return
        at = time.monotonic()
        try:
            offsets = self._ask(config, parts)
        except Exception:
            self._since = None
            raise
        self._since = at if self._since is None else self._since
        with self._lock:
            for part, offset in zip(parts, offsets, strict=True):
                if part in self._configs and offset >= 0:
                    self._ends[part] = End(offset, at, self._since)

    def _ask_leaders(self, config: dict[str, Any], parts: list[tuple[str, int]]) -> list[int]:
        """The high watermarks of ``parts``, asked with one consumer kept while the
        settings stay the same (it never subscribes, so it never joins a group)."""
        from confluent_kafka import Consumer

        if self._client is None or self._client[0] != config:
            self._close_client()
            settings = {**config, "statistics.interval.ms": 0, "enable.auto.commit": False}
            self._client = (config, Consumer(settings))
        return offsets_at(self._client[1], parts, LATEST, ASK_TIMEOUT_S)

    def _close_client(self) -> None:
        if self._client is not None:
            self._client[1].close()
            self._client = None

    def _run(self) -> None:
        while True:
            time.sleep(self._every_s)
            try:
                self.ask()
            except Exception as exc:  # brokers away: ask again next time
                log.debug("asking the input partitions' ends: %s", exc)


#: The process's watch: every input partition it reads.
END_WATCH = EndWatch()


class Stillness:
    """How long one partition's fetch position has stood still while its worker read it:
    ``stopped``, at a read once ``look_at`` has come (every ``LOOK_EVERY_S``), says when
    to rebuild its consumer (``stalled`` against the watch's end); ``note_fetching`` takes
    librdkafka's statistics of the partition.

    >>> watch = EndWatch(ask=lambda config, parts: [9], start=False)
    >>> watch.watch("t", 0, {}); watch.ask()
    >>> still = Stillness(watch, "t", 0, offset=4, now=0.0)
    >>> still.note_fetching(4, "active", now=0.0)
    >>> watch._ends[("t", 0)] = End(9, at=STALL_S + 1.0)  # asked a minute on, still at 4
    >>> still.stopped(now=0.5, offset=4), still.look_at
    (True, 1.0)
    """

    def __init__(self, watch: EndWatch, topic: str, partition: int, offset: int, now: float):
        self.watch, self.part = watch, (topic, partition)
        self.fetching = (-1, "none")  # librdkafka's next offset to fetch, fetch state
        self.moved_at = now  # when the fetch or read position last moved
        self.read_to = offset
        self.look_at = now  # the next look (a read long after it: the worker was away)

    def note_fetching(self, next_offset: int, state: str, now: float) -> None:
        """The fetcher's next offset and state (from the statistics)."""
        if next_offset != self.fetching[0]:
            self.moved_at = now
        self.fetching = (next_offset, state)

    def stopped(self, now: float, offset: int) -> bool:
        """At a read once ``look_at`` has come (``offset``: the next the partition reads):
        whether its fetcher has stopped. Never without statistics: a transaction's end
        marker would look unread."""
        if now - self.look_at > WORKER_AWAY_S:  # a worker held elsewhere reads nothing
            self.moved_at = now
        self.look_at = now + LOOK_EVERY_S
        if offset != self.read_to:  # the statistics may be off: reading moves too
            self.read_to, self.moved_at = offset, now
        if self.fetching[1] == "none":
            return False
        return stalled(self.watch.end(*self.part), self.position(offset), self.moved_at)

    def position(self, offset: int) -> int:
        """The next offset fetched or read, whichever is further."""
        return max(self.fetching[0], offset)
