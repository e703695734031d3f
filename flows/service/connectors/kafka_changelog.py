"""The shards' changelogs on Kafka: one compacted topic, partition = shard index.

``KafkaChangelog`` is the ``shards.changelog.Changelog`` the service's shards mirror their
logs to: one idempotent producer per process (each shard's records go to its own
partition, explicitly, in order), and an epoch's close waits once, for all the shards it
closes (``settle``), for the acknowledgement of what they sent: each one's marker's
offset, records without a callback each (``KafkaMirror``).
Reading back assigns one consumer to the partitions of the shards read (all of a
process's, at its start: ``prefetch``) and reads each to its end; a read the broker does
not answer is asked again, never taken as an empty shard. Client settings (SASL, TLS,
...) pass through the two config dicts. A record longer than a message may be (the
topic's ``max.message.bytes``, read at the first mirror, and the producer's
``message.max.bytes``, less ``HEADROOM``) goes in chunks (``changelog_chunks``).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka import KafkaError as ConfluentKafkaError

from flows.service.connectors.kafka_admin import (
    BROKER_DEFAULT_MAX_MESSAGE_BYTES,
    LATEST,
    TopicError,
    admin_client,
    max_message_bytes,
    offsets_at,
    transient,
)
from flows.service.connectors.kafka_sink import names_of
from flows.service.shards.changelog import (
    MARKER_KEY,
    ChangelogError,
    Marker,
    Record,
    encode,
    shard_index,
)
from flows.service.shards.changelog_chunks import ChunkedMirror

log = logging.getLogger(__name__)

#: Seconds reading a partition back may take before it counts as unreadable.
READ_TIMEOUT_S = 60.0
#: Seconds between two log lines while an epoch's close waits for the broker.
_WAIT_LOG_S = 10.0
#: The longest wait between two tries of a changelog read.
_MAX_BACKOFF_S = 5.0
#: Bytes of a message left to its key and the batch's framing: a chunk is that much shorter.
HEADROOM = 16 * 1024
#: librdkafka's default ``message.max.bytes``: the producer refuses a longer message.
PRODUCER_MAX_MESSAGE_BYTES = 1_000_000


class KafkaChangelog:
    """The shards' changelogs in ``topic`` on ``brokers`` (partition = shard index)."""

    def __init__(
        self,
        brokers: list[str],
        topic: str,
        producer_config: dict[str, Any] | None = None,
        consumer_config: dict[str, Any] | None = None,
        read_timeout: float = READ_TIMEOUT_S,
        application: str = "tsi",
        max_message_bytes: int | None = None,
    ) -> None:
        self.brokers = names_of("brokers", brokers)
        self.topic = topic
        self.name = topic
        self.application = application
        self._producer_config = dict(producer_config or {})
        self._consumer_config = dict(consumer_config or {})
        self._read_timeout = read_timeout
        self._producer: Producer | None = None
        self._lock = threading.Lock()
        self._ahead: dict[tuple[int, int], list[Record]] = {}  # prefetched, by (p, after)
        self._max_message_bytes = max_message_bytes  # None: the topic's, read when needed
        self._chunked: dict[int, dict[str, int]] = {}  # per partition: ChunkedMirror.counts

    def producer(self) -> Producer:
        """The process's one producer, built on first use (Bytewax's workers share it)."""
        with self._lock:
            if self._producer is None:
                config = {
                    "bootstrap.servers": ",".join(self.brokers),
                    "client.id": "tsi-changelog",
                    "linger.ms": 1,
                    "message.timeout.ms": 0,  # a broker outage is waited out
                    **self._batch(),
                    **self._producer_config,
                    "enable.idempotence": True,  # in order, no duplicates
                    "acks": "all",
                    "delivery.report.only.error": False,  # the marker's offset is reported
                }
                self._producer = Producer(config)
            return self._producer

    def _batch(self) -> dict[str, int]:
        """A batch no longer than a topic's max.message.bytes below the producer's."""
        limit = self._max_message_bytes
        return {} if limit is None or limit >= PRODUCER_MAX_MESSAGE_BYTES else {"batch.size": limit}

    def mirror(self, shard: str) -> ChunkedMirror:
        partition = shard_index(shard)
        limit = self.chunk_bytes()
        with self._lock:
            counts = self._chunked.setdefault(partition, {})
        return ChunkedMirror(KafkaMirror(self, partition), limit, counts)

    def settle(self, mirrors: list[ChunkedMirror]) -> list[int | None]:
        """Wait once for everything ``mirrors`` (this changelog's) sent: each one's last
        marker's offset (None: none since the last call); ``RuntimeError`` naming the
        first refusal if any (``KafkaMirror.collected``)."""
        return self.settle_mirrors([mirror.mirror for mirror in mirrors])

    def settle_mirrors(self, mirrors: list[KafkaMirror]) -> list[int | None]:
        """``settle`` of the mirrors themselves: the producer polled until none of them
        waits for a report, one wait for all (logged while it lasts)."""
        producer = self.producer()
        started = next_log = time.monotonic()
        while (waiting := sum(mirror._pending for mirror in mirrors)) > 0:
            producer.poll(0.1)
            if time.monotonic() - next_log > _WAIT_LOG_S:
                next_log = time.monotonic()
                log.warning(
                    "changelog %s: %d records of %d shards not acknowledged after %.0f s",
                    self.topic,
                    waiting,
                    len(mirrors),
                    next_log - started,
                )
        if any(mirror._since for mirror in mirrors):  # records no marker follows yet
            producer.flush()  # written, but a refusal among them shows at the next marker
        return [mirror.collected() for mirror in mirrors]

    def chunk_bytes(self) -> int:
        """The longest record value sent as one message: the topic's max.message.bytes
        (the broker's default when it cannot be read, with a warning) or the producer's
        message.max.bytes, whichever is less, minus ``HEADROOM``."""
        with self._lock:
            if self._max_message_bytes is None:
                self._max_message_bytes = self._topic_limit()
            producer = int(
                self._producer_config.get("message.max.bytes", PRODUCER_MAX_MESSAGE_BYTES)
            )
            return min(self._max_message_bytes, producer) - HEADROOM

    def _topic_limit(self) -> int:
        try:
            admin = admin_client(self.brokers, self._producer_config)
            return max_message_bytes(admin, [self.topic], self._read_timeout)[self.topic]
        except TopicError as exc:
            log.warning("changelog %s: max.message.bytes taken as the default: %s", self.topic, exc)
            return BROKER_DEFAULT_MAX_MESSAGE_BYTES

    def read(self, shard: str, after: int = -1) -> list[Record]:
        """The records of ``shard``'s partition at offsets above ``after``, up to its end
        (what ``prefetch`` read, if it read that); read again while the broker is slow or
        away, never given up as empty; ``ChangelogError`` for a record that cannot be read.
        """
        partition = shard_index(shard)
        ahead = self._ahead.pop((partition, after), None)
        if ahead is not None:
            return ahead
        return self._retried({partition: after})[partition]

    def prefetch(self, afters: Mapping[str, int]) -> dict[str, list[Record]]:
        """Read the partitions of the shards ``afters`` names (each above its offset) in
        one pass, by one consumer: a start restores every shard it owns at once, and each
        shard's ``read`` of that offset then answers from it. The records, by shard."""
        wanted = {shard_index(shard): after for shard, after in afters.items()}
        if not wanted:
            return {}
        found = self._retried(wanted)
        self._ahead.update(((p, wanted[p]), records) for p, records in found.items())
        return {shard: found[shard_index(shard)] for shard in afters}

    def _retried(self, wanted: dict[int, int]) -> dict[int, list[Record]]:
        """``_read_all``, asked again with back-off while the broker is slow or away."""
        delay, next_log, started = 0.1, time.monotonic(), time.monotonic()
        while True:
            try:
                return self._read_all(wanted)
            except (ChangelogTimeoutError, KafkaException) as exc:
                if isinstance(exc, KafkaException) and not transient(exc):
                    raise ChangelogError(f"{self.topic}: {exc}") from None
                if time.monotonic() >= next_log:
                    next_log = time.monotonic() + _WAIT_LOG_S
                    log.warning(
                        "changelog %s not read after %.0f s (%s): asking again",
                        self.topic,
                        time.monotonic() - started,
                        exc,
                    )
                time.sleep(delay)
                delay = min(delay * 2, _MAX_BACKOFF_S)

    def _read_all(self, wanted: dict[int, int]) -> dict[int, list[Record]]:
        """Each partition of ``wanted`` read above its offset to its end (the end of
        partition events of one consumer); ``ChangelogTimeoutError`` when no record
        arrives for ``read_timeout`` seconds."""
        consumer = Consumer(
            {
                "bootstrap.servers": ",".join(self.brokers),
                **self._consumer_config,
                "group.id": f"tsi-changelog-reader-{uuid.uuid4().hex}",  # assigned only
                "enable.auto.commit": False,
                "enable.partition.eof": True,  # each partition says when it is read
                "auto.offset.reset": "earliest",  # a compacted start: the oldest there
                "fetch.wait.max.ms": 10,
            }
        )
        try:
            out: dict[int, list[Record]] = {p: [] for p in wanted}
            unread = self._unread(consumer, wanted)
            if unread:
                consumer.assign(
                    [TopicPartition(self.topic, p, max(a + 1, 0)) for p, a in unread.items()]
                )
                self._take(consumer, unread, out)
            return out
        finally:
            consumer.close()

    def _unread(self, consumer: Consumer, wanted: dict[int, int]) -> dict[int, int]:
        """The partitions of ``wanted`` holding a record above their offset, their ends
        asked in one batch (``offsets_at``): a fresh start's empty changelog is read
        without a fetch."""
        parts = list(wanted)
        named = [(self.topic, p) for p in parts]
        ends = offsets_at(consumer, named, LATEST, self._read_timeout)
        return {p: wanted[p] for p, end in zip(parts, ends, strict=True) if end > wanted[p] + 1}

    def _take(
        self, consumer: Consumer, wanted: dict[int, int], out: dict[int, list[Record]]
    ) -> None:
        """Consume into ``out`` until every partition of ``wanted`` reached its end."""
        left, quiet_since = set(wanted), time.monotonic()
        while left:
            messages = consumer.consume(1000, 0.05)
            if messages:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since > self._read_timeout:
                raise ChangelogTimeoutError(
                    f"{self.topic}: {len(left)} partitions not read to their end, nothing "
                    f"came for {self._read_timeout:g} s"
                )
            for message in messages:
                error, partition = message.error(), message.partition()
                if error is not None:
                    if error.code() == ConfluentKafkaError._PARTITION_EOF:
                        left.discard(partition)
                    elif not transient(error):
                        raise ChangelogError(f"{self.topic}[{partition}]: {error}")
                    continue
                if message.offset() > wanted[partition]:
                    key = message.key()
                    record = (message.offset(), key.decode() if key is not None else "")
                    out[partition].append((*record, message.value()))


class ChangelogTimeoutError(ChangelogError):
    """A changelog read that made no progress in time: the broker is slow or away."""


class KafkaMirror:
    """One shard's records, sent to its partition; ``acknowledged`` waits for them.

    A record is sent without a delivery callback once the mirror knows where its last
    marker landed: confluent-kafka's ``produce`` without ``on_delivery`` (and no producer
    default) leaves the message without a Python callable, and its delivery report calls
    no Python (``dr_msg_cb`` in its ``Producer.c`` returns at once for a message with no
    ``dr_cb``). Markers keep their callback: one per shard per close. What is relied on
    to learn a refused record without its report: the producer is idempotent and this
    mirror is its partition's only writer, so the records a marker follows lie at the
    offsets just below it, one each, in the order sent (a non-transactional producer's
    records take consecutive offsets, and compaction never renumbers them). A marker's
    offset above the previous marker's by anything else than the records sent between
    them plus one means some never landed: the close raises. A record refused while its
    producer is still up fails the batches behind it or leaves that gap; a fatal
    producer error fails the marker itself. Until the first marker's offset is known
    (a mirror's first epoch) every record is reported, as before.
    """

    def __init__(self, changelog: KafkaChangelog, partition: int) -> None:
        self.changelog = changelog
        self.partition = partition
        self._lock = threading.Lock()
        self._pending = 0  # messages sent with a callback and not reported yet
        self._errors: list[str] = []
        self._marked: int | None = None  # the newest marker's offset, since collected
        self._last: int | None = None  # the last marker's offset: the next ones follow it
        self._since = 0  # records sent since the last marker sent
        self._between: deque[int] = deque()  # per marker in flight: the records before it

    def _report(self, err: ConfluentKafkaError | None, message: Any) -> None:
        with self._lock:
            self._pending -= 1
            marker = message.key() == _MARKER_BYTES
            if err is not None:
                self._errors.append(str(err))
                if marker:  # where the next records land is unknown: they are reported
                    self._between.popleft()
                    self._last = None
            elif marker:
                self._landed(message.offset())

    def _landed(self, offset: int) -> None:
        """A marker acknowledged at ``offset``: the records sent before it all landed
        just below it (see the class's docstring), or the close fails."""
        records = self._between.popleft()
        if self._last is not None and offset != self._last + records + 1:
            self._errors.append(
                f"the marker at offset {offset} follows {offset - self._last - 1} records "
                f"since the one at {self._last}, not the {records} sent: some were refused"
            )
        self._last = offset
        self._marked = offset if self._marked is None else max(self._marked, offset)

    def append(self, key: str, value: bytes | None) -> None:
        self._since += 1
        self._produce(key, value, self._report if self._last is None else None)

    def extend(self, records: list[tuple[str, bytes]]) -> None:
        """Many records in one loop of produce calls and one poll; each reported, as
        ``append`` does, until the first marker's offset accounts for them."""
        if self._last is None:
            for key, value in records:
                self.append(key, value)
            return
        producer = self.changelog.producer()
        produce, topic, partition = producer.produce, self.changelog.topic, self.partition
        for key, value in records:
            while True:
                try:
                    produce(topic, value, key, partition)
                    break
                except BufferError:  # the local queue is full: let it drain
                    producer.poll(0.1)
        self._since += len(records)
        producer.poll(0)

    def mark(self, marker: Marker) -> None:
        with self._lock:
            self._between.append(self._since)
        self._since = 0
        self._produce(MARKER_KEY, encode([marker]), self._report)

    def _produce(self, key: str, value: bytes | None, report: Any) -> None:
        producer = self.changelog.producer()
        if report is not None:
            with self._lock:
                self._pending += 1
        while True:
            try:
                producer.produce(
                    self.changelog.topic, value, key, self.partition, on_delivery=report
                )
                break
            except BufferError:  # the local queue is full: let it drain
                producer.poll(0.1)
        producer.poll(0)

    def acknowledged(self) -> int | None:
        """Wait until everything sent is acknowledged (``KafkaChangelog.settle``); the
        last marker's offset (None: none sent since the last call). ``RuntimeError``
        naming the first error if any record was refused: the epoch is not committed and
        the flow replays it."""
        return self.changelog.settle_mirrors([self])[0]

    def collected(self) -> int | None:
        """Once nothing is pending: the last marker's offset since the last call, or
        ``RuntimeError`` naming the first refusal."""
        with self._lock:
            errors, self._errors = self._errors, []
            marked, self._marked = self._marked, None
        if errors:
            raise RuntimeError(
                f"Kafka did not acknowledge {len(errors)} changelog records of "
                f"{self.changelog.topic}[{self.partition}]; first error: {errors[0]}"
            )
        return marked


_MARKER_BYTES = MARKER_KEY.encode()
