"""The dataflow's Kafka wiring: topic names and the sources and sinks on them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import bytewax.operators as op
from bytewax.dataflow import Dataflow, Stream
from confluent_kafka import OFFSET_BEGINNING

from flows.service.connectors.kafka_sink import DeliveryCheckedKafkaSink, Replacement
from flows.service.connectors.kafka_source import kafka_messages
from flows.service.dataflow import OpenSource, Wiring
from flows.service.events import DeadLetter, Origin, minimal_dead_letter


@dataclass(frozen=True)
class Topics:
    """Kafka topic names; with ``events`` set, requests and feedback share that one topic."""

    requests: str = "tsi.requests"
    feedback: str = "tsi.feedback"
    selections: str = "tsi.selections"
    dead_letters: str = "tsi.dlq"
    events: str | None = None


def kafka_wiring(
    brokers: list[str],
    topics: Topics = Topics(),
    consumer_config: dict[str, Any] | None = None,
    producer_config: dict[str, Any] | None = None,
    tail: bool = True,
    group_id: str | None = None,
    starting_offset: int = OFFSET_BEGINNING,
    on_epoch: Callable[[], None] | None = None,
) -> Wiring:
    """Read and write Kafka; the message key of every output is the instance id.

    ``tail=False`` stops at the end of the input topics (replays, tests). Client settings
    (SASL, TLS, ...) pass through the two config dicts untouched. With ``group_id`` the
    sources commit each epoch's offsets to that group (monitoring; ``OFFSET_STORED`` as
    ``starting_offset`` starts from them) and call ``on_epoch`` when an epoch closes. A
    dead letter the broker refuses for good (too large) is written as its
    ``minimal_dead_letter`` instead.
    """

    def source(topic: str) -> OpenSource:
        def open_source(flow: Dataflow, step: str) -> tuple[Stream, Stream]:
            read = kafka_messages(
                step,
                flow,
                brokers,
                [topic],
                starting_offset,
                add_config=consumer_config,
                tail=tail,
                group_id=group_id,
                on_epoch=on_epoch,
            )
            messages = op.map(
                f"{step}_messages",
                read.oks,
                # the topic's one str object, not a copy per message: open tickets keep it
                lambda m: (m.value, Origin(topic, m.partition, m.offset)),
            )
            errors = op.map(f"{step}_errors", read.errs, _kafka_dead_letter)
            return messages, errors

        return open_source

    def sink(topic: str, replace: Replacement | None = None) -> Callable[[str, Stream], None]:
        checked = DeliveryCheckedKafkaSink(brokers, topic, producer_config, replace=replace)
        return lambda step, up: op.output(step, up, checked)

    inputs = (
        {"events": source(topics.events)}
        if topics.events is not None
        else {"requests": source(topics.requests), "feedback": source(topics.feedback)}
    )
    return Wiring(
        inputs, sink(topics.selections), sink(topics.dead_letters, replace=minimal_dead_letter)
    )


def _kafka_dead_letter(error: Any) -> DeadLetter:
    msg = error.msg
    return DeadLetter(
        "kafka_error",
        str(error.err),
        msg.value or b"",
        Origin(msg.topic or "?", msg.partition, msg.offset),
    )
