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

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import bytewax.operators as op
from bytewax.connectors.kafka import (
    KafkaError,
    KafkaSinkMessage,
    KafkaSource,
    KafkaSourceMessage,
    _KafkaSourcePartition,
)
from bytewax.connectors.kafka import operators as kop
from bytewax.dataflow import Dataflow, operator
from bytewax.outputs import DynamicSink, StatelessSinkPartition
from confluent_kafka import OFFSET_BEGINNING, KafkaException, Producer, TopicPartition
from confluent_kafka import KafkaError as ConfluentKafkaError

from flows.metrics import note_broker_contact, observe_kafka_stats

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
    refused: list[tuple[Key, bytes, str]] = field(default_factory=list)  # (key, value, error)

    def __call__(self, err: ConfluentKafkaError | None, msg: Any) -> None:
        if err is None:
            self.acked += 1
        elif err.code() in REFUSED_FOR_GOOD:
            self.refused.append((msg.key(), msg.value() or b"", str(err)))
        else:
            self.errors.append((msg.topic() or "?", str(err)))


class _CheckedPartition(StatelessSinkPartition[KafkaItem]):
    def __init__(
        self,
        producer: Producer,
        topic: str | None,
        timeout_s: float,
        client_errors: list[str],
        replace: Replacement | None = None,
    ) -> None:
        self._producer = producer
        self._topic = topic
        self._timeout_s = timeout_s
        self._client_errors = client_errors  # filled by the producer's error_cb
        self._replace = replace

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
        """Produce all items, flush, and raise unless the broker acknowledged every one.

        With ``replace``, a message refused for good (too large, invalid) is written as the
        stand-in ``replace`` builds for it instead; a stand-in refused too is logged with
        its bytes at ERROR level, the last resort (the flow must not loop on it).
        """
        if not items:
            return
        batch = [self._produce_args(item) for item in items]  # bad items fail before producing
        reports = self._send(batch)
        if reports.refused and self._replace is not None:
            self._write_refused(reports)
        failed = len(batch) - reports.acked
        if failed:
            errors = reports.errors + [(self._topic or "?", why) for *_, why in reports.refused]
            if errors:
                first = f"first error on {errors[0][0]!r}: {errors[0][1]}"
            else:
                first = f"no delivery report within {self._timeout_s + _FLUSH_GRACE_S:g} s"
            topics = sorted({args["topic"] for args in batch})
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
                    )
                    alone.acked += 1  # the last resort is this log line: never loop on it
            reports.acked += alone.acked
            reports.errors += alone.errors

    def _send(self, batch: list[dict[str, Any]]) -> _Deliveries:
        """Produce and flush ``batch``; the reports say what became of each message."""
        reports = _Deliveries()
        for args in batch:
            while True:
                try:
                    self._producer.produce(**args, on_delivery=reports)
                    break
                except BufferError:  # local queue full: serve reports until there is room
                    self._producer.poll(0.1)
                except KafkaException as exc:  # e.g. larger than message.max.bytes
                    err = exc.args[0] if exc.args else None
                    why = err.str() if isinstance(err, ConfluentKafkaError) else str(exc)
                    if isinstance(err, ConfluentKafkaError) and err.code() in REFUSED_FOR_GOOD:
                        reports.refused.append((args.get("key"), args["value"] or b"", why))
                    else:
                        reports.errors.append((args["topic"], why))
                    break
            self._producer.poll(0)
        self._producer.flush(self._timeout_s + _FLUSH_GRACE_S)
        return reports

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
    failed epoch's acknowledged messages written again. A message refused for what it is
    (``REFUSED_FOR_GOOD``: too large, invalid) would fail every replay the same way: with
    ``replace`` it is written as the stand-in ``replace(value, error)`` returns instead
    (the dead-letter sink writes ``flows.events.minimal_dead_letter``).

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
        replace: Replacement | None = None,
    ) -> None:
        if not timeout_s > 0:
            msg = f"timeout_s must be positive, got {timeout_s!r}"
            raise ValueError(msg)
        self._brokers = _names("brokers", brokers)
        self._topic = topic
        self._add_config = dict(add_config or {})
        self._timeout_s = float(timeout_s)
        self._replace = replace

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
            note_broker_contact(False, str(err))
            if user_cb is not None:
                user_cb(err)

        config["error_cb"] = on_error
        return _CheckedPartition(
            Producer(config), self._topic, self._timeout_s, client_errors, self._replace
        )


class _ObservedPartition(_KafkaSourcePartition):
    """Bytewax 0.21.1's Kafka source partition, telling the service what happens to it.

    - librdkafka's statistics (every second) feed readiness and consumer lag
      (``flows.metrics.observe_kafka_stats``) instead of Bytewax's own lag gauge;
    - each snapshot (an epoch's close) is reported through ``on_epoch``;
    - with a ``group.id`` of the service's own, the offset of the previous snapshot is
      committed to that group when the next is taken (that epoch is done), and the last
      one when the partition closes at the end of its input. Recovery never reads these
      commits: they make progress and lag visible to standard Kafka tools, and
      ``--no-recovery`` starts from them.
    """

    def __init__(self, *args: Any, on_epoch: Callable[[], None] | None, commit: bool) -> None:
        super().__init__(*args)
        self._on_epoch = on_epoch
        self._commits = commit
        self._done: int | None = None  # the offset of the previous snapshot

    def _process_stats(self, json_stats: str) -> None:
        observe_kafka_stats(json_stats, self._offset)  # never raises

    def snapshot(self) -> int | None:
        offset = super().snapshot()
        self._commit(asynchronous=True)
        self._done = offset
        if self._on_epoch is not None:
            self._on_epoch()
        return offset

    def _commit(self, asynchronous: bool) -> None:
        if not self._commits or self._done is None or self._done < 0:
            return
        try:
            self._consumer.commit(
                offsets=[TopicPartition(self._topic, self._part_idx, self._done)],
                asynchronous=asynchronous,
            )
        except KafkaException as exc:  # monitoring only: never stop the flow for it
            log.warning("committing offset of %s[%d]: %s", self._topic, self._part_idx, exc)

    def close(self) -> None:
        """At the end of the input every epoch is done: commit the last snapshot's offset."""
        self._commit(asynchronous=False)
        super().close()


class ObservedKafkaSource(KafkaSource):
    """``bytewax.connectors.kafka.KafkaSource`` building ``_ObservedPartition``s; with
    ``group_id`` they commit each finished epoch's offsets to that consumer group."""

    def __init__(
        self,
        *args: Any,
        group_id: str | None = None,
        on_epoch: Callable[[], None] | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(*args, **kw)
        self._group_id = group_id
        self._on_epoch = on_epoch

    def build_part(self, step_id: str, for_part: str, resume_state: int | None) -> Any:
        """As Bytewax 0.21.1 builds its partitions (which overwrites any ``stats_cb``)."""
        index, topic = for_part.split("-", 1)
        config = {
            "group.id": "BYTEWAX_IGNORED",
            "enable.auto.commit": "false",
            "bootstrap.servers": ",".join(self._brokers),
            "enable.partition.eof": str(not self._tail),
            "statistics.interval.ms": 1000,
            **self._add_config,
            "error_cb": _noting_errors(self._add_config.get("error_cb")),
        }
        if self._group_id is not None:
            config["group.id"] = self._group_id
        return _ObservedPartition(
            step_id,
            config,
            topic,
            int(index),
            self._starting_offset,
            resume_state,
            self._batch_size,
            self._raise_on_errors,
            on_epoch=self._on_epoch,
            commit=self._group_id is not None,
        )


def _noting_errors(
    then: Callable[[ConfluentKafkaError], None] | None,
) -> Callable[[ConfluentKafkaError], None]:
    """An ``error_cb`` that tells readiness, then calls the configured one (if any)."""

    def on_error(err: ConfluentKafkaError) -> None:
        note_broker_contact(False, str(err))
        if then is not None:
            then(err)

    return on_error


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
    group_id: str | None = None,
    on_epoch: Callable[[], None] | None = None,
) -> kop.KafkaOpOut[
    KafkaSourceMessage[bytes | None, bytes | None], KafkaError[bytes | None, bytes | None]
]:
    """Read `topics` from `starting_offset`; returns `.oks` and `.errs` streams.

    `.oks` carries `KafkaSourceMessage` (key, value, topic, partition, offset, timestamp,
    headers); `.errs` carries `bytewax.connectors.kafka.KafkaError` (`.err`, `.msg`) for the
    per-message errors librdkafka returns from `consume()`. Each Kafka partition is a
    Bytewax input partition, assigned manually; the next offset to read is the recovery
    state, so with recovery a restart resumes where the last snapshot was taken
    (`starting_offset` only applies without resume state; `OFFSET_STORED` starts from
    `group_id`'s committed offsets). `tail=False` ends the input at the end of every
    partition (tests, backfills). With `group_id`, each epoch's offsets are committed to
    that consumer group; `on_epoch` is called at each epoch close (see
    `ObservedKafkaSource`).

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
    source = ObservedKafkaSource(
        _names("brokers", brokers),
        _names("topics", topics),
        tail=tail,
        starting_offset=starting_offset,
        add_config=config,
        batch_size=batch_size,
        raise_on_errors=False,
        group_id=group_id,
        on_epoch=on_epoch,
    )
    return _source_input(step_id, flow, source=source)


@operator
def _source_input(step_id: str, flow: Dataflow, *, source: KafkaSource) -> kop.KafkaOpOut:
    """``bytewax.connectors.kafka.operators.input`` with a source of our choosing; the
    same inner step ids, so recovery stores written before stay readable."""
    return op.input("kafka_input", flow, source).then(kop._kafka_error_split, "split_err")


class BrokerUnavailableError(ConnectionError):
    """No broker answered, or a topic the service reads or writes is missing: one line."""


def check_topics(
    brokers: list[str],
    config: dict[str, Any],
    inputs: Iterable[str],
    outputs: Iterable[str] = (),
    timeout: float = 10.0,
) -> dict[str, int]:
    """Fail fast, in one line, unless a broker answers and every topic exists; then return
    {output topic: its max.message.bytes} (to bound what is written to it).

    ``config`` is a client config (its connection settings are used: SASL, TLS, ...);
    settings librdkafka refuses together (SASL without a username, a missing CA file) fail
    here too. Without this check a source started against an absent broker waits forever,
    and a missing output topic fails the flow only at its first write. max.message.bytes
    is the topic's effective value (``BROKER_DEFAULT_MAX_MESSAGE_BYTES``, 1048588, when the
    client may not describe topic configs).
    """
    from flows.topics import TopicError, admin_client, cluster_metadata, max_message_bytes

    inputs, outputs = list(dict.fromkeys(inputs)), list(dict.fromkeys(outputs))
    try:
        admin = admin_client(brokers, config)
        known = cluster_metadata(admin, brokers, timeout).topics
        missing = [
            f"{kind} topic(s) {', '.join(gone)}"
            for kind, names in (("input", inputs), ("output", outputs))
            if (gone := [t for t in names if t not in known])
        ]
        if missing:
            raise BrokerUnavailableError(
                f"{' and '.join(missing)} do not exist on {','.join(brokers)}; create them "
                "with `tsi topics create` (same --brokers and topic options) or name others "
                "with the --*-topic options"
            )
        return max_message_bytes(admin, outputs, timeout)
    except TopicError as exc:
        raise BrokerUnavailableError(str(exc)) from None


def check_brokers(
    brokers: list[str], config: dict[str, Any], topics: list[str], timeout: float = 10.0
) -> None:
    """`check_topics` for input ``topics`` only (what ``tsi run`` has called so far)."""
    check_topics(brokers, config, topics, [], timeout)
