"""Round-trip check against a running dev broker (see README.md).

Usage: python deploy/kafka/smoke.py [BOOTSTRAP]   (default: $KAFKA_BOOTSTRAP_SERVERS
or 127.0.0.1:19092). Creates a 4-partition topic (unless it exists), produces N messages
with delivery reports, consumes them back, and exits non-zero on any mismatch.
"""

import os
import sys
import time
import uuid

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

TOPIC = "tsi-smoke"
N = 1000


def main() -> int:
    bootstrap = (sys.argv[1:] or [os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092")])[0]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    if TOPIC not in admin.list_topics(timeout=10).topics:
        admin.create_topics([NewTopic(TOPIC, num_partitions=4, replication_factor=1)])[
            TOPIC
        ].result(timeout=30)
    parts = len(admin.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions)
    print(f"topic {TOPIC}: {parts} partitions")

    run = uuid.uuid4().hex  # tag this run's messages: the topic may hold older ones
    errors: list[str] = []
    delivered = 0

    def on_delivery(err, _msg) -> None:
        nonlocal delivered
        if err is not None:
            errors.append(str(err))
        else:
            delivered += 1

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    t0 = time.monotonic()
    for i in range(N):
        producer.produce(TOPIC, key=str(i), value=f"{run}:{i}", on_delivery=on_delivery)
        producer.poll(0)
    left = producer.flush(30)
    print(f"produced {delivered}/{N} in {time.monotonic() - t0:.2f}s, errors={len(errors)}")
    if left or errors or delivered != N:
        return 1

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"tsi-smoke-{run}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([TOPIC])
    seen: set[str] = set()
    t0 = time.monotonic()
    deadline = t0 + 60
    while len(seen) < N and time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is None:
            continue
        if msg.error():
            raise KafkaException(msg.error())
        value = msg.value().decode()
        if value.startswith(run):
            seen.add(value)
    consumer.close()
    print(f"consumed {len(seen)}/{N} in {time.monotonic() - t0:.2f}s")
    return 0 if len(seen) == N else 1


if __name__ == "__main__":
    sys.exit(main())
