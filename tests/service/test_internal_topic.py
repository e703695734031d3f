"""The internal topic on a real broker: the copies the sink writes are read back as their
originals, second copies are dropped, and a message the service did not write there is a
``not_a_copy`` dead letter: never applied, never lost, never a reason to stop."""

from __future__ import annotations

import bytewax.operators as op
from bytewax.dataflow import Dataflow
from bytewax.testing import TestingSink, TestingSource, run_main
from confluent_kafka import Producer

from flows.service.connectors.kafka import _split_batches
from flows.service.connectors.kafka_sink import DeliveryCheckedKafkaSink
from flows.service.connectors.kafka_source import internal_messages
from flows.service.wire._records import internal_copy
from flows.service.wire.events import DeadLetter, Origin
from flows.testing.kafka_broker import create_topic, unique_topic

TAGS = {"tsi.requests": b"r", "tsi.feedback": b"f"}
INPUTS = {tag: topic for topic, tag in TAGS.items()}


def write_copies(bootstrap: str, topic: str, routed: list[tuple[str, bytes, Origin]]) -> None:
    """Copies written as the service writes them: ``internal_copy`` through its sink."""
    flow = Dataflow("copies")
    copies = [internal_copy(item, TAGS) for item in routed]
    sink = DeliveryCheckedKafkaSink([bootstrap], topic)
    sink.output("out", op.input("in", flow, TestingSource(copies)))
    run_main(flow)


def read_back(bootstrap: str, topic: str) -> tuple[list, list[DeadLetter]]:
    flow = Dataflow("internal")
    batches = internal_messages("in", flow, [bootstrap], topic, INPUTS, tail=False)
    messages, letters = _split_batches("in", batches)
    read: list = []
    dead: list = []
    op.output("messages", messages, TestingSink(read))
    op.output("letters", letters, TestingSink(dead))
    run_main(flow)
    return [m for batch in read for m in batch], [d for batch in dead for d in batch]


def test_copies_read_back_as_their_originals_and_foreign_messages_are_dead_letters(
    kafka_bootstrap,
):
    topic = create_topic(kafka_bootstrap, unique_topic("internal"))
    first = ("e:u1", b'{"a":1}', Origin("tsi.requests", 2, 17, 1_700_000_000.5))
    second = ("e:u2", b'{"b":2}', Origin("tsi.feedback", 0, 4, None))
    write_copies(kafka_bootstrap, topic, [first, second, first])  # first again: a crash's
    foreign = [
        (b"no headers", None),
        (b"bad partition", [("o", b"r:x:1")]),
        (b"unknown tag", [("o", b"z:0:1")]),
        (b"bad time", [("o", b"r:0:99"), ("t", b"soon")]),
        (None, [("o", None)]),
    ]
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for value, headers in foreign:
        producer.produce(topic, value, b"k", headers=headers)
    assert producer.flush(10) == 0
    write_copies(kafka_bootstrap, topic, [("e:u3", b"{}", Origin("tsi.requests", 2, 18, 2.0))])

    messages, letters = read_back(kafka_bootstrap, topic)

    assert messages == [(raw, origin) for _, raw, origin in (first, second)] + [
        (b"{}", Origin("tsi.requests", 2, 18, 2.0))  # read on past the foreign ones
    ]
    assert [d.reason for d in letters] == ["not_a_copy"] * len(foreign)
    assert [d.raw for d in letters] == [value or b"" for value, _ in foreign]
    assert [(d.origin.source, d.origin.offset) for d in letters] == [
        (topic, offset) for offset in range(3, 3 + len(foreign))
    ]
    assert "r:x:1" in letters[1].detail and "soon" in letters[3].detail
