"""The Kafka sink and source (flows.service.connectors) on a real broker, in real dataflows."""

from __future__ import annotations

import time

import bytewax.operators as op
import pytest
from bytewax.connectors.kafka import KafkaSink, KafkaSinkMessage, KafkaSourceMessage
from bytewax.connectors.kafka import operators as kop
from bytewax.dataflow import Dataflow
from bytewax.testing import TestingSink, TestingSource, run_main
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from flows.service.connectors.kafka_sink import DeliveryCheckedKafkaSink, partition_name
from flows.service.connectors.kafka_source import kafka_messages
from flows.testing.kafka_broker import consume_all, create_topic, free_port, unique_topic

QUIET = {"log_level": 0}  # librdkafka logs every failed connection attempt to stderr


def run_sink(items: list, sink, batch_size: int = 50) -> None:
    flow = Dataflow("sink_test")
    stream = op.input("in", flow, TestingSource(items, batch_size=batch_size))
    if isinstance(sink, DeliveryCheckedKafkaSink):
        sink.output("out", stream)
    else:
        op.output("out", stream, sink)
    run_main(flow)


def error_chain(exc: BaseException) -> str:
    """The messages of an exception and of everything it was raised from."""
    parts = []
    seen: BaseException | None = exc
    while seen is not None:
        parts.append(str(seen))
        seen = seen.__cause__ or seen.__context__
    return "\n".join(parts)


def test_sink_delivers_in_order_per_partition(kafka_bootstrap: str) -> None:
    topic = create_topic(kafka_bootstrap, unique_topic("sink"), partitions=3)
    items = [(f"key-{i % 7}", f"value-{i}".encode()) for i in range(300)]
    items.append((None, b"no key"))
    items.append((b"bytes-key", b""))
    run_sink(items, DeliveryCheckedKafkaSink([kafka_bootstrap], topic, timeout_s=10))

    got = consume_all(kafka_bootstrap, topic)
    assert sum(map(len, got.values())) == len(items)
    where: dict[bytes | None, int] = {}
    for part, msgs in got.items():
        for key, _, _ in msgs:
            assert where.setdefault(key, part) == part, "one key, one partition"
    sent = [(k.encode() if isinstance(k, str) else k, v) for k, v in items]
    for part, msgs in got.items():  # each partition holds its keys' items in input order
        assert [(k, v) for k, v, _ in msgs] == [(k, v) for k, v in sent if where[k] == part]
    assert len([p for p in got.values() if p]) > 1, "keys spread over partitions"


def test_sink_accepts_kafka_sink_messages(kafka_bootstrap: str) -> None:
    topic = create_topic(kafka_bootstrap, unique_topic("sinkmsg"), partitions=2)
    items = [
        KafkaSinkMessage(b"k", b"to p1", topic=topic, partition=1, headers=[("h", b"1")]),
        KafkaSinkMessage(b"k", b"to p0", topic=topic, partition=0),
    ]
    run_sink(items, DeliveryCheckedKafkaSink([kafka_bootstrap], topic=None, timeout_s=10))
    got = consume_all(kafka_bootstrap, topic)
    assert got == {0: [(b"k", b"to p0", [])], 1: [(b"k", b"to p1", [("h", b"1")])]}


def test_sink_writes_key_value_headers_triples_to_its_topic(kafka_bootstrap: str) -> None:
    """The internal copies' form: (key, value, headers), produced to the sink's topic."""
    topic = create_topic(kafka_bootstrap, unique_topic("triples"))
    items = [(b"k1", b"v1", [("o", b"r:0:1"), ("t", b"1500")]), ("k2", b"v2", []), ("k3", b"v3")]
    run_sink(items, DeliveryCheckedKafkaSink([kafka_bootstrap], topic, timeout_s=10))
    assert consume_all(kafka_bootstrap, topic) == {
        0: [
            (b"k1", b"v1", [("o", b"r:0:1"), ("t", b"1500")]),
            (b"k2", b"v2", []),
            (b"k3", b"v3", []),
        ]
    }


def test_sink_fails_loudly_on_unknown_topic(kafka_bootstrap: str) -> None:
    topic = unique_topic("missing")  # never created; the broker does not auto-create
    sink = DeliveryCheckedKafkaSink([kafka_bootstrap], topic, add_config=QUIET, timeout_s=1)
    t0 = time.monotonic()
    with pytest.raises(Exception) as info:  # bytewax wraps the sink's RuntimeError
        run_sink([("k", b"v%d" % i) for i in range(5)], sink)
    text = error_chain(info.value)
    assert topic in text
    assert "did not acknowledge 5 of 5 messages" in text
    assert time.monotonic() - t0 < 10


def test_sink_fails_loudly_when_no_broker_listens() -> None:
    topic = unique_topic("nobroker")
    sink = DeliveryCheckedKafkaSink([f"127.0.0.1:{free_port()}"], topic, QUIET, timeout_s=1)
    with pytest.raises(Exception) as info:
        run_sink([("k", b"v")], sink)
    text = error_chain(info.value)
    assert topic in text
    assert "did not acknowledge 1 of 1 messages" in text
    assert "Connection refused" in text or "brokers are down" in text  # from error_cb


def test_stock_kafka_sink_drops_silently(kafka_bootstrap: str) -> None:
    """Why the checked sink exists: Bytewax's KafkaSink ignores delivery reports, so the
    same unknown topic makes it return normally with nothing written."""
    topic = unique_topic("stock")
    sink = KafkaSink([kafka_bootstrap], topic, add_config={"message.timeout.ms": 1000, **QUIET})
    items = [KafkaSinkMessage(b"k", b"v%d" % i) for i in range(5)]
    run_sink(items, sink)  # no exception: 5 messages lost
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    assert topic not in admin.list_topics(timeout=10).topics


def produce(bootstrap: str, topic: str, messages: list[tuple[int, bytes, bytes]]) -> None:
    """Produce (partition, key, value) messages with confluent_kafka; all must be acked."""
    errors: list = []
    producer = Producer({"bootstrap.servers": bootstrap})
    for part, key, value in messages:
        producer.produce(
            topic, value, key, partition=part, on_delivery=lambda e, _: errors.append(e)
        )
    assert producer.flush(10) == 0
    assert errors == [None] * len(messages)


def read_flow(bootstrap: str, topic: str, **kwargs) -> tuple[list, list]:
    """Run kafka_messages(tail=False) to the end of the topic; return (oks, errs)."""
    oks: list[KafkaSourceMessage] = []
    errs: list = []
    flow = Dataflow("source_test")
    msgs = kafka_messages("in", flow, [bootstrap], [topic], tail=False, **kwargs)
    op.output("oks", msgs.oks, TestingSink(oks))
    op.output("errs", msgs.errs, TestingSink(errs))
    run_main(flow)
    return oks, errs


def test_source_reads_from_the_beginning_with_positions(kafka_bootstrap: str) -> None:
    topic = create_topic(kafka_bootstrap, unique_topic("src"), partitions=2)
    sent = [(i % 2, f"k{i}".encode(), f"v{i}".encode()) for i in range(40)]
    produce(kafka_bootstrap, topic, sent)

    oks, errs = read_flow(kafka_bootstrap, topic)
    assert errs == []
    assert all(m.topic == topic for m in oks)
    for part in (0, 1):
        mine = [m for m in oks if m.partition == part]
        assert [m.offset for m in mine] == list(range(20))
        assert [(m.key, m.value) for m in mine] == [(k, v) for p, k, v in sent if p == part]
        assert all(m.timestamp is not None and m.timestamp[1] > 0 for m in mine)


def test_source_resumes_past_deleted_records(kafka_bootstrap: str) -> None:
    """A start/resume offset that retention already deleted must not skip to the end.

    An explicit starting_offset takes the same path as a recovery resume state (both go
    into Consumer.assign). librdkafka's default auto.offset.reset ("largest") jumps to the
    end of the partition: the stock kop.input reads nothing; kafka_messages reads what is
    left.
    """
    topic = create_topic(kafka_bootstrap, unique_topic("gap"), partitions=1)
    produce(kafka_bootstrap, topic, [(0, b"k", b"%d" % i) for i in range(10)])
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    cut = TopicPartition(topic, 0, 5)
    admin.delete_records([cut])[cut].result(10)  # offsets 0..4 are gone, as after retention

    oks, errs = read_flow(kafka_bootstrap, topic, starting_offset=2)
    assert errs == []
    assert [m.offset for m in oks] == [5, 6, 7, 8, 9]

    stock: list = []
    flow = Dataflow("stock_source")
    msgs = kop.input(
        "in", flow, brokers=[kafka_bootstrap], topics=[topic], tail=False, starting_offset=2
    )
    op.output("oks", msgs.oks, TestingSink(stock))
    run_main(flow)
    assert stock == []  # silently skipped 5..9


def _small_topic(bootstrap: str, limit: int) -> str:
    """A topic whose broker-side max.message.bytes is `limit`."""
    from confluent_kafka.admin import NewTopic

    name = unique_topic("small")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = NewTopic(name, num_partitions=1, config={"max.message.bytes": str(limit)})
    admin.create_topics([new])[name].result(30)
    return create_topic(bootstrap, name)  # waits for its leader


def test_the_sink_is_told_only_of_failures_and_refuses_to_be_told_otherwise():
    """A batch counts its failures: its producer reports only those, whatever the config."""
    sink = DeliveryCheckedKafkaSink(["127.0.0.1:1"], "t", add_config={"linger.ms": 1})
    assert sink.producer_config()["delivery.report.only.error"] is True
    with pytest.raises(ValueError, match=r"delivery\.report\.only\.error is always true.*False"):
        DeliveryCheckedKafkaSink(["127.0.0.1:1"], "t", {"delivery.report.only.error": False})


@pytest.mark.parametrize(
    ("named", "bad", "error"),
    [
        (True, ("k", b"v", "third"), r"expected a \(key, value\) or .*'third'"),
        (True, b"just bytes", r"expected a \(key, value\) or .*just bytes"),
        (False, ("k", b"v"), r"no topic for \('k', b'v'\)"),
        (False, ("k", b"v", [("h", b"1")]), r"no topic for \('k', b'v', \[\('h'"),
    ],
)
def test_a_batch_with_an_item_the_sink_cannot_write_produces_nothing(
    kafka_bootstrap, named, bad, error
):
    """Every item is checked before the first is produced: the good ones around a bad one
    are not written either (the flow fails; recovery replays the whole batch)."""
    topic = create_topic(kafka_bootstrap, unique_topic("bad-item"))
    sink = DeliveryCheckedKafkaSink([kafka_bootstrap], topic if named else None, timeout_s=10)
    part = sink.build_part("s", "p0000", None)
    good = ("k", b"v") if named else KafkaSinkMessage(b"k", b"v", topic=topic)
    with pytest.raises((TypeError, ValueError), match=error):
        part.write_batch([good, bad, good])
    part.write_batch([good])
    part.snapshot()  # acknowledged: anything the bad batch had queued would be there
    assert consume_all(kafka_bootstrap, topic) == {0: [(b"k", b"v", [])]}


@pytest.mark.parametrize("refused_by", ["broker", "producer"])
def test_a_message_refused_for_good_is_replaced_not_looped_on(kafka_bootstrap, refused_by):
    """Too large for the topic (the broker refuses) or for message.max.bytes (the client
    refuses): the stand-in is written in its place, the rest of the batch is delivered."""
    limit = 20_000
    if refused_by == "broker":
        topic, config = _small_topic(kafka_bootstrap, limit), {}
    else:
        topic = create_topic(kafka_bootstrap, unique_topic("big"))
        config = {"message.max.bytes": limit}
    items = [("k", b"a" * 100), ("k", b"b" * 50_000), ("k", b"c" * 100)]
    stand_in = lambda value, why: f"{len(value)} refused: {why[-40:]}".encode()  # noqa: E731
    sink = DeliveryCheckedKafkaSink(
        [kafka_bootstrap], topic, config, timeout_s=10, replace=stand_in
    )
    run_sink(items, sink)
    values = [v for _, v, _ in consume_all(kafka_bootstrap, topic)[0]]
    assert values[0] == b"a" * 100 and b"c" * 100 in values and len(values) == 3
    [written] = [v for v in values if v.startswith(b"50000 refused")]
    assert b"too large" in written.lower() or b"size" in written.lower()


def test_without_a_replacement_a_message_refused_for_good_fails_the_flow(kafka_bootstrap):
    topic = _small_topic(kafka_bootstrap, 20_000)
    sink = DeliveryCheckedKafkaSink([kafka_bootstrap], topic, timeout_s=10)
    with pytest.raises(Exception) as caught:  # Bytewax wraps the error
        run_sink([("k", b"x" * 50_000)], sink)
    assert "did not acknowledge 1 of 1" in error_chain(caught.value)


def test_source_commits_each_finished_epoch_to_its_group(kafka_bootstrap):
    from confluent_kafka import Consumer

    topic = create_topic(kafka_bootstrap, unique_topic("group"), partitions=2)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(200):
        producer.produce(topic, f"m{i}".encode(), key=str(i % 5))
    assert producer.flush(30) == 0
    group = unique_topic("tsi-group")
    flow = Dataflow("commit_test")
    read = kafka_messages(
        "in",
        flow,
        [kafka_bootstrap],
        [topic],
        add_config={"fetch.wait.max.ms": 10},
        tail=False,
        group_id=group,
    )
    got: list = []
    op.output("out", read.oks, TestingSink(got))
    from datetime import timedelta

    run_main(flow, epoch_interval=timedelta(milliseconds=50))
    assert len(got) == 200
    watcher = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": group})
    committed = watcher.committed([TopicPartition(topic, p) for p in (0, 1)], timeout=10)
    watcher.close()
    ends = {tp.partition: tp.offset for tp in committed}
    sizes = {p: len(m) for p, m in consume_all(kafka_bootstrap, topic).items()}
    # at the end of the input every epoch is done: the group's offsets are the topic's ends
    assert ends == sizes and all(sizes.values())


def test_a_write_returns_before_the_broker_answers_and_the_epochs_snapshot_waits_for_it(
    kafka_bootstrap,
):
    """The worker does not wait for the broker after each batch; the snapshot Bytewax
    takes before it commits an epoch does, so no epoch is committed unwritten."""
    topic = create_topic(kafka_bootstrap, unique_topic("epoch"))
    sink = DeliveryCheckedKafkaSink([kafka_bootstrap], topic, {"linger.ms": 60_000}, batched=True)
    part = sink.build_part("s", "p0000", None)
    started = time.monotonic()
    part.write_batch([[("k", b"v1"), ("k", b"v2")], [("k", b"v3")]])
    assert time.monotonic() - started < 1.0  # not held for linger.ms
    assert consume_all(kafka_bootstrap, topic) == {0: []}  # still in the producer
    part.snapshot()
    assert consume_all(kafka_bootstrap, topic) == {
        0: [(b"k", b"v1", []), (b"k", b"v2", []), (b"k", b"v3", [])]
    }
    part.snapshot()  # nothing new: returns at once
    part.close()


def test_each_process_writes_through_its_own_sink_partition():
    sinks = [DeliveryCheckedKafkaSink(["127.0.0.1:1"], "t", process=p) for p in range(12)]
    names = sorted(part for sink in sinks for part in sink.list_parts())
    assert names == [partition_name(p) for p in range(12)]  # sorted as the processes are
    assert [sinks[0].part_fn(name) for name in names] == list(range(12))
