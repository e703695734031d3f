"""The serving dataflow on a real Kafka broker (started by the project, see conftest.py)."""

import orjson
from bytewax.testing import run_main
from confluent_kafka import Producer

from flows.service.connectors.memory import memory_wiring
from flows.service.connectors.topics import Topics
from flows.service.dataflow import build_flow
from flows.service.instances.registry import Registry
from flows.service.runtime.process import Service
from flows.service.wire.events import Origin
from flows.testing.kafka_broker import consume_all, create_topic, unique_topic

REGISTRY = Registry.from_toml(
    """
[experiments.shop]
arms = ["a", "b", "c", "d"]
per_unit = true
seed = 11
"""
)


def produce(bootstrap, topic, messages):
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for key, value in messages:
        producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0


def topics(bootstrap, partitions=3):
    names = Topics(*(unique_topic(n) for n in ("rq", "fb", "sel", "dlq")))
    for name in (names.requests, names.feedback, names.selections):
        create_topic(bootstrap, name, partitions)
    create_topic(bootstrap, names.dead_letters, 1)
    return names


def request(i):
    unit = f"user{i % 7}"
    return (
        f"shop\x1f{unit}",
        orjson.dumps({"experiment": "shop", "unit": unit, "request_id": f"r{i}"}),
    )


def test_requests_are_answered_on_kafka_exactly_as_in_memory(kafka_bootstrap):
    names = topics(kafka_bootstrap)
    requests = [request(i) for i in range(60)]
    produce(kafka_bootstrap, names.requests, requests)
    run_main(Service(REGISTRY, [kafka_bootstrap], names).flow(tail=False))
    on_kafka = {
        (k.decode(), v)
        for part in consume_all(kafka_bootstrap, names.selections).values()
        for k, v, _ in part
    }
    selections, dead = [], []
    memory = memory_wiring(
        [(v, Origin("rq", 0, i)) for i, (_, v) in enumerate(requests)], [], selections, dead
    )
    run_main(build_flow(REGISTRY, memory))
    assert on_kafka == set(selections) and len(on_kafka) == 60 and dead == []


def test_feedback_and_every_bad_input_reach_the_dead_letter_topic_with_origin(kafka_bootstrap):
    names = topics(kafka_bootstrap)
    produce(
        kafka_bootstrap,
        names.requests,
        [request(i) for i in range(10)]
        + [
            ("x", b"{not json"),
            ("x", orjson.dumps({"experiment": "nope", "request_id": "z"})),
            ("x", orjson.dumps({"experiment": "shop", "request_id": "no-unit"})),
            ("x", b"x" * 70_000),
        ],
    )
    feedback = [
        (
            k,
            orjson.dumps(
                {
                    "experiment": "shop",
                    "unit": f"user{i % 7}",
                    "request_id": f"r{i}",
                    "loss": float(i),
                }
            ),
        )
        for i, (k, _) in enumerate(request(i) for i in range(10))
    ]
    bad_feedback = [
        (feedback[0][0], feedback[0][1]),  # duplicate (or early duplicate)
        (
            "x",
            orjson.dumps(
                {"experiment": "shop", "unit": "user1", "request_id": "r1", "loss": 1e305}
            ),
        ),
    ]
    produce(kafka_bootstrap, names.feedback, feedback + bad_feedback)
    run_main(Service(REGISTRY, [kafka_bootstrap], names).flow(tail=False))
    selections = [
        orjson.loads(v)
        for part in consume_all(kafka_bootstrap, names.selections).values()
        for _, v, _ in part
    ]
    assert sorted(s["request_id"] for s in selections) == sorted(f"r{i}" for i in range(10))
    dead = [orjson.loads(v) for _, v, _ in consume_all(kafka_bootstrap, names.dead_letters)[0]]
    reasons = sorted(d["reason"] for d in dead)
    assert reasons == sorted(
        [
            "malformed_json",
            "unknown_experiment",
            "missing_field",
            "oversize",
            "duplicate_feedback",
            "loss_out_of_range",
        ]
    )
    for d in dead:  # every dead letter says where its message came from
        assert d["source"] in (names.requests, names.feedback)
        assert d["partition"] is not None and d["offset"] is not None
