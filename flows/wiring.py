"""Sources and sinks for the one dataflow: in memory (tests), JSON-lines files, Kafka."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bytewax.operators as op
from bytewax.connectors.files import FileSink
from bytewax.dataflow import Dataflow, Stream
from bytewax.testing import TestingSink, TestingSource
from confluent_kafka import OFFSET_BEGINNING

from flows.dataflow import Message, Open, Wiring
from flows.events import DeadLetter, Origin, minimal_dead_letter
from flows.files import JsonLinesSource
from flows.kafka_io import DeliveryCheckedKafkaSink, Replacement, kafka_messages


def memory_wiring(
    requests: list[Message],
    feedback: list[Message],
    selections: list,
    dead_letters: list,
    events: list[Message] | None = None,
) -> Wiring:
    """Read from lists of (bytes, Origin) (or one combined ``events`` list); append
    (key, JSON bytes) outputs to lists."""
    inputs = {"requests": requests, "feedback": feedback} if events is None else {"events": events}
    return Wiring(
        inputs={
            kind: (
                lambda flow, step, items=items: (op.input(step, flow, TestingSource(items)), None)
            )
            for kind, items in inputs.items()
        },
        selections=lambda step, up: op.output(step, up, TestingSink(selections)),
        dead_letters=lambda step, up: op.output(step, up, TestingSink(dead_letters)),
    )


def file_wiring(
    requests: str | Path, feedback: str | Path, selections: str | Path, dead_letters: str | Path
) -> Wiring:
    """Read JSON-lines files; write one JSON object per line (the key is in the object)."""

    def lines(step: str, up: Stream, path: str | Path) -> None:
        text = op.map(f"{step}_text", up, lambda kv: (kv[0], kv[1].decode("utf-8")))
        op.output(step, text, FileSink(Path(path)))

    return Wiring(
        inputs={
            kind: (
                lambda flow, step, path=path: (op.input(step, flow, JsonLinesSource(path)), None)
            )
            for kind, path in (("requests", requests), ("feedback", feedback))
        },
        selections=lambda step, up: lines(step, up, selections),
        dead_letters=lambda step, up: lines(step, up, dead_letters),
    )


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

    def source(topic: str) -> Open:
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
