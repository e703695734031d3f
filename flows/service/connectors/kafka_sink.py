"""A Kafka sink that is sure of every write: ``DeliveryCheckedKafkaSink``.

It waits for the broker to acknowledge every message of a batch and raises if any was
not, so the dataflow fails and Bytewax recovery replays the epoch. The stock
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
from bytewax.outputs import DynamicSink, StatelessSinkPartition
from confluent_kafka import KafkaError as ConfluentKafkaError
from confluent_kafka import KafkaException, Producer

from flows.service._records import key_value, producible
from flows.service.metrics import note_broker_contact

Key = str | bytes | None
Headers = list[tuple[str, bytes | None]]
KafkaItem = (
    tuple[Key, bytes | str | None]
    | tuple[Key, bytes | str | None, Headers]
    | KafkaSinkMessage[Any, Any]
    | dict[str, Any]
)
"""What `DeliveryCheckedKafkaSink` accepts: a `(key, value)` or `(key, value, headers)`
tuple produced to the sink's topic (the internal copies are triples, built in C), a
`KafkaSinkMessage` (its `topic`, `partition` and `headers` are honoured when set; its
`timestamp` 0 means "now"), or a dict of `Producer.produce` keyword arguments with its
`topic`."""
Produced = tuple | dict[str, Any]  # a tuple for the sink's own topic, or produce()'s kwargs

#: How long a write waits before it reports the broker unreachable (readiness), and the
#: first of the doubling intervals at which it logs that it is still waiting.
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
    """The failed deliveries of one batch: the producer reports only failures
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


class _CheckedPartition(StatelessSinkPartition[KafkaItem]):
    def __init__(
        self,
        producer: Producer,
        topic: str | None,
        client_errors: list[str],
        replace: Replacement | None = None,
        batched: bool = False,
    ) -> None:
        self._batched = batched
        self._producer = producer
        self._topic = topic
        self._client_errors = client_errors  # filled by the producer's error_cb
        self._replace = replace

    def _produce_args(self, item: KafkaItem) -> Produced:
        """What ``_send`` produces for ``item``: a (key, value) or (key, value, headers)
        tuple for the sink's own topic as a plain tuple, else ``produce``'s keyword
        arguments; TypeError or ValueError for an item it cannot write."""
        if isinstance(item, tuple) and key_value(item):
            args: Produced = item if type(item) is tuple else tuple(item)
            topic = self._topic
        elif type(item) is dict:  # produce()'s arguments themselves
            args, topic = item, item["topic"]
        elif isinstance(item, KafkaSinkMessage):
            args = {
                "topic": item.topic or self._topic,
                "key": item.key,
                "value": item.value,
                "timestamp": item.timestamp,
            }
            if item.headers:
                args["headers"] = item.headers
            if item.partition is not None:
                args["partition"] = item.partition
            topic = args["topic"]
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
        if type(args) is tuple:  # (key, value) or (key, value, headers)
            return self._topic, args[0], args[1]
        return args["topic"], args.get("key"), args["value"]

    def write_batch(self, items: list[KafkaItem]) -> None:
        """Produce all items, flush, and raise unless the broker acknowledged every one.

        With ``replace``, a message refused for good (too large, invalid) is written as the
        stand-in ``replace`` builds for it instead; a stand-in refused too is logged with
        its bytes at ERROR level, the last resort (the flow must not loop on it).
        """
        if self._batched:
            items = [item for batch in items for item in batch]
        if not items:
            return
        if self._topic is not None and producible(items):  # the common batch, checked in C
            batch = items
        else:  # bad items fail before producing
            batch = [self._produce_args(item) for item in items]
        reports = self._send(batch)
        if reports.refused and self._replace is not None:
            self._write_refused(reports)
        failed = reports.failed
        if failed:
            errors = reports.errors + [(self._topic or "?", why) for *_, why in reports.refused]
            first = f"first error on {errors[0][0]!r}: {errors[0][1]}"
            topics = sorted({self._fields(args)[0] for args in batch})
            msg = (
                f"Kafka did not acknowledge {failed} of {len(batch)} messages to topic "
                f"{', '.join(topics)}; {first}"
            )
            if self._client_errors:
                msg += f"; last client error: {self._client_errors[-1]}"
            raise RuntimeError(msg)
        self._client_errors.clear()  # report only errors seen since the last good batch
        note_broker_contact(True)

    def _write_refused(self, reports: _Deliveries) -> None:
        """Retry each refused message alone (the broker refuses a whole record batch when
        one of its messages is too large), and write a stand-in for those refused alone."""
        refused, reports.refused = reports.refused, []
        for key, value, why in refused:
            alone = self._send([{"topic": self._topic, "key": key, "value": value}])
            if alone.refused:
                log.warning("%s: a message was refused (%s); writing a stand-in", self._topic, why)
                stand_in = {"topic": self._topic, "key": key, "value": self._replace(value, why)}
                alone = self._send([stand_in])
                for _, lost, again in alone.refused:
                    log.error(
                        "%s: stand-in refused too (%s), not written: %r", self._topic, again, lost
                    )  # the last resort is this log line: never loop on it
            reports.errors += alone.errors

    def _send(self, batch: list[Produced]) -> _Deliveries:
        """Produce and flush ``batch``; the reports say what became of each message. A
        tuple is produced with positional arguments: measured, 1.7 us a message against
        3.3 through a dict of keyword arguments (with headers 1.6 against 2.1)."""
        reports, produce, topic = _Deliveries(), self._producer.produce, self._topic
        for args in batch:
            while True:
                try:
                    if type(args) is not tuple:
                        produce(**args, on_delivery=reports)
                    elif len(args) == 2:
                        produce(topic, args[1], args[0], on_delivery=reports)
                    else:
                        produce(topic, args[1], args[0], on_delivery=reports, headers=args[2])
                    break
                except BufferError:  # local queue full: serve reports until there is room
                    self._producer.poll(0.1)
                except KafkaException as exc:  # e.g. larger than message.max.bytes
                    err = exc.args[0] if exc.args else None
                    why = err.str() if isinstance(err, ConfluentKafkaError) else str(exc)
                    at, key, value = self._fields(args)
                    if isinstance(err, ConfluentKafkaError) and err.code() in REFUSED_FOR_GOOD:
                        reports.refused.append((key, value or b"", why))
                    else:
                        reports.errors.append((at, why))
                    break
        self._wait_for_reports(len(batch))
        return reports

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
        """Flush anything left (normally nothing: every batch was flushed)."""
        left = self._producer.flush(_CLOSE_S)
        if left:
            msg = f"Kafka sink for topic {self._topic}: {left} messages still queued at close"
            raise RuntimeError(msg)


class DeliveryCheckedKafkaSink(DynamicSink[KafkaItem]):
    """Produce to Kafka and fail loudly unless every message is acknowledged.

    Items are `(key, value)` tuples (key `str | bytes | None`, value `bytes`; a `str` is
    UTF-8 encoded), or `(key, value, headers)` with a list of headers, produced to `topic`
    with the default partitioner (same key, same partition). `KafkaSinkMessage` items are
    accepted too, for per-message topic, partition or headers. Each worker has one
    idempotent producer; `write_batch` produces the whole batch, flushes, and raises
    `RuntimeError` (naming the topic, the number of messages not acknowledged and the
    first error) if any delivery failed or did not complete in time.
    The dataflow then stops and Bytewax recovery replays the epoch: at-least-once, with the
    failed epoch's acknowledged messages written again. A message refused for what it is
    (``REFUSED_FOR_GOOD``: too large, invalid) would fail every replay the same way: with
    ``replace`` it is written as the stand-in ``replace(value, error)`` returns instead
    (the dead-letter sink writes ``flows.service.events.minimal_dead_letter``).

    Producer defaults (all overridable through `add_config`): `enable.idempotence=true`
    (no duplicates or reordering from internal retries), `acks=all`, `linger.ms=5`
    (batching inside a write; the flush at its end sends immediately, so no latency is
    added) and `message.timeout.ms`: 0 (infinite) by default, so a broker outage of any
    length is waited out (readiness reports it; nothing is lost or reordered), or
    `timeout_s` when given, after which a write fails. `delivery.report.only.error` is
    always on: a batch counts its failures, and a flush that returns 0 has reported every
    one (a delivered message then costs no Python call). With ``batched``, every item is a
    list of such items (a dataflow that carries batches).
    """

    def __init__(
        self,
        brokers: list[str],
        topic: str | None = None,
        add_config: dict[str, Any] | None = None,
        timeout_s: float | None = None,
        replace: Replacement | None = None,
        batched: bool = False,
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

    def producer_config(self, step_id: str = "sink", worker_index: int = 0) -> dict[str, Any]:
        """The librdkafka configuration a worker's producer is built with."""
        config: dict[str, Any] = {
            "bootstrap.servers": ",".join(self._brokers),
            "client.id": f"tsi-{step_id}-{worker_index}",
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "message.timeout.ms": 0
            if self._timeout_s is None
            else max(1, round(self._timeout_s * 1000)),
        }
        config.update(self._add_config)
        config["delivery.report.only.error"] = True  # what _Deliveries counts on
        return config

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _CheckedPartition:
        """One producer per worker."""
        config = self.producer_config(step_id, worker_index)
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
