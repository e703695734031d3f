"""Partitions added to the answer topics after a client connected are read, on the real
broker: a selection and a dead letter written to a new partition reach the call waiting."""

import base64
import time
from concurrent.futures import ThreadPoolExecutor

import orjson
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions

from flows.client import ClientSettings, DeadLetterError, Decider, connection
from flows.service.connectors.topics import Topics
from flows.testing.kafka_broker import create_topic, unique_topic


def grow(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_partitions([NewPartitions(topic, partitions)])[topic].result(30)


def test_answers_on_partitions_added_after_connecting_are_read(kafka_bootstrap, monkeypatch):
    monkeypatch.setattr(connection, "PARTITION_REFRESH", 0.2)
    names = {kind: create_topic(kafka_bootstrap, unique_topic(kind), 1) for kind in "esd"}
    topics = Topics(events=names["e"], selections=names["s"], dead_letters=names["d"])
    settings = ClientSettings(brokers=kafka_bootstrap, topics=topics, timeout=20)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    with Decider(settings) as decider, ThreadPoolExecutor(2) as pool:
        for topic in (names["s"], names["d"]):
            grow(kafka_bootstrap, topic, 3)
        answered = pool.submit(decider.decide, "shop", request_id="new-sel")
        refused = pool.submit(decider.decide, "shop", request_id="new-dlq")
        time.sleep(0.5)  # both waiting
        selection = {
            "experiment": "shop", "unit": None, "request_id": "new-sel", "arm": 1,
            "arm_name": "b", "prob": 0.5, "round": 7, "why": "bandit",
        }  # fmt: skip
        raw = orjson.dumps({"experiment": "shop", "request_id": "new-dlq"})
        letter = {"raw_b64": base64.b64encode(raw).decode(), "reason": "r", "detail": "d"}
        producer.produce(names["s"], orjson.dumps(selection), partition=2)
        producer.produce(names["d"], orjson.dumps(letter), partition=2)
        assert producer.flush(30) == 0
        decision = answered.result(30)
        assert (decision.request_id, decision.arm_name, decision.round) == ("new-sel", "b", 7)
        with pytest.raises(DeadLetterError) as dead:
            refused.result(30)
        assert (dead.value.request_id, dead.value.reason) == ("new-dlq", "r")
