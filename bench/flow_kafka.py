"""Kafka for the flow benchmarks: the broker, fresh topics, bulk producing, counting a
topic's messages and reading its answers' timestamps.

The broker is ``$KAFKA_BOOTSTRAP_SERVERS`` when set, otherwise the project's single-node
broker (``deploy/kafka``), started into a temp dir with ``flows/testing/kafka_broker.py``'s
``start_broker`` and stopped at the end.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from flows.testing import kafka_broker

PARTITIONS = 3


def log(msg: str) -> None:
    print(f"[bench_flow {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------ broker


@dataclass
class Broker:
    bootstrap: str
    pid: int | None  # None: an external broker (its CPU is not measured)
    started_here: bool

    def cpu_seconds(self) -> float | None:
        if self.pid is None:
            return None
        try:
            t = psutil.Process(self.pid).cpu_times()
        except psutil.Error:
            return None
        return t.user + t.system


@contextlib.contextmanager
def broker() -> Iterator[Broker]:
    kb = kafka_broker
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if external:
        yield Broker(external, None, False)
        return
    with tempfile.TemporaryDirectory(prefix="tsi-bench-kafka-") as tmp:
        data_dir = Path(tmp)
        log("starting the project's Kafka broker (deploy/kafka/start.sh)")
        bootstrap = kb.start_broker(data_dir)
        try:
            pid = int((data_dir / "broker.pid").read_text().strip())
        except (OSError, ValueError):
            pid = None
        try:
            yield Broker(bootstrap, pid, True)
        finally:
            log("stopping the broker")
            kb.stop_broker(data_dir)


def new_topics(bootstrap: str, kinds: Iterable[str]) -> dict[str, str]:
    """Fresh topics; ``dlq`` has one partition, the others PARTITIONS."""
    kb = kafka_broker
    names = {}
    for kind in kinds:
        name = kb.unique_topic(f"bench-{kind}")
        kb.create_topic(bootstrap, name, 1 if kind == "dlq" else PARTITIONS)
        names[kind] = name
    return names


def bulk_producer(bootstrap: str) -> Producer:
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,  # keeps the order of a key's messages
            "linger.ms": 20,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 2_000_000,
        }
    )


def produce_all(producer: Producer, messages: Iterable[tuple[str, str, bytes]]) -> int:
    """Produce (topic, key, value) messages and wait for every acknowledgement."""
    n = 0
    for topic, key, value in messages:
        while True:
            try:
                producer.produce(topic, key=key, value=value)
                break
            except BufferError:
                producer.poll(0.05)
        n += 1
        if n % 10_000 == 0:
            producer.poll(0)
    left = producer.flush(120)
    if left:
        raise RuntimeError(f"{left} messages not acknowledged by the broker")
    return n


class Counter:
    """Number of messages in a topic (sum of high watermarks; fresh topics start at 0)."""

    def __init__(self, bootstrap: str) -> None:
        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "tsi-bench"})

    def count(self, topic: str, partitions: int = PARTITIONS) -> int:
        total = 0
        for p in range(partitions):
            lo, hi = self._consumer.get_watermark_offsets(
                TopicPartition(topic, p), timeout=10, cached=False
            )
            total += hi - lo
        return total

    def close(self) -> None:
        self._consumer.close()


def answer_times(bootstrap: str, topic: str, n: int) -> tuple[float, float]:
    """The earliest and latest Kafka timestamps (s) of the first ``n`` messages of
    ``topic``."""
    consumer = topic_reader(bootstrap, topic)
    stamps: list[int] = []
    try:
        while len(stamps) < n:
            stamps += [m.timestamp()[1] for m in consumer.consume(10_000, 1.0) if not m.error()]
    finally:
        consumer.close()
    return min(stamps) / 1000.0, max(stamps) / 1000.0


def topic_reader(bootstrap: str, topic: str) -> Consumer:
    """A consumer of every partition of ``topic`` from its start, in no group's name."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "tsi-bench-unused",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    return consumer
