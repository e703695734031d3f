"""Reading Kafka: the sources on Kafka topics (``kafka_messages``, ``internal_messages``),
on Bytewax's public ``FixedPartitionedSource``.

Each Kafka partition is a Bytewax input partition, assigned manually, its next offset kept
in Bytewax's recovery state; ``kafka_partition`` reads one (statistics, epochs, commits).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any, cast

import bytewax.operators as op
from bytewax.connectors.kafka import KafkaError, KafkaSourceMessage
from bytewax.connectors.kafka.operators import KafkaOpOut
from bytewax.dataflow import Dataflow, Stream, operator
from bytewax.inputs import FixedPartitionedSource
from confluent_kafka import OFFSET_BEGINNING
from confluent_kafka import KafkaError as ConfluentKafkaError
from confluent_kafka.admin import AdminClient

from flows.service.connectors.kafka_partition import (
    DormantPartition,
    InternalPartition,
    ObservedPartition,
    Reading,
)
from flows.service.connectors.kafka_sink import names_of
from flows.service.connectors.members import ALONE, Members
from flows.service.observe.metrics import note_broker_contact

#: Consumer defaults of `kafka_messages` (before `add_config`). Bytewax sets none of these.
SOURCE_DEFAULTS: dict[str, Any] = {
    # librdkafka's default is "largest": a resumed offset that retention (or delete_records)
    # has removed would silently skip to the END of the partition, losing everything in
    # between. "earliest" resumes at the oldest message still there (at-least-once).
    "auto.offset.reset": "earliest",
    # how soon partitions added to a topic are noticed (librdkafka's default: 5 minutes)
    "topic.metadata.refresh.interval.ms": 30000,
    # each partition has a consumer of its own, and librdkafka's default prefetch into each
    # is large: a flood of new users then waits in those buffers and sets the process's peak
    # memory. One MiB a partition keeps the worker fed (it reads batches of a thousand)
    # when a full buffer is refilled at once: librdkafka otherwise waits a second
    # (fetch.queue.backoff.ms) before it fetches for a partition whose buffer was full.
    "queued.max.messages.kbytes": 1024,
    "fetch.queue.backoff.ms": 5,
}


class ObservedKafkaSource(FixedPartitionedSource[Any, Any]):
    """Kafka ``topics`` as a Bytewax source: each partition is an input partition
    (``kafka_partition.ObservedPartition``), read from ``starting_offset`` when it has no
    resume state. With ``group_id`` its partitions commit each finished epoch's offsets to
    that consumer group; ``kafka_messages`` says what the other arguments do.

    >>> ObservedKafkaSource(["b:9092"], "tsi.requests")
    Traceback (most recent call last):
    TypeError: topics must be a list of strings, not the string 'tsi.requests'
    """

    def __init__(
        self,
        brokers: list[str],
        topics: list[str],
        *,
        tail: bool = True,
        starting_offset: int = OFFSET_BEGINNING,
        add_config: dict[str, Any] | None = None,
        batch_size: int = 1000,
        group_id: str | None = None,
        on_epoch: Callable[[], None] | None = None,
        batched: bool = False,
        seeded: dict[str, Any] | None = None,
        members: Members = ALONE,
    ) -> None:
        self._brokers = names_of("brokers", brokers)
        self._topics = names_of("topics", topics)
        self._tail = tail
        self._starting_offset = starting_offset
        self._add_config = add_config or {}
        self._group_id = group_id
        self._reading = Reading(batch_size, batched, group_id is not None, on_epoch)
        self._members = members
        # "step id/partition": the state a partition starts from when Bytewax has none
        # (an imported store, ``flows.tools.state``)
        self.seeded = seeded or {}
        self.partition_counts: dict[str, int] = {}

    def list_parts(self) -> list[str]:
        """Every partition of the topics ("index-topic"), remembering each topic's partition
        count. Every worker of a process lists on this same object: the count is each
        listing's, not their sum. A member lists them all: those of other members are built
        dormant (``build_part``), since Bytewax 0.21.1 refuses to resume a store holding
        the state of a partition it does not list (a store of an earlier layout)."""
        parts = _listed(self._brokers, self._topics, self._add_config)
        self.partition_counts = dict(collections.Counter(part.split("-", 1)[1] for part in parts))
        return parts

    def build_part(self, step_id: str, for_part: str, resume_state: Any) -> Any:
        """This member's partitions read (``_owned_part``), the others' dormant."""
        if not self._members.owns(int(for_part.split("-", 1)[0])):
            return DormantPartition(resume_state)
        return self._owned_part(step_id, for_part, resume_state)

    def _owned_part(self, step_id: str, for_part: str, resume_state: int | None) -> Any:
        """A partition read from its resume state, else its seeded offset, else the start."""
        if resume_state is None:
            resume_state = self.seeded.get(f"{step_id}/{for_part}")
        index, topic = for_part.split("-", 1)
        return ObservedPartition(*self._partition_args(topic, index, resume_state))

    def _partition_args(
        self, topic: str, index: str, resume_state: int | None
    ) -> tuple[dict[str, Any], str, int, int, Reading, int | None]:
        """A partition's consumer settings, topic, index, offset, reading and the topic's
        partition count when listed."""
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
        offset = self._starting_offset if resume_state is None else resume_state
        built_with = self.partition_counts.get(topic)
        return config, topic, int(index), offset, self._reading, built_with


def _listed(brokers: list[str], topics: list[str], config: dict[str, Any]) -> list[str]:
    """Each topic's partitions as "index-topic", listed one topic at a time (a broker that
    creates topics on first use creates each); a topic the broker refuses raises, naming
    it. It waits as long as no broker answers."""
    client = AdminClient({"bootstrap.servers": ",".join(brokers), **config})
    parts = []
    for topic in topics:
        metadata = client.list_topics(topic).topics[topic]
        if metadata.error is not None:
            msg = f"error listing partitions for Kafka topic `{topic!r}`: {metadata.error.str()}"
            raise RuntimeError(msg)
        parts += [f"{index}-{topic}" for index in metadata.partitions]
    return parts


class InternalKafkaSource(ObservedKafkaSource):
    """The internal topic's source: ``kafka_partition.InternalPartition``s; ``inputs``
    maps a copy's tag (b"r", b"f") to its input topic."""

    def __init__(self, *args: Any, inputs: dict[bytes, str], **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.inputs = inputs

    def _owned_part(self, step_id: str, for_part: str, resume_state: Any) -> Any:
        if resume_state is None:
            resume_state = self.seeded.get(f"{step_id}/{for_part}")
        index, topic = for_part.split("-", 1)
        offset = resume_state["offset"] if resume_state else None
        args = self._partition_args(topic, index, offset)
        seen = dict(resume_state["seen"]) if resume_state else {}
        return InternalPartition(*args, seen=seen, inputs=self.inputs)


def internal_messages(
    step_id: str,
    flow: Dataflow,
    brokers: list[str],
    topic: str,
    inputs: dict[bytes, str],
    add_config: dict[str, Any] | None = None,
    *,
    starting_offset: int = OFFSET_BEGINNING,
    tail: bool = True,
    group_id: str | None = None,
    on_epoch: Callable[[], None] | None = None,
    seeded: dict[str, Any] | None = None,
    members: Members = ALONE,
) -> Stream[list[Any]]:
    """Batches of the internal topic (this member's partitions), from its start by default
    (it only holds what this service copied): each a list of messages as (bytes, input
    Origin) and dead letters (``not_a_copy``, and Kafka's errors)."""
    source = InternalKafkaSource(
        brokers,
        [topic],
        tail=tail,
        starting_offset=starting_offset,
        add_config={**SOURCE_DEFAULTS, **(add_config or {})},
        group_id=group_id,
        on_epoch=on_epoch,
        inputs=inputs,
        batched=True,
        seeded=seeded,
        members=members,
    )
    return op.input(step_id, flow, source)


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
    batched: bool = False,
    seeded: dict[str, Any] | None = None,
    members: Members = ALONE,
) -> Any:
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
    `ObservedKafkaSource`). ``batched=True`` returns one stream instead, whose items are
    lists: what one ``consume`` read, in its order: messages as (bytes, Origin) and, for
    Kafka's errors, their ``kafka_error`` dead letters. ``seeded``:
    where partitions without resume state start (``"step id/partition": offset``).
    ``members``: read only this member's partitions (``flows.service.connectors.members``).

    Defaults added over those of Bytewax's own Kafka source (which the partitions' consumer
    settings repeat): `SOURCE_DEFAULTS`, each with its reason. Left at its
    default: `fetch.wait.max.ms` (the broker answers a pending fetch as soon as one byte
    arrives, so lowering it only multiplies idle fetches; it does bound how soon
    `tail=False` sees a partition's end: add_config={"fetch.wait.max.ms": 10}).

    Caveats, as with Bytewax 0.21.1's own Kafka source: listing the partitions at start
    waits forever if no broker answers; a broker outage while running produces no error
    items, the input just waits and resumes when the broker is back.
    """
    config = {**SOURCE_DEFAULTS, **(add_config or {})}
    source = ObservedKafkaSource(
        brokers,
        topics,
        tail=tail,
        starting_offset=starting_offset,
        add_config=config,
        batch_size=batch_size,
        group_id=group_id,
        on_epoch=on_epoch,
        batched=batched,
        seeded=seeded,
        members=members,
    )
    if batched:
        return _batch_input(step_id, flow, source=source)
    return _source_input(step_id, flow, source=source)


@operator
def _source_input(step_id: str, flow: Dataflow, *, source: ObservedKafkaSource) -> KafkaOpOut:
    """``bytewax.connectors.kafka.operators.input`` with a source of our choosing; the
    same inner step ids, so recovery stores written before stay readable."""
    return op.input("kafka_input", flow, source).then(_error_split, "split_err")


@operator
def _error_split(step_id: str, up: Stream[Any]) -> KafkaOpOut:
    """The source's ``KafkaSourceMessage``s (``oks``) apart from its ``KafkaError``s
    (``errs``), as Bytewax's own Kafka input splits them."""
    branch = op.branch("branch", up, lambda item: isinstance(item, KafkaSourceMessage))
    return KafkaOpOut(branch.trues, cast(Stream[KafkaError], branch.falses))


@operator
def _batch_input(step_id: str, flow: Dataflow, *, source: ObservedKafkaSource) -> Stream[list[Any]]:
    """The batched source, with the inner step id of ``_source_input``: the same recovery
    state (the next offset of each partition)."""
    return op.input("kafka_input", flow, source)
