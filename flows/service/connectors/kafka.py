"""The dataflow's Kafka wiring: topic names and the sources and sinks on them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import bytewax.operators as op
from bytewax.dataflow import Dataflow, Stream
from confluent_kafka import OFFSET_BEGINNING

from flows.service.connectors.kafka_sink import DeliveryCheckedKafkaSink, Replacement
from flows.service.connectors.kafka_source import (
    internal_messages,
    kafka_messages,
)
from flows.service.connectors.members import ALONE, Members
from flows.service.connectors.stopping import Stop
from flows.service.connectors.topics import Topics
from flows.service.dataflow import (
    Inputs,
    Message,
    OpenSink,
    OpenSource,
    Outputs,
    Repartition,
    Wiring,
    unzip_batches,
)
from flows.service.wire._records import internal_copy, messages_only
from flows.service.wire.events import DeadLetter, ParseBySource, minimal_dead_letter
from flows.service.wire.keys import DEFAULT_SHARDS


def kafka_wiring(
    brokers: list[str],
    topics: Topics = Topics(),
    consumer_config: dict[str, Any] | None = None,
    producer_config: dict[str, Any] | None = None,
    tail: bool = True,
    group_id: str | None = None,
    starting_offset: int = OFFSET_BEGINNING,
    on_epoch: Callable[[], None] | None = None,
    seeded: dict[str, Any] | None = None,
    process: int = 0,
    members: Members = ALONE,
    internal_partitions: int = 0,
    shards: int = DEFAULT_SHARDS,
) -> Wiring:
    """Read and write Kafka; the message key of every output is the instance id.

    ``tail=False`` stops at the end of the input topics (replays, tests). Client settings
    (SASL, TLS, ...) pass through the two config dicts untouched. With ``group_id`` the
    sources commit each epoch's offsets to that group (monitoring; ``OFFSET_STORED`` as
    ``starting_offset`` starts from them) and call ``on_epoch`` when an epoch closes. A
    dead letter the broker refuses for good (too large) is written as its
    ``minimal_dead_letter`` instead. ``seeded``: where input partitions without resume
    state start (an imported store, ``flows.service.runtime.recovery.seeded_inputs``). ``process``:
    this process's index in its cluster (its sinks write through their partition of it).
    ``members``: read only this member's partitions of every input (members mode,
    ``flows.service.connectors.members``). ``internal_partitions``: the internal topic's
    partition count, to copy each event to its shard's partition (0: the partitioner
    chooses by key), its shard of the flow's ``shards``.
    """

    options = {
        "starting_offset": starting_offset,
        "group_id": group_id,
        "on_epoch": on_epoch,
        "seeded": seeded,
        "members": members,
    }

    def source(topic: str) -> OpenSource:
        return _topic_source(brokers, topic, consumer_config, tail, options)

    def sink(topic: str, replace: Replacement | None = None) -> OpenSink:
        checked = DeliveryCheckedKafkaSink(
            brokers, topic, producer_config, replace=replace, batched=True, process=process
        )
        return checked.output

    inputs = _inputs(topics, source)
    repartition = None
    if topics.repartitioned and tail:  # a bounded run (tail=False) reads the inputs directly
        repartition = _repartition(
            brokers, topics, consumer_config, sink, options, internal_partitions, shards
        )
    return Wiring(
        # an unbounded run (tail) ends when the service is asked to stop
        Inputs(inputs, repartition=repartition, ending=Stop.asked if tail else None),
        Outputs(sink(topics.selections), sink(topics.dead_letters, replace=minimal_dead_letter)),
    )


def _inputs(topics: Topics, source: Callable[[str], OpenSource]) -> dict[str, OpenSource]:
    """The input sources by name: the one combined stream, or requests and feedback."""
    if topics.events is not None:
        return {"events": source(topics.events)}
    return {"requests": source(topics.requests), "feedback": source(topics.feedback)}


def _topic_source(
    brokers: list[str],
    topic: str,
    consumer_config: dict[str, Any] | None,
    tail: bool,
    options: dict[str, Any],
) -> OpenSource:
    """One input topic as batches of (bytes, Origin) messages and batches of its Kafka
    errors as dead letters; ``options``: the starting offset, group and epoch hook."""

    def open_source(flow: Dataflow, step: str) -> tuple[Stream, Stream]:
        batches = kafka_messages(
            step,
            flow,
            brokers,
            [topic],
            options["starting_offset"],
            add_config=consumer_config,
            tail=tail,
            group_id=options["group_id"],
            on_epoch=options["on_epoch"],
            batched=True,
            seeded=options["seeded"],
            members=options["members"],
        )
        return _split_batches(step, batches)

    return open_source


def _split_batches(step: str, batches: Stream) -> tuple[Stream, Stream]:
    """(batches of messages, batches of dead letters), none of them empty."""
    split = op.map(f"{step}_split", batches, _split_batch)
    return unzip_batches(split, f"{step}_messages", f"{step}_errors")


def _split_batch(batch: list[Any]) -> tuple[list[Message], list[DeadLetter]]:
    """A consumed batch as its messages (bytes, Origin) and its dead letters (Kafka's
    errors; on the internal topic, what is not a copy the service wrote)."""
    if messages_only(batch):  # the common batch, checked in C
        return batch, []
    messages, errors = [], []
    for item in batch:
        (messages if isinstance(item, tuple) else errors).append(item)
    return messages, errors


#: How an internal copy says which input it came from (its ``o`` header: ``r:P:O``).
REQUEST_TAG, FEEDBACK_TAG = b"r", b"f"


def _repartition(
    brokers: list[str],
    topics: Topics,
    consumer_config: dict[str, Any] | None,
    sink: Callable[[str], OpenSink],
    options: dict[str, Any],
    partitions: int,
    shards: int,
) -> Repartition:
    """The internal topic between the inputs and the stateful step: copies written with
    ``sink`` (to their shard's, of ``shards``, partition of ``partitions``, or by key when
    0), read back by
    an internal source (``options``: its starting offset, group, epoch hook and members),
    each parsed as its original was."""
    tags = {topics.requests: REQUEST_TAG, topics.feedback: FEEDBACK_TAG}
    inputs_by_tag = {tag: topic for topic, tag in tags.items()}

    def open_internal(flow: Dataflow, step: str) -> tuple[Stream, Stream]:
        batches = internal_messages(
            step, flow, brokers, topics.internal, inputs_by_tag, consumer_config, **options
        )
        return _split_batches(step, batches)

    def copy(step: str, up: Stream) -> None:
        messages = op.map(
            f"{step}_message",
            up,
            lambda batch: [internal_copy(routed, tags, partitions, shards) for routed in batch],
        )
        sink(topics.internal)(step, messages)

    return Repartition(copy, open_internal, ParseBySource(topics.requests))
