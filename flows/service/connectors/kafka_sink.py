"""A Kafka sink that is sure of every write: ``DeliveryCheckedKafkaSink``.

It produces each batch as it comes and, when the epoch closes (Bytewax asks every sink
partition written in the epoch for its snapshot before it commits the epoch), waits for
the broker to acknowledge every message of the epoch and raises if any was not, so the
dataflow fails and Bytewax recovery replays the epoch: an ``EpochAcknowledgedSink``
(``epoch_sink``) whose partition sends by producing and acknowledges by waiting for the
delivery reports. The stock
``bytewax.connectors.kafka.KafkaSink`` never looks at delivery reports: messages the broker
refuses (unknown topic, broker down, ...) are dropped and the dataflow carries on as if
they had been written. Client settings (security.protocol, sasl.*, ssl.*, ...) pass
through ``add_config`` untouched.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from bytewax.connectors.kafka import KafkaSinkMessage
from confluent_kafka import KafkaError as ConfluentKafkaError
from confluent_kafka import KafkaException, Producer

from flows.service.connectors.epoch_sink import EpochAcknowledgedPartition, EpochAcknowledgedSink
from flows.service.observe.metrics import note_broker_contact
from flows.service.wire._records import key_value, producible

Key = str | bytes | None
Headers = list[tuple[str, bytes | None]]
KafkaItem = (
    tuple[Key, bytes | str | None]
    | tuple[Key, bytes | str | None, Headers]
    | tuple[Key, bytes | str | None, Headers, int]
    | KafkaSinkMessage[Any, Any]
    | dict[str, Any]
)
"""What `DeliveryCheckedKafkaSink` accepts: a `(key, value)`, `(key, value, headers)` or
`(key, value, headers, partition)` tuple produced to the sink's topic (the internal copies
are triples, or with their partition quadruples, built in C), a
`KafkaSinkMessage` (its `topic`, `partition` and `headers` are honoured when set; its
`timestamp` 0 means "now"), or a dict of `Producer.produce` keyword arguments with its
`topic` (of `topic`, `key`, `value`, `headers`, `partition`, `timestamp`)."""
Produced = tuple
"""What the sink produces for an item, one shape: ``(key, value)``, ``(key, value,
headers)`` or ``(key, value, headers, partition)`` for its own topic (as the shards and the
internal topic write them), else
``(key, value, headers, topic, partition, timestamp)``: ``Producer.produce``'s arguments
for an item that names its own."""

#: ``produce``'s partition for an item that names none: the partitioner chooses.
_ANY_PARTITION = -1
#: What a dict item may give (``produce``'s keyword arguments).
_PRODUCE_KEYS = frozenset({"topic", "key", "value", "headers", "partition", "timestamp"})

#: How long an epoch's close waits for acknowledgements before it reports the broker
#: unreachable (readiness), and the first of the doubling intervals at which it logs that
#: it is still waiting.
_PATIENCE_S = 2.0
_FIRST_LOG_S = 10.0
#: How long closing the sink may wait for what is still queued.
_CLOSE_S = 30.0

#: Errors that refuse one message for what it is (its size or form), not for the state of
#: the cluster: retrying the same bytes can never succeed.
REFUSED_FOR_GOOD = frozenset(
    {
        ConfluentKafkaError.MSG_SIZE_TOO_LARGE,
        ConfluentKafkaError.RECORD_LIST_TOO_LARGE,
        ConfluentKafkaError.INVALID_RECORD,
        ConfluentKafkaError.INVALID_MSG,
        ConfluentKafkaError.INVALID_MSG_SIZE,
    }
)

#: Builds a smaller stand-in for a message refused for good: (value, error) -> value.
Replacement = Callable[[bytes, str], bytes]

log = logging.getLogger(__name__)


def names_of(what: str, names: Iterable[str]) -> list[str]:
    if isinstance(names, str):  # ",".join("host:9092") would give "h,o,s,t,..."
        msg = f"{what} must be a list of strings, not the string {names!r}"
        raise TypeError(msg)
    out = list(names)
    if not out:
        msg = f"{what} must not be empty"
        raise ValueError(msg)
    return out


@dataclass
class _Deliveries:
    """The failed deliveries of one epoch: the producer reports only failures
    (``delivery.report.only.error``, which confluent-kafka applies in C: a delivered
    message costs no Python call), and a flush that returns 0 has served the report of
    every message that failed."""

    errors: list[tuple[str, str]] = field(default_factory=list)  # (topic, error)
    refused: list[tuple[Key, bytes, str]] = field(default_factory=list)  # (key, value, error)

    def __call__(self, err: ConfluentKafkaError | None, msg: Any) -> None:
        if err is None:
            return
        if err.code() in REFUSED_FOR_GOOD:
            self.refused.append((msg.key(), msg.value() or b"", str(err)))
        else:
            self.errors.append((msg.topic() or "?", str(err)))

    @property
    def failed(self) -> int:
        return len(self.errors) + len(self.refused)


class _CheckedPartition(EpochAcknowledgedPartition[KafkaItem, None]):
    """One process's writes: produced as they come, acknowledged by the epoch's close."""

    def __init__(
        self,
        producer: Producer,
        topic: str | None,
        client_errors: list[str],
        replace: Replacement | None = None,
        batched: bool = False,
    ) -> None:
        super().__init__(batched)
        self._producer = producer
        self._topic = topic
        self._client_errors = client_errors  # filled by the producer's error_cb
        self._replace = replace
        self._reports = _Deliveries()  # of the messages produced since the last snapshot

    def _produce_args(self, item: KafkaItem) -> Produced:
        """What ``_send`` produces for ``item`` (``Produced``): a (key, value) or (key,
        value, headers) tuple for the sink's own topic as a plain tuple (itself, when it is
        one: ``tuple`` returns a plain tuple as it is); TypeError or ValueError for an item
        it cannot write."""
        if isinstance(item, tuple) and key_value(item):
            args: Produced = tuple(item)
            topic = self._topic
        elif isinstance(item, dict):  # produce()'s arguments themselves
            unknown = item.keys() - _PRODUCE_KEYS
            if unknown:
                msg = f"a dict item gives {sorted(_PRODUCE_KEYS)}, not {sorted(unknown)}: {item!r}"
                raise TypeError(msg)
            topic = item["topic"]
            partition = item.get("partition", _ANY_PARTITION)
            args = (
                item.get("key"),
                item.get("value"),
                item.get("headers"),
                topic,
                partition,
                item.get("timestamp", 0),
            )
        elif isinstance(item, KafkaSinkMessage):
            topic = item.topic or self._topic
            partition = _ANY_PARTITION if item.partition is None else item.partition
            headers = item.headers or None
            args = (item.key, item.value, headers, topic, partition, item.timestamp)
        else:
            msg = (
                "expected a (key, value) or (key, value, headers) tuple or a "
                f"KafkaSinkMessage, got {item!r}"
            )
            raise TypeError(msg)
        if topic is None:
            msg = f"no topic for {item!r}: give the sink a topic or set KafkaSinkMessage.topic"
            raise ValueError(msg)
        return args

    def _fields(self, args: Produced) -> tuple[str, Key, Any]:
        """(topic, key, value) of what ``_produce_args`` returned."""
        return (self._topic if len(args) < 6 else args[3]), args[0], args[1]

    def send(self, items: list[KafkaItem]) -> None:
        """Produce all items (every one checked first: a bad item fails the batch before
        anything is produced); ``acknowledge`` makes sure of them."""
        if self._topic is not None and producible(items):  # the common batch, checked in C
            batch = items
        else:  # bad items fail before producing
            batch = [self._produce_args(item) for item in items]
        self._produce(batch, self._reports)
        self._producer.poll(0)  # serve the reports that came (failures only)

    def acknowledge(self, sent: int) -> None:
        """At the close of an epoch this partition wrote in (``snapshot``): wait until the
        ``sent`` messages produced since the last close have their reports (through
        broker outages of any length unless ``timeout_s``), and raise ``RuntimeError``
        (naming the topic, the number of messages not acknowledged and the first error)
        if any failed.

        With ``replace``, a message refused for good (too large, invalid) is written as the
        stand-in ``replace`` builds for it instead; a stand-in refused too is logged with
        its bytes at ERROR level, the last resort (the flow must not loop on it).
        """
        if not sent:
            return
        self._wait_for_reports(sent)
        reports, self._reports = self._reports, _Deliveries()
        if reports.refused and self._replace is not None:
            self._write_refused(reports)
        failed = reports.failed
        if failed:
            errors = reports.errors + [(self._topic or "?", why) for *_, why in reports.refused]
            first = f"first error on {errors[0][0]!r}: {errors[0][1]}"
            topics = sorted({topic for topic, _ in errors})
            msg = (
                f"Kafka did not acknowledge {failed} of {sent} messages to topic "
                f"{', '.join(topics)}; {first}"
            )
            if self._client_errors:
                msg += f"; last client error: {self._client_errors[-1]}"
            raise RuntimeError(msg)
        self._client_errors.clear()  # report only errors seen since the last good snapshot
        note_broker_contact(True)

    def _write_refused(self, reports: _Deliveries) -> None:
        """Retry each refused message alone (the broker refuses a whole record batch when
        one of its messages is too large), and write a stand-in for those refused alone."""
        refused, reports.refused = reports.refused, []
        for key, value, why in refused:
            alone = self._send([(key, value)])
            if alone.refused:
                log.warning("%s: a message was refused (%s); writing a stand-in", self._topic, why)
                alone = self._send([(key, self._replace(value, why))])
                for _, lost, again in alone.refused:
                    log.error(
                        "%s: stand-in refused too (%s), not written: %r", self._topic, again, lost
                    )  # the last resort is this log line: never loop on it
            reports.errors += alone.errors

    def _send(self, batch: list[Produced]) -> _Deliveries:
        """Produce ``batch`` and wait for its reports (a stand-in, a message retried
        alone): what became of each message."""
        reports = _Deliveries()
        self._produce(batch, reports)
        self._wait_for_reports(len(batch))
        return reports

    def _produce(self, batch: list[Produced], reports: _Deliveries) -> None:
        """Produce ``batch`` (``Produced``), its failures reported to ``reports``, with
        positional arguments: cheaper than through a dict of keyword arguments
        (bench/RESULTS.md, "the sink's dicts gone"). When the producer's queue is
        full, this waits for what it holds (broker outages included: logged, readiness)."""
        produce, topic = self._producer.produce, self._topic
        for args in batch:
            while True:
                try:
                    if len(args) == 2:
                        produce(topic, args[1], args[0], on_delivery=reports)
                    elif len(args) == 3:
                        produce(topic, args[1], args[0], on_delivery=reports, headers=args[2])
                    elif len(args) == 4:  # its own topic, a partition of its choosing
                        key, value, headers, partition = args
                        produce(topic, value, key, partition, on_delivery=reports, headers=headers)
                    else:  # an item naming its own topic, partition and time
                        key, value, headers, at, partition, timestamp = args
                        produce(
                            at,
                            value,
                            key,
                            partition,
                            on_delivery=reports,
                            timestamp=timestamp,
                            headers=headers,
                        )
                    break
                except BufferError:  # local queue full: wait until it is delivered
                    self._wait_for_reports(len(self._producer))
                except KafkaException as exc:  # e.g. larger than message.max.bytes
                    err = exc.args[0] if exc.args else None
                    why = err.str() if isinstance(err, ConfluentKafkaError) else str(exc)
                    at, key, value = self._fields(args)
                    if isinstance(err, ConfluentKafkaError) and err.code() in REFUSED_FOR_GOOD:
                        reports.refused.append((key, value or b"", why))
                    else:
                        reports.errors.append((at, why))
                    break

    def _wait_for_reports(self, n: int) -> None:
        """Flush in 1 s slices (signals are served) until every message has its report.

        librdkafka retries retriable errors itself, in order (idempotent producer), for
        ``message.timeout.ms`` (infinite by default here): while the brokers are away this
        waits, reports not-ready and logs at doubling intervals, and never re-produces.
        """
        started, next_log, noted = time.monotonic(), _FIRST_LOG_S, False
        while (left := self._producer.flush(1.0)) > 0:
            waited = time.monotonic() - started
            if not noted and waited > _PATIENCE_S:
                noted = True
                last = self._client_errors[-1] if self._client_errors else "no answer"
                note_broker_contact(False, f"{left} messages to {self._topic} waiting: {last}")
            if waited >= next_log:
                log.warning(
                    "%d of %d messages to %s not acknowledged after %.0f s; waiting for the "
                    "brokers",
                    left,
                    n,
                    self._topic,
                    waited,
                )
                next_log *= 2

    def close(self) -> None:
        """At the end of the input: wait (at most ``_CLOSE_S``) for what is still queued,
        then acknowledge the last epoch's messages."""
        left = self._producer.flush(_CLOSE_S)
        if left:
            msg = f"Kafka sink for topic {self._topic}: {left} messages still queued at close"
            raise RuntimeError(msg)
        super().close()


def partition_name(process: int) -> str:
    """The sink partition of cluster process ``process`` (``DeliveryCheckedKafkaSink``).

    >>> partition_name(3)
    'p0003'
    """
    return f"p{process:04d}"


class DeliveryCheckedKafkaSink(EpochAcknowledgedSink[None]):
    """Produce to Kafka and fail loudly unless every message is acknowledged.

    Items are `(key, value)` tuples (key `str | bytes | None`, value `bytes`; a `str` is
    UTF-8 encoded), or `(key, value, headers)` with a list of headers, produced to `topic`
    with the default partitioner (same key, same partition). `KafkaSinkMessage` items are
    accepted too, for per-message topic, partition or headers. With ``batched``, every
    item is a list of such items (a dataflow that carries batches). Add the sink to a flow
    with ``output`` (it keys the items by this process's partition).

    Each process of a cluster writes through one partition of the sink (its own,
    ``partition_name(process)``: no item crosses processes), with one idempotent
    producer. `write_batch` produces and returns; when the epoch closes, Bytewax asks
    the partition for its snapshot before it commits the epoch, and the snapshot waits
    for every message of the epoch to be acknowledged and raises `RuntimeError` (naming
    the topic, the number of messages not acknowledged and the first error) if any
    delivery failed or did not complete in time. The dataflow then stops and Bytewax
    recovery replays the epoch: at-least-once, with the failed epoch's acknowledged
    messages written again; no epoch is committed with an output not acknowledged. (The
    worker does not wait for the broker after each batch: a flush of every write would
    leave it idle for a broker round trip each time, bench/RESULTS.md, "the sink no
    longer waits for the broker after every batch".) A message refused
    for what it is (``REFUSED_FOR_GOOD``: too large, invalid) would fail every replay the
    same way: with ``replace`` it is written as the stand-in ``replace(value, error)``
    returns instead (the dead-letter sink writes
    ``flows.service.wire.events.minimal_dead_letter``).

    Producer defaults (all overridable through `add_config`): `enable.idempotence=true`
    (no duplicates or reordering from internal retries), `acks=all`, `linger.ms=1`
    (what queues while the broker answers is sent as one request anyway, and a longer
    linger only delays each hop's answers: bench/RESULTS.md, "the sink no longer waits
    for the broker after every batch") and
    `message.timeout.ms`: 0 (infinite) by default, so a broker outage of any length is
    waited out (readiness reports it; nothing is lost or reordered), or `timeout_s` when
    given, after which the epoch's close fails.
    `delivery.report.only.error` is always on: the partition counts the failures, and a
    flush that returns 0 has reported every one (a delivered message then costs no
    Python call).
    """

    def __init__(
        self,
        brokers: list[str],
        topic: str | None = None,
        add_config: dict[str, Any] | None = None,
        timeout_s: float | None = None,
        replace: Replacement | None = None,
        batched: bool = False,
        process: int = 0,
    ) -> None:
        if timeout_s is not None and not timeout_s > 0:
            msg = f"timeout_s must be positive, got {timeout_s!r}"
            raise ValueError(msg)
        self._brokers = names_of("brokers", brokers)
        self._topic = topic
        self._add_config = dict(add_config or {})
        if self._add_config.get("delivery.report.only.error", True) not in (True, "true"):
            msg = (
                "delivery.report.only.error is always true in this sink (it counts the "
                f"failures of each batch), got {self._add_config['delivery.report.only.error']!r}"
            )
            raise ValueError(msg)
        self._timeout_s = timeout_s
        self._replace = replace
        self._batched = batched
        super().__init__(partition_name(process))

    def part_fn(self, item_key: str) -> int:
        """The index of ``item_key``'s partition among every process's (the names sort by
        process)."""
        return int(item_key[1:])

    def producer_config(
        self, step_id: str = "sink", part: str = partition_name(0)
    ) -> dict[str, Any]:
        """The librdkafka configuration a partition's producer is built with."""
        config: dict[str, Any] = {
            "bootstrap.servers": ",".join(self._brokers),
            "client.id": f"tsi-{step_id}-{part}",
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 1,
            "message.timeout.ms": 0
            if self._timeout_s is None
            else max(1, round(self._timeout_s * 1000)),
        }
        config.update(self._add_config)
        config["delivery.report.only.error"] = True  # what _Deliveries counts on
        return config

    def build_part(self, step_id: str, for_part: str, resume_state: None) -> _CheckedPartition:
        """The partition's producer (nothing to resume: what an epoch wrote is
        acknowledged before it is committed)."""
        config = self.producer_config(step_id, for_part)
        client_errors: list[str] = []  # connection-level errors, to explain timeouts
        user_cb: Callable[[ConfluentKafkaError], None] | None = config.get("error_cb")

        def on_error(err: ConfluentKafkaError) -> None:
            client_errors[:] = [str(err)]
            note_broker_contact(False, str(err))
            if user_cb is not None:
                user_cb(err)

        config["error_cb"] = on_error
        return _CheckedPartition(
            Producer(config), self._topic, client_errors, self._replace, self._batched
        )
