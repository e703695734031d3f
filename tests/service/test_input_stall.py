"""An input partition whose consumer stopped fetching is rebuilt at its position and reads
on, nothing skipped or read twice; a partition with nothing more to read (a transaction's
end marker included) is never rebuilt. A paused consumer stands for a stuck fetcher: it
fetches nothing while the partition fills, as one stuck after a broker restart did.
"""

import threading
import time

import pytest
from confluent_kafka import OFFSET_BEGINNING, Producer, TopicPartition

from flows.service.connectors.end_watch import END_WATCH, STALL_S, End, EndWatch, stalled
from flows.service.connectors.kafka_partition import ObservedPartition, Reading
from flows.service.observe.metrics import INPUT_REBUILDS
from flows.testing.kafka_broker import create_topic, unique_topic


def produce(bootstrap, topic, values, transactional=False):
    config = {"bootstrap.servers": bootstrap}
    if transactional:
        config["transactional.id"] = f"tx-{topic}"
    producer = Producer(config)
    if transactional:
        producer.init_transactions(30)
        producer.begin_transaction()
    for value in values:
        producer.produce(topic, value, partition=0)
    if transactional:
        producer.commit_transaction(30)
    assert producer.flush(30) == 0


def partition_of(bootstrap, topic):
    config = {
        "bootstrap.servers": bootstrap,
        "group.id": f"g-{topic}",
        "statistics.interval.ms": 1000,  # as the sources set it
        "log_level": 0,
    }
    return ObservedPartition(config, topic, 0, OFFSET_BEGINNING, Reading())


def read(partition, offsets, until, seconds=60.0):
    """Read into ``offsets`` until ``until()`` holds."""
    deadline = time.monotonic() + seconds
    while not until():
        assert time.monotonic() < deadline, f"read {len(offsets)} messages, stuck"
        offsets += [m.offset for m in partition.next_batch()]
        time.sleep(0.01)  # the worker's pace between empty batches


def rebuilds(topic):
    return INPUT_REBUILDS.labels(topic, "0")._value.get()


def as_if_still_for(partition, seconds):
    """The fetch position has not moved for ``seconds`` while the brokers answered; the
    watch asks the end now."""
    partition._still.moved_at = END_WATCH._since = time.monotonic() - seconds
    partition._still.look_at = time.monotonic()  # its next read looks
    END_WATCH.ask()


@pytest.mark.parametrize("transactional", [False, True])
def test_a_partition_with_nothing_more_to_read_is_never_rebuilt(kafka_bootstrap, transactional):
    topic = unique_topic("stall")
    create_topic(kafka_bootstrap, topic, 1)
    produce(kafka_bootstrap, topic, [b"%d" % i for i in range(10)], transactional)
    partition = partition_of(kafka_bootstrap, topic)
    try:
        offsets = []
        read(partition, offsets, lambda: len(offsets) == 10)
        end = 11 if transactional else 10  # the commit marker takes an offset
        read(partition, offsets, lambda: partition._still.fetching[0] == end)  # statistics came
        as_if_still_for(partition, STALL_S + 1)
        assert END_WATCH.end(topic, 0).offset == end
        for _ in range(5):
            assert partition.next_batch() == []
        assert rebuilds(topic) == 0 and offsets == list(range(10))
    finally:
        partition.close()
    assert END_WATCH.end(topic, 0) is None  # forgotten at close


def test_a_partition_whose_fetcher_stopped_is_rebuilt_and_reads_on(kafka_bootstrap):
    topic = unique_topic("stall")
    create_topic(kafka_bootstrap, topic, 1)
    produce(kafka_bootstrap, topic, [b"%d" % i for i in range(100)])
    partition = partition_of(kafka_bootstrap, topic)
    try:
        offsets = []
        read(partition, offsets, lambda: len(offsets) == 100)
        partition._consumer.pause([TopicPartition(topic, 0)])  # a fetcher that stopped
        produce(kafka_bootstrap, topic, [b"%d" % i for i in range(100, 150)])
        read(partition, offsets, lambda: partition._still.fetching[0] == 100)
        for _ in range(100):  # fetching nothing while the partition holds 50 more
            assert partition.next_batch() == []
        as_if_still_for(partition, STALL_S - 5)
        assert partition.next_batch() == [] and rebuilds(topic) == 0  # not still long enough
        as_if_still_for(partition, STALL_S + 1)
        partition._still.look_at -= 6.0  # the worker was held elsewhere: it did not read
        assert partition.next_batch() == [] and rebuilds(topic) == 0
        wedged = Wedged(partition._consumer)
        partition._consumer = wedged  # its close waits (seen: on its group's coordinator)
        as_if_still_for(partition, STALL_S + 1)
        read(partition, offsets, lambda: len(offsets) >= 150)  # the worker is not held
        assert offsets == list(range(150))  # from where it was: nothing skipped or twice
        assert rebuilds(topic) == 1
        assert wedged.closing.wait(10)  # closed aside
        wedged.release.set()
    finally:
        partition.close()


class Wedged:
    """A consumer whose close waits until released."""

    def __init__(self, consumer):
        self.consumer = consumer
        self.closing, self.release = threading.Event(), threading.Event()

    def __getattr__(self, name):
        return getattr(self.consumer, name)

    def close(self):
        self.closing.set()
        self.release.wait(60)
        self.consumer.close()


def test_a_stopped_fetcher_s_old_end_does_not_count_as_caught_up():
    """Stream time: expiry waits while the watch's end lies beyond the position, though
    the partition's own statistics (from a fetcher that stopped) say it read all."""
    config = {"bootstrap.servers": "127.0.0.1:9", "group.id": "test-stall", "log_level": 0}
    partition = ObservedPartition(config, "events", 0, 10, Reading())
    stats = {"topics": {"events": {"partitions": {"0": {"hi_offset": 10, "lo_offset": 0}}}}}
    try:
        assert partition._caught_up(stats) is True
        END_WATCH._ends[("events", 0)] = End(10 + 1001, time.monotonic())
        assert partition._caught_up(stats) is False
        END_WATCH._ends[("events", 0)] = End(10 + 1000, time.monotonic())  # a busy one's lag
        assert partition._caught_up(stats) is True
    finally:
        partition.close()


def test_the_watch_keeps_the_ends_it_had_when_an_ask_fails():
    answers = iter([[7], RuntimeError("brokers away")])  # then read again below

    def ask(config, parts):
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    watch = EndWatch(ask=ask, start=False)
    watch.watch("t", 0, {"bootstrap.servers": "b:9092", "stats_cb": print})
    watch.ask()
    with pytest.raises(RuntimeError):
        watch.ask()
    assert watch.end("t", 0).offset == 7
    answers = iter([[8], [9]])
    watch.ask()
    since = watch.end("t", 0).since  # the stillness counts from the brokers' return
    assert watch.end("t", 0) == End(8, since, since)
    watch.ask()
    assert watch.end("t", 0).offset == 9 and watch.end("t", 0).since == since
    watch.forget("t", 0)
    assert watch.end("t", 0) is None


@pytest.mark.parametrize(
    ("end", "position", "moved_at", "expected"),
    [
        (End(10, 100.0), 5, 100.0 - STALL_S, True),
        (End(10, 100.0), 5, 100.0 - STALL_S + 1, False),
        (End(10, 100.0), 10, 0.0, False),
        (End(10, 100.0), 11, 0.0, False),  # a position past the asked end (it grew since)
        (None, 5, 0.0, False),
        (End(10, 100.0, since=100.0 - STALL_S + 1), 5, 0.0, False),  # brokers just back
        (End(10, 100.0, since=100.0 - STALL_S), 5, 0.0, True),
    ],
)
def test_stalled_needs_an_end_beyond_the_position_and_a_long_enough_stillness(
    end, position, moved_at, expected
):
    assert stalled(end, position, moved_at) is expected
