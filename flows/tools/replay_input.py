"""Reading the logs ``tsi replay`` replays, lazily: JSONL files, several files merged by
``ts``, and Kafka topic ranges merged across partitions by Kafka timestamp; and what a
valid ``ts`` is.

>>> [origin for _, origin in merge_by_time([(b'{"ts": 2}', "a")], [(b'{"ts": 1}', "b")])]
['b', 'a']
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

from flows.service.connectors.files import read_lines as read_jsonl
from flows.service.dataflow import Message
from flows.service.events import Origin

#: the valid ``ts`` range, Unix seconds: not before 1970, not after about the year 5100
TS_MIN, TS_MAX = 0.0, 1e11


class ReplayError(ValueError):
    """The log cannot be read (missing file, unreadable topic range)."""


def valid_ts(value: Any) -> float | None:
    """A usable ``ts``: a finite number of Unix seconds in [TS_MIN, TS_MAX], else None.

    >>> valid_ts(1767225600), valid_ts(1e308), valid_ts(-1), valid_ts("1"), valid_ts(True)
    (1767225600.0, None, None, None, None)
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        ts = float(value)
    except OverflowError:
        return None
    return ts if TS_MIN <= ts <= TS_MAX else None  # NaN fails both


def line_ts(raw: bytes) -> float | None:
    """The valid ``ts`` of a raw line, None if it has none (or is no JSON object).

    >>> line_ts(b'{"ts": 5}'), line_ts(b'{"ts": "5"}'), line_ts(b"[5]"), line_ts(b"\\xff")
    (5.0, None, None, None)
    """
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return valid_ts(data.get("ts")) if isinstance(data, dict) else None


def read_lines(path: Path) -> Iterator[Message]:
    """Non-empty lines of a JSONL file with their origin (file, line number), lazily."""
    try:
        for message, _ in read_jsonl(path):
            yield message
    except OSError as exc:
        raise ReplayError(f"cannot read {path}: {exc.strerror or exc}") from None


def merge_by_time(*streams: Iterable[Message]) -> Iterator[Message]:
    """One order for several logs, streamed: by ``ts``, each log in its own order; a line
    without a valid ``ts`` keeps the time of the line before it in its log (-inf before
    any); ties keep log order (first log first).

    >>> a = [(b'{"ts": 1}', "a1"), (b'{"ts": 5}', "a2")]
    >>> b = [(b'{"ts": 2}', "b1"), (b"{", "b2"), (b'{"ts": 9}', "b3")]
    >>> [origin for _, origin in merge_by_time(a, b)]
    ['a1', 'b1', 'b2', 'a2', 'b3']
    """

    def timed(stream: Iterable[Message], rank: int) -> Iterator[tuple[tuple, Message]]:
        last = -math.inf
        for index, message in enumerate(stream):
            ts = line_ts(message[0])
            last = last if ts is None else ts
            yield (last, rank, index), message

    keyed = [timed(stream, rank) for rank, stream in enumerate(streams)]
    return (message for _, message in heapq.merge(*keyed, key=lambda kv: kv[0]))


def kafka_range(
    brokers: str,
    topic: str,
    start: int | None = None,
    end: int | None = None,
    config: dict[str, Any] | None = None,
    timeout: float = 10.0,
) -> Iterator[Message]:
    """Messages of every partition of ``topic`` with ``start <= offset < end`` (default:
    all that are there now), streamed in Kafka timestamp order across partitions
    (``_Merge``); each message's origin carries its timestamp (``Origin.time``)."""
    from confluent_kafka import Consumer, KafkaException

    consumer = None
    try:
        settings = {"group.id": "tsi-replay", "enable.auto.commit": False, "fetch.wait.max.ms": 50}
        settings |= config or {}
        consumer = Consumer({"bootstrap.servers": brokers, **settings})
        ranges = _ranges(consumer, brokers, topic, start, end, timeout)
        yield from _Merge(consumer, topic, ranges, timeout)
    except KafkaException as exc:
        raise ReplayError(f"cannot read {topic} from {brokers}: {exc}") from None
    finally:
        if consumer is not None:
            consumer.close()


def _ranges(
    consumer: Any, brokers: str, topic: str, start: int | None, end: int | None, timeout: float
) -> dict[int, tuple[int, int]]:
    """(first offset, stop offset) of each partition with something to read."""
    from confluent_kafka import TopicPartition

    info = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
    if info is None or info.error is not None or not info.partitions:
        raise ReplayError(f"topic {topic!r} not found on {brokers}")
    out = {}
    for p in sorted(info.partitions):
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
        first, stop = max(low, start or 0), high if end is None else min(high, end)
        if first < stop:
            out[p] = (first, stop)
    return out


class _Merge:
    """A streaming k-way merge of the partitions one consumer reads: by Kafka timestamp
    (within a partition its running maximum, so a partition keeps its offset order), ties
    by partition. A partition holds at most ``LIMIT`` messages read ahead (it is paused)."""

    LIMIT = 1000

    def __init__(
        self, consumer: Any, topic: str, ranges: dict[int, tuple[int, int]], timeout: float
    ) -> None:
        from confluent_kafka import TopicPartition

        self.consumer, self.topic, self.timeout = consumer, topic, timeout
        self.stop = {p: stop for p, (_, stop) in ranges.items()}
        self.parts = {p: TopicPartition(topic, p) for p in ranges}
        self.held: dict[int, deque] = {p: deque() for p in ranges}
        self.time = dict.fromkeys(ranges, -math.inf)
        self.waiting = set(ranges)  # partitions with no head in the heap, not finished
        self.paused: set[int] = set()
        if ranges:
            consumer.assign([TopicPartition(topic, p, first) for p, (first, _) in ranges.items()])

    def __iter__(self) -> Iterator[Message]:
        heap: list[tuple[float, int, int, Message]] = []
        while True:
            while self.waiting:
                self._read()
                for p in [p for p in self.waiting if self.held[p]]:
                    heapq.heappush(heap, self.held[p].popleft())
                    self.waiting.discard(p)
            if not heap:
                return
            _, p, offset, message = heapq.heappop(heap)
            yield message
            if offset + 1 >= self.stop[p]:
                self._pause(p)  # done
            elif self.held[p]:
                heapq.heappush(heap, self.held[p].popleft())
            else:
                self.waiting.add(p)
            if (
                p in self.paused
                and offset + 1 < self.stop[p]
                and len(self.held[p]) < self.LIMIT // 2
            ):
                self.consumer.resume([self.parts[p]])
                self.paused.discard(p)

    def _read(self) -> None:
        """Read what the consumer has (or fail after ``timeout`` without any)."""
        first = self.consumer.poll(self.timeout)  # consume() would wait for a full batch
        if first is None:
            self._check_ends()
            return
        for msg in [first, *self.consumer.consume(499, 0)]:
            if msg.error():
                raise ReplayError(f"{self.topic}[{msg.partition()}]: {msg.error()}")
            p, offset = msg.partition(), msg.offset()
            if p not in self.stop or offset >= self.stop[p]:
                continue
            kind, ms = msg.timestamp()
            at = ms / 1000.0 if kind and ms >= 0 else None
            self.time[p] = key = max(self.time[p], -math.inf if at is None else at)
            origin = Origin(self.topic, p, offset, at)
            self.held[p].append((key, p, offset, (msg.value() or b"", origin)))
            if len(self.held[p]) >= self.LIMIT:
                self._pause(p)

    def _check_ends(self) -> None:
        """Nothing came: partitions read to their end (their last offsets were not
        messages, e.g. transaction markers) are done; any other is an error."""
        for p in list(self.waiting):
            [position] = self.consumer.position([self.parts[p]])
            if position.offset >= self.stop[p]:
                self.waiting.discard(p)
            else:
                raise ReplayError(f"{self.topic}[{p}]: no message within {self.timeout:g} s")

    def _pause(self, p: int) -> None:
        if p not in self.paused:
            self.consumer.pause([self.parts[p]])
            self.paused.add(p)
