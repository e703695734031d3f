"""Kafka input and output for the dataflows, built on Bytewax 0.21.1's Kafka connector.

- `DeliveryCheckedKafkaSink`: an output sink that waits for the broker to acknowledge every
  message of a batch and raises if any was not, so the dataflow fails and Bytewax recovery
  replays the epoch. The stock `bytewax.connectors.kafka.KafkaSink` never looks at delivery
  reports: messages the broker refuses (unknown topic, broker down, ...) are dropped and the
  dataflow carries on as if they had been written.
- `kafka_messages`: a thin wrapper over `bytewax.connectors.kafka.operators.input` (manual
  partition assignment, offsets kept in Bytewax recovery state, no consumer group) that
  only adds safer consumer defaults.

Client settings (security.protocol, sasl.*, ssl.*, client.id, ...) are never hard-coded:
pass any librdkafka property through `add_config`; it overrides the defaults set here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from bytewax.connectors.kafka import KafkaError, KafkaSinkMessage, KafkaSourceMessage
from bytewax.connectors.kafka import operators as kop
from bytewax.dataflow import Dataflow
from bytewax.outputs import DynamicSink, StatelessSinkPartition
from confluent_kafka import OFFSET_BEGINNING, KafkaException, Producer
from confluent_kafka import KafkaError as ConfluentKafkaError

__all__ = [
    "DeliveryCheckedKafkaSink",
    "KafkaItem",
    "kafka_messages",
]

Key = str | bytes | None
KafkaItem = tuple[Key, bytes | str | None] | KafkaSinkMessage[Any, Any]
"""What `DeliveryCheckedKafkaSink` accepts: a `(key, value)` tuple produced to the sink's
topic, or a `KafkaSinkMessage` (its `topic`, `partition` and `headers` are honoured when
set; its `timestamp` 0 means "now")."""

#: Extra time `flush` is given beyond `message.timeout.ms`: librdkafka checks message
#: timeouts about once a second, so the last report can arrive up to ~1 s late.
_FLUSH_GRACE_S = 2.0

#: Consumer defaults of `kafka_messages` (before `add_config`). Bytewax sets none of these.
SOURCE_DEFAULTS: dict[str, Any] = {
    # librdkafka's default is "largest": a resumed offset that retention (or delete_records)
    # has removed would silently skip to the END of the partition, losing everything in
    # between. "earliest" resumes at the oldest message still there (at-least-once).
    "auto.offset.reset": "earliest",
}


def _names(what: str, names: Iterable[str]) -> list[str]:
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
    """Delivery reports of one batch (librdkafka calls `__call__` once per message)."""

    acked: int = 0
    errors: list[tuple[str, str]] = field(default_factory=list)  # (topic, error)

    def __call__(self, err: ConfluentKafkaError | None, msg: Any) -> None:
        if err is None:
            self.acked += 1
        else:
            self.errors.append((msg.topic() or "?", str(err)))


class _CheckedPartition(StatelessSinkPartition[KafkaItem]):
    def __init__(
        self, producer: Producer, topic: str | None, timeout_s: float, client_errors: list[str]
    ) -> None:
        self._producer = producer
        self._topic = topic
        self._timeout_s = timeout_s
        self._client_errors = client_errors  # filled by the producer's error_cb

    def _produce_args(self, item: KafkaItem) -> dict[str, Any]:
        if isinstance(item, KafkaSinkMessage):
            args: dict[str, Any] = {
                "topic": item.topic or self._topic,
                "key": item.key,
                "value": item.value,
                "timestamp": item.timestamp,
            }
            if item.headers:
                args["headers"] = item.headers
            if item.partition is not None:
                args["partition"] = item.partition
        elif isinstance(item, tuple) and len(item) == 2:
            args = {"topic": self._topic, "key": item[0], "value": item[1]}
        else:
            msg = f"expected a (key, value) tuple or a KafkaSinkMessage, got {item!r}"
            raise TypeError(msg)
        if args["topic"] is None:
            msg = f"no topic for {item!r}: give the sink a topic or set KafkaSinkMessage.topic"
            raise ValueError(msg)
        return args

    def write_batch(self, items: list[KafkaItem]) -> None:
        """Produce all items, flush, and raise unless the broker acknowledged every one."""
        if not items:
            return
        batch = [self._produce_args(item) for item in items]  # bad items fail before producing
        reports = _Deliveries()
        refused: list[tuple[str, str]] = []  # produce() itself raised
        for args in batch:
            while True:
                try:
                    self._producer.produce(**args, on_delivery=reports)
                    break
                except BufferError:  # local queue full: serve reports until there is room
                    self._producer.poll(0.1)
                except KafkaException as exc:  # e.g. topic known not to exist
                    refused.append((args["topic"], str(exc.args[0] if exc.args else exc)))
                    break
            self._producer.poll(0)
        still_queued = self._producer.flush(self._timeout_s + _FLUSH_GRACE_S)
        failed = len(batch) - reports.acked
        if failed:
            errors = refused + reports.errors
            if errors:
                first = f"first error on {errors[0][0]!r}: {errors[0][1]}"
            else:
                first = f"no delivery report within {self._timeout_s + _FLUSH_GRACE_S:g} s"
            topics = sorted({args["topic"] for args in batch})
            msg = (
                f"Kafka did not acknowledge {failed} of {len(batch)} messages to topic "
                f"{', '.join(topics)} ({still_queued} still queued); {first}"
            )
            if self._client_errors:
                msg += f"; last client error: {self._client_errors[-1]}"
            raise RuntimeError(msg)
        self._client_errors.clear()  # report only errors seen since the last good batch

    def close(self) -> None:
        """Flush anything left (normally nothing: every batch was flushed)."""
        left = self._producer.flush(self._timeout_s + _FLUSH_GRACE_S)
        if left:
            msg = f"Kafka sink for topic {self._topic}: {left} messages still queued at close"
            raise RuntimeError(msg)


class DeliveryCheckedKafkaSink(DynamicSink[KafkaItem]):
    """Produce to Kafka and fail loudly unless every message is acknowledged.

    Items are `(key, value)` tuples (key `str | bytes | None`, value `bytes`; a `str` is
    UTF-8 encoded), produced to `topic` with the default partitioner (same key, same
    partition). `KafkaSinkMessage` items are accepted too, for per-message topic, partition
    or headers. Each worker has one idempotent producer; `write_batch` produces the whole
    batch, flushes, and raises `RuntimeError` (naming the topic, the number of messages not
    acknowledged and the first error) if any delivery failed or did not complete in time.
    The dataflow then stops and Bytewax recovery replays the epoch: at-least-once, with the
    failed epoch's acknowledged messages written again.

    Producer defaults (all overridable through `add_config`): `enable.idempotence=true`
    (no duplicates or reordering from internal retries), `acks=all`, `linger.ms=5`
    (batching inside a write; the flush at its end sends immediately, so no latency is
    added) and `message.timeout.ms = timeout_s * 1000`, so every message gets a success or
    failure report within `timeout_s` (plus ~1 s) and a write blocks at most that long.
    """

    def __init__(
        self,
        brokers: list[str],
        topic: str | None = None,
        add_config: dict[str, Any] | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        if not timeout_s > 0:
            msg = f"timeout_s must be positive, got {timeout_s!r}"
            raise ValueError(msg)
        self._brokers = _names("brokers", brokers)
        self._topic = topic
        self._add_config = dict(add_config or {})
        self._timeout_s = float(timeout_s)

    def producer_config(self, step_id: str = "sink", worker_index: int = 0) -> dict[str, Any]:
        """The librdkafka configuration a worker's producer is built with."""
        config: dict[str, Any] = {
            "bootstrap.servers": ",".join(self._brokers),
            "client.id": f"tsi-{step_id}-{worker_index}",
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "message.timeout.ms": max(1, round(self._timeout_s * 1000)),
        }
        config.update(self._add_config)
        return config

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _CheckedPartition:
        """One producer per worker."""
        config = self.producer_config(step_id, worker_index)
        client_errors: list[str] = []  # connection-level errors, to explain timeouts
        user_cb: Callable[[ConfluentKafkaError], None] | None = config.get("error_cb")

        def on_error(err: ConfluentKafkaError) -> None:
            client_errors[:] = [str(err)]
            if user_cb is not None:
                user_cb(err)

        config["error_cb"] = on_error
        return _CheckedPartition(Producer(config), self._topic, self._timeout_s, client_errors)


def kafka_messages(
    step_id: str,
    flow: Dataflow,
    brokers: list[str],
    topics: list[str],
    starting_offset: int = OFFSET_BEGINNING,
    add_config: dict[str, Any] | None = None,
    *,
    tail: bool = True,
    batch_size: int = 1000,
) -> kop.KafkaOpOut[
    KafkaSourceMessage[bytes | None, bytes | None], KafkaError[bytes | None, bytes | None]
]:
    """Read `topics` from `starting_offset`; returns `.oks` and `.errs` streams.

    `.oks` carries `KafkaSourceMessage` (key, value, topic, partition, offset, timestamp,
    headers); `.errs` carries `bytewax.connectors.kafka.KafkaError` (`.err`, `.msg`) for the
    per-message errors librdkafka returns from `consume()`. Each Kafka partition is a
    Bytewax input partition, assigned manually; the next offset to read is the recovery
    state, so with recovery a restart resumes where the last snapshot was taken
    (`starting_offset` only applies without resume state). `tail=False` ends the input at
    the end of every partition (tests, backfills).

    Defaults added over Bytewax's: `auto.offset.reset=earliest` (see `SOURCE_DEFAULTS`).
    `fetch.wait.max.ms` is left at its default (500): the broker answers a pending fetch as
    soon as one byte arrives (`fetch.min.bytes=1`), so lowering it did not change the
    latency of new messages (measured ~3 ms produce-to-consume either way) and only
    multiplies idle fetch requests. It does bound how long an idle fetch takes, hence how
    soon `tail=False` sees the end of a partition (add_config={"fetch.wait.max.ms": 10}).

    Caveats of the underlying connector (Bytewax 0.21.1): listing the partitions at start
    waits forever if no broker answers; a broker outage while running produces no error
    items, the input just waits and resumes when the broker is back.
    """
    config = {**SOURCE_DEFAULTS, **(add_config or {})}
    return kop.input(
        step_id,
        flow,
        brokers=_names("brokers", brokers),
        topics=_names("topics", topics),
        tail=tail,
        starting_offset=starting_offset,
        add_config=config,
        batch_size=batch_size,
    )


class BrokerUnavailableError(ConnectionError):
    """No broker answered, or an input topic does not exist: said in one line."""


CONNECTION_SETTINGS = ("bootstrap.", "security.", "sasl.", "ssl.", "client.", "socket.")


def check_brokers(
    brokers: list[str], config: dict[str, Any], topics: list[str], timeout: float = 10.0
) -> None:
    """Fail fast, and clearly, when the brokers do not answer or an input topic is missing.

    Without this, a source started against an absent broker waits forever.
    """
    from confluent_kafka.admin import AdminClient

    settings = {k: v for k, v in config.items() if k.startswith(CONNECTION_SETTINGS)}
    where = ",".join(brokers)
    admin = AdminClient({**settings, "bootstrap.servers": where, "log_level": 0})  # quiet
    try:
        meta = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise BrokerUnavailableError(
            f"no Kafka broker answers at {where} within {timeout:g} s ({exc.args[0].str()}); "
            "start one (deploy/kafka/start.sh) or point --brokers / KAFKA_BOOTSTRAP_SERVERS "
            "at yours"
        ) from None
    missing = [t for t in topics if t not in meta.topics]
    if missing:
        raise BrokerUnavailableError(
            f"input topic(s) {', '.join(missing)} do not exist on {where}; create them "
            "(kafka-topics.sh --create) or name others with the --*-topic options"
        )
