"""One client's connection to the service: a producer for requests and feedback, and a
consumer of its own that reads every answer and every dead letter and hands each to the
call waiting for it (matched by experiment and ``request_id``).

Each connection reads the whole selections and dead-letter topics from their ends, with
no consumer group (all partitions assigned at the offsets they had when it connected,
nothing committed): several processes, gateways or clients each get their own answers and
drop the others'. The cost is that every connection reads every answer: N gateway replicas
read N times the selections traffic, which Kafka serves from its page cache but which each
replica parses (one small JSON object an answer). At a scale where that matters, the
alternatives are an answer topic per replica (the service would need to write there: a
``reply_to`` field) or partitioning the applications by instance key so that each replica
reads only the selections partitions of its own instances.

Partitions added to the answer topics later are found by a metadata check every
``PARTITION_REFRESH`` seconds and read from their beginning (all of a new partition is newer
than the connection).

Two threads serve the connection: one polls the consumer and completes the waiting calls'
futures, one polls the producer for its delivery reports and checks for new partitions. A
``concurrent.futures.Future`` serves both the blocking and the asyncio API.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition

from flows.client.errors import DeadLetterError, KafkaUnavailableError
from flows.client.messages import Match, answer_of, refused_request
from flows.client.settings import ClientSettings
from flows.service.connectors.kafka_config import with_rate_limited_logs

log = logging.getLogger(__name__)

#: The consumer's settings before the user's ``[kafka.consumer]`` (which win). Tuned for
#: the latency of one answer, not for throughput:
CONSUMER_TUNING: dict[str, Any] = {
    # the longest a fetch may wait at the broker for data: librdkafka's default is half a
    # second, the size of the recurring maximum a stock consumer showed; kept
    # short, no answer can wait behind a fetch the broker holds. The cost: an idle client
    # sends a fetch per broker this often.
    "fetch.wait.max.ms": 5,
    "fetch.min.bytes": 1,
    # refetch at once after a fetch returned (librdkafka waits up to 1 s when its queue is
    # full, and backs off after an error)
    "fetch.queue.backoff.ms": 0,
    "fetch.error.backoff.ms": 50,
    # small answers are sent at once, not held for Nagle's algorithm
    "socket.nagle.disable": True,
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "enable.partition.eof": False,
}

#: The producer's settings before the user's ``[kafka.producer]`` (which win).
PRODUCER_TUNING: dict[str, Any] = {
    # a request goes out at once, not held back to batch it with the next (librdkafka's
    # default holds it a few milliseconds)
    "linger.ms": 0,
    # a message is accepted once every in-sync replica has it, and retries cannot
    # duplicate or reorder it: nothing the broker acknowledged is lost
    "acks": "all",
    "enable.idempotence": True,
    "socket.nagle.disable": True,
}


#: Seconds between two checks for partitions added to the answer topics.
PARTITION_REFRESH = 3.0


@dataclass(eq=False)
class Waiter:
    """A call waiting for its answer: the future, and whether the broker took its request."""

    match: Match
    future: Future = field(default_factory=Future)
    delivered: bool = False


def settle(future: Future, result: Any = None, error: BaseException | None = None) -> None:
    """Complete ``future`` unless it is already complete (answers may come twice)."""
    try:
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
    except InvalidStateError:
        pass


class Connection:
    """The producer, the answer reader and the calls waiting (``KafkaUnavailableError`` when the
    brokers do not answer within ``settings.connect_timeout``)."""

    def __init__(self, settings: ClientSettings) -> None:
        self.settings = settings
        self._waiting: dict[Match, list[Waiter]] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        brokers = {"bootstrap.servers": settings.brokers}
        self._producer = Producer(
            with_rate_limited_logs({**PRODUCER_TUNING, **settings.producer, **brokers})
        )
        group = {"group.id": f"tsi-client-{uuid.uuid4()}"}  # never joined nor committed to
        self._consumer = Consumer(
            with_rate_limited_logs({**CONSUMER_TUNING, **settings.consumer, **brokers, **group})
        )
        try:
            ends = self._ends()
            self._consumer.assign(ends)
        except BaseException:
            self._consumer.close()
            raise
        self._assigned = {(each.topic, each.partition) for each in ends}
        self._new_partitions: list[TopicPartition] = []  # found, not yet assigned
        self._threads = [
            threading.Thread(target=self._read, name="tsi-client-answers", daemon=True),
            threading.Thread(target=self._deliver, name="tsi-client-deliveries", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _ends(self) -> list[TopicPartition]:
        """Every partition of the answer topics at its current end: an answer written after
        this is read, whatever partition it lands on."""
        topics = (self.settings.topics.selections, self.settings.topics.dead_letters)
        timeout = self.settings.connect_timeout
        try:
            metadata = self._consumer.list_topics(timeout=timeout)
            ends = []
            for topic in topics:
                known = metadata.topics.get(topic)
                if known is None or known.error is not None or not known.partitions:
                    raise KafkaUnavailableError(
                        f"topic {topic!r} does not exist on {self.settings.brokers} "
                        "(tsi topics create makes it)"
                    )
                for partition in sorted(known.partitions):
                    here = TopicPartition(topic, partition)
                    _, end = self._consumer.get_watermark_offsets(here, timeout, cached=False)
                    ends.append(TopicPartition(topic, partition, end))
        except KafkaException as exc:
            raise KafkaUnavailableError(
                f"Kafka at {self.settings.brokers} did not answer within {timeout:g} s "
                f"({exc.args[0].str() if exc.args else exc})"
            ) from None
        return ends

    # ------------------------------------------------------------------------- sending
    def ask(self, topic: str, key: bytes, value: bytes, match: Match) -> Waiter:
        """Produce a request and return its waiter (registered first: the answer cannot
        come before it)."""
        waiter = Waiter(match)
        with self._lock:
            self._waiting.setdefault(match, []).append(waiter)

        def delivered(error: Any, _message: Any) -> None:
            if error is None:
                waiter.delivered = True
            else:
                self.forget(waiter)
                settle(waiter.future, error=_unavailable(topic, error))

        try:
            self._send(topic, key, value, delivered)
        except KafkaUnavailableError:
            self.forget(waiter)
            raise
        return waiter

    def tell(self, topic: str, key: bytes, value: bytes) -> Future:
        """Produce a message; the future completes when the broker has it (or fails with
        ``KafkaUnavailableError``)."""
        future: Future = Future()

        def delivered(error: Any, _message: Any) -> None:
            settle(future, None, None if error is None else _unavailable(topic, error))

        self._send(topic, key, value, delivered)
        return future

    def _send(self, topic: str, key: bytes, value: bytes, on_delivery: Any) -> None:
        if self._closed.is_set():
            raise KafkaUnavailableError("the client is closed")
        try:
            self._producer.produce(topic, value, key, on_delivery=on_delivery)
        except BufferError:
            raise KafkaUnavailableError(
                "the producer's queue is full: the brokers do not take messages as fast as "
                "they come"
            ) from None
        except KafkaException as exc:
            raise _unavailable(topic, exc.args[0] if exc.args else exc) from None

    def forget(self, waiter: Waiter) -> None:
        """Stop waiting for ``waiter``'s answer (it timed out)."""
        with self._lock:
            waiters = self._waiting.get(waiter.match, [])
            if waiter in waiters:
                waiters.remove(waiter)
            if not waiters:
                self._waiting.pop(waiter.match, None)

    # ----------------------------------------------------------------------- receiving
    def _read(self) -> None:
        selections = self.settings.topics.selections
        while not self._closed.is_set():
            if self._new_partitions:
                with self._lock:
                    new, self._new_partitions = self._new_partitions, []
                self._consumer.incremental_assign(new)
                log.info("reading new answer partitions: %s", [(t.topic, t.partition) for t in new])
            first = self._consumer.poll(0.05)  # returns as soon as a message is there
            if first is None:
                continue
            for message in [first, *self._consumer.consume(1000, 0)]:
                if message.error() is None:
                    self._hand(message.topic() == selections, message.value())
                else:
                    log.warning("reading answers: %s", message.error())

    def _hand(self, is_answer: bool, value: bytes) -> None:
        """Complete the calls waiting for this answer or dead letter (others' are dropped)."""
        if is_answer:
            found = answer_of(value)
            if found is None:
                return
            match, outcome, error = found[0], found[1], None
        else:
            refused = refused_request(value)
            if refused is None:
                return
            match, reason, detail = refused
            outcome, error = None, DeadLetterError(match[1], reason, detail)
        with self._lock:
            waiters = self._waiting.pop(match, [])
        for waiter in waiters:
            settle(waiter.future, outcome, error)

    def _deliver(self) -> None:
        checked = time.monotonic()
        while not self._closed.is_set():
            self._producer.poll(0.05)  # serves delivery reports as they come
            if time.monotonic() - checked >= PARTITION_REFRESH:
                checked = time.monotonic()
                self._find_new_partitions()

    def _find_new_partitions(self) -> None:
        """Hand the partitions added to the answer topics since the last check to the
        reading thread (the consumer is called from that thread only); the brokers
        unreachable: checked again next time."""
        topics = (self.settings.topics.selections, self.settings.topics.dead_letters)
        try:
            metadata = self._producer.list_topics(timeout=1.0)
        except KafkaException as exc:
            log.debug("checking for new partitions: %s", exc)
            return
        new = [
            TopicPartition(topic, partition, OFFSET_BEGINNING)
            for topic in topics
            if (known := metadata.topics.get(topic)) is not None and known.error is None
            for partition in sorted(known.partitions)
            if (topic, partition) not in self._assigned
        ]
        if new:
            self._assigned.update((each.topic, each.partition) for each in new)
            with self._lock:
                self._new_partitions.extend(new)

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued (up to ``timeout`` seconds), then stop."""
        self._producer.flush(timeout)
        self._closed.set()
        for thread in self._threads:
            thread.join()
        self._consumer.close()


def _unavailable(topic: str, error: Any) -> KafkaUnavailableError:
    text = error.str() if hasattr(error, "str") else str(error)
    return KafkaUnavailableError(f"Kafka did not take the message for {topic!r}: {text}")
