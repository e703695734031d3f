"""Reading the logs ``tsi replay`` replays, lazily: JSONL files, several files merged by
``ts``, and Kafka topic ranges merged across partitions and topics by Kafka timestamp,
each topic read as what it is in the service's setup (``TopicLog``); and what a valid
``ts`` is.

>>> [origin for _, origin in merge_by_time([(b'{"ts": 2}', "a")], [(b'{"ts": 1}', "b")])]
['b', 'a']
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from flows.service.connectors.files import read_lines as read_jsonl
from flows.service.connectors.kafka import FEEDBACK_TAG, REQUEST_TAG
from flows.service.connectors.topics import Topics
from flows.service.dataflow import Message
from flows.service.wire._records import internal_message
from flows.service.wire.events import DeadLetter, Origin

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


@dataclass(frozen=True)
class TopicLog:
    """Kafka topics to replay, each read as what it is in the service's setup (the names
    ``tsi run`` is given): ``requests`` and ``feedback``, the two input topics, each of one
    kind (give both); ``internal``, where the service copies both and serves from, read as
    its copies, each as its original (give it alone); any other topic holds combined
    events (field ``type``). Several topics are merged by Kafka timestamp, ties to the
    requests. A bad combination raises ``ReplayError`` naming it.

    >>> log = TopicLog(("tsi.feedback", "tsi.requests"))
    >>> log.ordered, log.kinds["tsi.feedback"], TopicLog(("tsi.events",)).combined
    (('tsi.requests', 'tsi.feedback'), 'feedback', ('tsi.events',))
    >>> try:
    ...     TopicLog(("tsi.requests",))
    ... except ReplayError as exc:
    ...     print(exc)  # doctest: +ELLIPSIS
    --topic tsi.requests (the requests topic) needs the feedback topic tsi.feedback too, ...
    """

    topics: tuple[str, ...]
    requests: str = Topics.requests
    feedback: str = Topics.feedback
    internal: str | None = Topics.internal  # None or "": the service has none

    def __post_init__(self) -> None:
        topics, inputs = self.topics, (self.requests, self.feedback)
        if not topics or not all(topics):
            raise ReplayError(f"--topic must name a topic, got {list(topics)}")
        twice = sorted({t for t in topics if topics.count(t) > 1})
        if twice:
            raise ReplayError(f"--topic {twice[0]} is given twice")
        if self.requests == self.feedback:
            raise ReplayError(f"the requests and feedback topics are both {self.requests!r}")
        if self.internal and self.internal in topics and len(topics) > 1:
            others = ", ".join(t for t in topics if t != self.internal)
            raise ReplayError(
                f"the internal topic {self.internal} holds copies of both input topics: "
                f"replay it alone (without {others})"
            )
        for kind, name, other in (("requests", *inputs), ("feedback", *inputs[::-1])):
            if name in topics and other not in topics:
                tail = f", or replay the internal topic {self.internal} alone"
                raise ReplayError(
                    f"--topic {name} (the {kind} topic) needs the "
                    f"{'feedback' if kind == 'requests' else 'requests'} topic {other} too"
                    + (tail if self.internal else "")
                )

    @property
    def ordered(self) -> tuple[str, ...]:
        """The topics in merge order: the requests topic first (it wins ties)."""
        return tuple(sorted(self.topics, key=lambda t: t != self.requests))

    @property
    def combined(self) -> tuple[str, ...]:
        """The topics read as combined events (neither input topic, nor the internal one)."""
        named = (self.requests, self.feedback, self.internal)
        return tuple(t for t in self.topics if t not in named)

    @property
    def kinds(self) -> dict[str, str]:
        """The kind of the messages of each input topic (read by origin, so a copy from
        the internal topic is parsed as its original); other topics are combined."""
        return {self.requests: "request", self.feedback: "feedback"}

    def read(
        self,
        brokers: str,
        start: int | None = None,
        end: int | None = None,
        config: dict[str, Any] | None = None,
    ) -> Iterator[Message]:
        """The messages of the topics' ranges, read with the client settings ``config``
        (see ``kafka_range``)."""
        copies = None
        if self.internal in self.topics:
            copies = {self.internal: {REQUEST_TAG: self.requests, FEEDBACK_TAG: self.feedback}}
        return kafka_range(brokers, self.ordered, start, end, config, copies=copies)


def kafka_range(
    brokers: str,
    topics: str | Sequence[str],
    start: int | None = None,
    end: int | None = None,
    config: dict[str, Any] | None = None,
    timeout: float = 10.0,
    copies: dict[str, dict[bytes, str]] | None = None,
) -> Iterator[Message]:
    """Messages of every partition of ``topics`` with ``start <= offset < end`` (default:
    all that are there now), streamed in Kafka timestamp order across partitions and
    topics (``_Merge``, ties to the first topic); each message's origin carries its
    timestamp (``Origin.time``). ``copies`` maps an internal topic to the input topic of
    each copy tag: its messages are read as the service reads them
    (``_records.internal_message``): each copy as its original (origin and all), a second
    copy dropped, a message that is no copy as its ``not_a_copy`` dead letter."""
    from confluent_kafka import Consumer, KafkaException

    names = (topics,) if isinstance(topics, str) else tuple(topics)
    consumer = None
    try:
        settings = {"group.id": "tsi-replay", "enable.auto.commit": False, "fetch.wait.max.ms": 50}
        settings |= config or {}
        consumer = Consumer({"bootstrap.servers": brokers, **settings})
        ranges = _ranges(consumer, brokers, names, start, end, timeout)
        yield from _Merge(consumer, names, ranges, timeout, copies or {})
    except KafkaException as exc:
        raise ReplayError(f"cannot read {', '.join(names)} from {brokers}: {exc}") from None
    finally:
        if consumer is not None:
            consumer.close()


Part = tuple[str, int]  # topic, partition


def _ranges(
    consumer: Any,
    brokers: str,
    topics: tuple[str, ...],
    start: int | None,
    end: int | None,
    timeout: float,
) -> dict[Part, tuple[int, int]]:
    """(first offset, stop offset) of each partition with something to read."""
    from confluent_kafka import TopicPartition

    out = {}
    for topic in topics:
        info = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if info is None or info.error is not None or not info.partitions:
            raise ReplayError(f"topic {topic!r} not found on {brokers}")
        for p in sorted(info.partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            first, stop = max(low, start or 0), high if end is None else min(high, end)
            if first < stop:
                out[(topic, p)] = (first, stop)
    return out


class _Merge:
    """A streaming k-way merge of the partitions one consumer reads: by Kafka timestamp
    (within a partition its running maximum, so a partition keeps its offset order), ties
    by topic then partition. A partition holds at most ``LIMIT`` messages read ahead (it
    is paused). A dropped second copy is held as None: it still moves its partition on."""

    LIMIT = 1000

    def __init__(
        self,
        consumer: Any,
        topics: tuple[str, ...],
        ranges: dict[Part, tuple[int, int]],
        timeout: float,
        copies: dict[str, dict[bytes, str]],
    ) -> None:
        from confluent_kafka import TopicPartition

        self.consumer, self.timeout, self.copies = consumer, timeout, copies
        self.topics, self.rank = topics, {topic: rank for rank, topic in enumerate(topics)}
        self.stop = {part: stop for part, (_, stop) in ranges.items()}
        self.parts = {part: TopicPartition(*part) for part in ranges}
        self.held: dict[Part, deque] = {part: deque() for part in ranges}
        self.time = dict.fromkeys(ranges, -math.inf)
        self.seen: dict[Part, dict[bytes, int]] = {part: {} for part in ranges}  # copies
        self.waiting = set(ranges)  # partitions with no head in the heap, not finished
        self.paused: set[Part] = set()
        if ranges:
            consumer.assign([TopicPartition(*part, first) for part, (first, _) in ranges.items()])

    def __iter__(self) -> Iterator[Message]:
        heap: list[tuple[float, int, int, int, Message | None]] = []
        while True:
            while self.waiting:
                self._read()
                for part in [part for part in self.waiting if self.held[part]]:
                    heapq.heappush(heap, self.held[part].popleft())
                    self.waiting.discard(part)
            if not heap:
                return
            _, rank, p, offset, message = heapq.heappop(heap)
            part = (self.topics[rank], p)
            if message is not None:
                yield message
            if offset + 1 >= self.stop[part]:
                self._pause(part)  # done
            elif self.held[part]:
                heapq.heappush(heap, self.held[part].popleft())
            else:
                self.waiting.add(part)
            if (
                part in self.paused
                and offset + 1 < self.stop[part]
                and len(self.held[part]) < self.LIMIT // 2
            ):
                self.consumer.resume([self.parts[part]])
                self.paused.discard(part)

    def _read(self) -> None:
        """Read what the consumer has (or fail after ``timeout`` without any)."""
        first = self.consumer.poll(self.timeout)  # consume() would wait for a full batch
        if first is None:
            self._check_ends()
            return
        for msg in [first, *self.consumer.consume(499, 0)]:
            topic, p = msg.topic(), msg.partition()
            if msg.error():
                raise ReplayError(f"{topic}[{p}]: {msg.error()}")
            part, offset = (topic, p), msg.offset()
            if part not in self.stop or offset >= self.stop[part]:
                continue
            kind, ms = msg.timestamp()
            at = ms / 1000.0 if kind and ms >= 0 else None
            self.time[part] = key = max(self.time[part], -math.inf if at is None else at)
            held = self.held[part]
            held.append((key, self.rank[topic], p, offset, self._message(msg, part, at)))
            if len(held) >= self.LIMIT:
                self._pause(part)

    def _message(
        self, msg: Any, part: Part, at: float | None
    ) -> tuple[bytes | DeadLetter, Origin] | None:
        """A message as (bytes, Origin); of an internal topic, as the service reads it:
        its original, None for a second copy, (its dead letter, origin) for no copy."""
        topic, p = part
        inputs = self.copies.get(topic)
        if inputs is None:
            return msg.value() or b"", Origin(topic, p, msg.offset(), at)
        copy = internal_message(self.seen[part], inputs, topic, p, msg)
        return (copy, copy.origin) if isinstance(copy, DeadLetter) else copy

    def _check_ends(self) -> None:
        """Nothing came: partitions read to their end (their last offsets were not
        messages, e.g. transaction markers) are done; any other is an error."""
        for part in list(self.waiting):
            [position] = self.consumer.position([self.parts[part]])
            if position.offset >= self.stop[part]:
                self.waiting.discard(part)
            else:
                topic, p = part
                raise ReplayError(f"{topic}[{p}]: no message within {self.timeout:g} s")

    def _pause(self, part: Part) -> None:
        if part not in self.paused:
            self.consumer.pause([self.parts[part]])
            self.paused.add(part)
