"""``tsi topics check`` shows the consumer group's lag itself (the broker in deploy/kafka has
no kafka-consumer-groups.sh): committed offset, end and lag per partition the service
reads, against the real broker."""

from __future__ import annotations

from datetime import timedelta

import bytewax.operators as op
import pytest
from bytewax.dataflow import Dataflow
from bytewax.testing import TestingSink, run_main
from confluent_kafka import Consumer, Producer, TopicPartition
from typer.testing import CliRunner

from flows.cli import app
from flows.service.connectors.kafka_admin import PartitionLag, TopicError, group_lag
from flows.service.connectors.kafka_source import kafka_messages
from flows.testing.kafka_broker import create_topic, free_port, unique_topic


def produce(bootstrap: str, topic: str, counts: dict[int, int]) -> None:
    """``counts[p]`` small messages into partition ``p`` of ``topic``, delivered."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for partition, n in counts.items():
        for i in range(n):
            producer.produce(topic, b'{"i": %d}' % i, partition=partition)
    assert producer.flush(30) == 0


def commit(bootstrap: str, group: str, offsets: dict[tuple[str, int], int]) -> None:
    """Commit ``offsets`` for ``group`` as the service does at the end of an epoch."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        parts = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
        consumer.commit(offsets=parts, asynchronous=False)
    finally:
        consumer.close()


def check(bootstrap: str, *args: str) -> tuple[int, list[str], str]:
    """``tsi topics check`` on an events topic and fresh outputs: (status, stdout lines,
    stderr)."""
    result = CliRunner().invoke(app, ["topics", "check", "--brokers", bootstrap, *args])
    return result.exit_code, result.stdout.splitlines(), result.stderr


def events_setup(bootstrap: str, partitions: int = 2) -> tuple[str, list[str]]:
    """An events topic with its outputs, all created: (events topic, check's options)."""
    events = create_topic(bootstrap, unique_topic("lag-ev"), partitions)
    selections = create_topic(bootstrap, unique_topic("lag-sel"))
    dlq = create_topic(bootstrap, unique_topic("lag-dlq"))
    options = ["--events-topic", events, "--selections-topic", selections, "--dlq-topic", dlq]
    return events, options


def test_check_shows_committed_end_and_lag_per_partition(kafka_bootstrap):
    events, options = events_setup(kafka_bootstrap, partitions=3)
    produce(kafka_bootstrap, events, {0: 10, 1: 4, 2: 6})
    group = unique_topic("group")
    commit(kafka_bootstrap, group, {(events, 0): 7, (events, 1): 4})  # nothing on 2

    status, lines, stderr = check(kafka_bootstrap, *options, "--group-id", group)
    assert status == 0, stderr
    assert lines[4:] == [
        f"consumer group {group!r}, lag on the topics the service reads:",
        f"  {events}[0]: committed 7, end 10, lag 3",
        f"  {events}[1]: committed 4, end 4, lag 0",
        f"  {events}[2]: nothing committed, end 6 (6 message(s) held)",
        "  total lag: 3 messages",
    ]

    commit(kafka_bootstrap, group, {(events, 0): 10, (events, 2): 1})
    _, lines, _ = check(kafka_bootstrap, *options, "--group-id", group)
    assert lines[5:] == [
        f"  {events}[0]: committed 10, end 10, lag 0",
        f"  {events}[1]: committed 4, end 4, lag 0",
        f"  {events}[2]: committed 1, end 6, lag 5",
        "  total lag: 5 messages",
    ]


def test_what_the_service_source_commits_is_what_check_reads(kafka_bootstrap):
    """The service's source commits each finished epoch to its group: read to the end,
    the group has no lag; messages produced since are the lag."""
    events, options = events_setup(kafka_bootstrap)
    produce(kafka_bootstrap, events, {0: 30, 1: 20})
    group = unique_topic("group")
    flow = Dataflow("lag_check")
    read = kafka_messages("in", flow, [kafka_bootstrap], [events], tail=False, group_id=group)
    got: list = []
    op.output("out", read.oks, TestingSink(got))
    run_main(flow, epoch_interval=timedelta(milliseconds=50))
    assert len(got) == 50
    produce(kafka_bootstrap, events, {1: 5})
    status, lines, stderr = check(kafka_bootstrap, *options, "--group-id", group)
    assert status == 0, stderr
    assert lines[5:] == [
        f"  {events}[0]: committed 30, end 30, lag 0",
        f"  {events}[1]: committed 20, end 25, lag 5",
        "  total lag: 5 messages",
    ]


def test_the_group_comes_from_tsi_group_id_as_for_tsi_run(kafka_bootstrap, monkeypatch):
    events, options = events_setup(kafka_bootstrap, partitions=1)
    produce(kafka_bootstrap, events, {0: 5})
    group = unique_topic("group")
    commit(kafka_bootstrap, group, {(events, 0): 4})
    monkeypatch.setenv("TSI_GROUP_ID", group)
    status, lines, stderr = check(kafka_bootstrap, *options)
    assert status == 0, stderr
    assert f"  {events}[0]: committed 4, end 5, lag 1" in lines


def test_a_group_that_committed_nothing_says_so(kafka_bootstrap):
    events, options = events_setup(kafka_bootstrap)
    produce(kafka_bootstrap, events, {0: 3})
    group = unique_topic("never")
    status, lines, stderr = check(kafka_bootstrap, *options, "--group-id", group)
    assert status == 0, stderr
    assert len(lines) == 5  # the topics, the changelog among them, then the lag
    assert lines[4].startswith(f"consumer group {group!r} has committed nothing on {events}: ")
    assert "--group-id" in lines[4]


def test_an_empty_group_id_leaves_the_lag_out(kafka_bootstrap):
    _, options = events_setup(kafka_bootstrap)
    status, lines, _ = check(kafka_bootstrap, *options, "--group-id", "")
    assert status == 0
    assert lines[4:] == ["no consumer group given (--group-id ''): lag not shown"]


def test_the_default_setup_shows_the_inputs_and_the_internal_topic(kafka_bootstrap):
    """With two input topics the service commits the inputs (copied) and the internal
    topic (served): the lag of both stages."""
    names = {role: unique_topic(f"lag-{role}") for role in ("req", "fb", "sel", "dlq", "int")}
    for name in names.values():
        create_topic(kafka_bootstrap, name)
    produce(kafka_bootstrap, names["req"], {0: 4})
    produce(kafka_bootstrap, names["int"], {0: 3})
    group = unique_topic("group")
    commit(kafka_bootstrap, group, {(names["req"], 0): 4, (names["int"], 0): 1})
    options = [
        *("--requests-topic", names["req"], "--feedback-topic", names["fb"]),
        *("--selections-topic", names["sel"], "--dlq-topic", names["dlq"]),
        *("--internal-topic", names["int"], "--group-id", group),
    ]
    status, lines, stderr = check(kafka_bootstrap, *options)
    assert status == 0, stderr
    assert lines[6:] == [
        f"consumer group {group!r}, lag on the topics the service reads:",
        f"  {names['req']}[0]: committed 4, end 4, lag 0",
        f"  {names['fb']}[0]: nothing committed, end 0 (0 message(s) held)",
        f"  {names['int']}[0]: committed 1, end 3, lag 2",
        "  total lag: 2 messages",
    ]


def test_a_missing_input_still_fails_the_check_after_the_lag_of_the_rest(kafka_bootstrap):
    names = {role: unique_topic(f"lag-{role}") for role in ("req", "sel", "dlq", "int")}
    for name in names.values():
        create_topic(kafka_bootstrap, name)
    gone = unique_topic("lag-gone")
    group = unique_topic("group")
    commit(kafka_bootstrap, group, {(names["req"], 0): 0})
    options = [
        *("--requests-topic", names["req"], "--feedback-topic", gone),
        *("--selections-topic", names["sel"], "--dlq-topic", names["dlq"]),
        *("--internal-topic", names["int"], "--group-id", group),
    ]
    status, lines, stderr = check(kafka_bootstrap, *options)
    assert status == 2
    assert f"{gone}: missing" in lines
    assert f"  {names['req']}[0]: committed 0, end 0, lag 0" in lines
    assert not any(gone in line for line in lines if line.startswith("  "))
    assert stderr == f"tsi topics: missing topic(s) {gone}; create them: tsi topics create\n"


def test_group_lag_without_a_broker_is_one_line():
    with pytest.raises(TopicError) as info:
        group_lag([f"127.0.0.1:{free_port()}"], {}, "g", ["t"], timeout=1.0)
    assert "cannot read consumer group 'g'" in str(info.value)
    assert "\n" not in str(info.value)


def test_the_lag_of_a_partition():
    assert PartitionLag("t", 0, 7, 0, 10).lag == 3
    assert PartitionLag("t", 0, None, 2, 10).lag is None
    assert PartitionLag("t", 0, 12, 0, 10).lag == 0  # a commit past a truncated end
    assert PartitionLag("t", 1, None, 2, 10).summary() == (
        "t[1]: nothing committed, end 10 (8 message(s) held)"
    )
