"""A lost recovery directory costs a changelog read, not a re-read of the inputs: the
service (requests and feedback copied into the internal topic, the default setup), after
a long input, is killed -9, its directory deleted, and restarted: its shards come back
from the changelog and its inputs and internal topic resume at the consumer group's
committed offsets, so it reads again a small part of what it had read; then the input
goes on. The state equals the uninterrupted run's, every request is answered, and every
feedback is applied once (none refused, none twice).

The service runs as a real process (``python -m bytewax.run flows.service.main:flow``) on
the project's Kafka broker.
"""

import re
import signal
import subprocess
import sys

import orjson
from confluent_kafka import Consumer, Producer, TopicPartition

from flows.service.instances.registry import Registry
from flows.service.runtime.settings import DEFAULT_GROUP
from flows.testing.kafka_broker import consume_all, create_topic, unique_topic
from tests.service.streams import REGISTRY_TOML, comparable, reference_states
from tests.service.test_changelog_recovery import changelog_states, fresh_directory
from tests.service.test_two_topics import two_topic_env
from tests.waiting import wait_for

UNITS = 40
FIRST = 10_000  # requests (and as many feedback) before the directory is lost
THEN = 400  # after the restart


def pairs(start, count):
    """(requests, feedback) as (key, bytes), request ``start`` onwards."""
    requests, feedback = [], []
    for i in range(start, start + count):
        unit = f"u{i % UNITS}"
        key = f"shop\x1f{unit}"
        request = {"type": "request", "experiment": "shop", "unit": unit, "request_id": f"r{i}"}
        requests.append((key, orjson.dumps(request)))
        loss = {**request, "type": "feedback", "loss": float(i % 3)}
        feedback.append((key, orjson.dumps(loss)))
    return requests, feedback


def produce(bootstrap, topic, events):
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for key, value in events:
        producer.produce(topic, key=key.encode(), value=value)
    assert producer.flush(60) == 0


def answered(bootstrap, topic):
    """The request ids answered so far (each answer's bytes, by request id)."""
    seen = {}
    for part in consume_all(bootstrap, topic, timeout=5).values():
        for _, value, _ in part:
            seen.setdefault(orjson.loads(value)["request_id"], set()).add(value)
    return seen


def ends(bootstrap, topics):
    """{(topic, partition): high watermark} of every partition of ``topics``."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "tsi-test-ends"})
    try:
        known = consumer.list_topics(timeout=30).topics
        return {
            (t, p): consumer.get_watermark_offsets(TopicPartition(t, p), timeout=30)[1]
            for t in topics
            for p in known[t].partitions
        }
    finally:
        consumer.close()


def committed(bootstrap, topics):
    from flows.service.connectors.kafka_admin import group_offsets

    return group_offsets([bootstrap], {}, DEFAULT_GROUP, topics, 30.0)


def caught_up(bootstrap, topics):
    """Whether the group committed every partition of ``topics`` at its end (the inputs'
    copies are in the internal topic before the inputs' offsets are committed)."""
    return committed(bootstrap, topics) == ends(bootstrap, topics)


def start(env, recovery, log):
    cmd = [sys.executable, "-m", "bytewax.run", "flows.service.main:flow", "-r", str(recovery)]
    cmd += ["-s", "1", "-b", "0"]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log)


def test_a_lost_directory_resumes_at_the_groups_offsets_and_reads_little_again(
    kafka_bootstrap, tmp_path
):
    topics = {n: unique_topic(n) for n in ("requests", "feedback", "sel", "dlq", "internal")}
    for name, topic in topics.items():
        create_topic(kafka_bootstrap, topic, 1 if name == "dlq" else 2)
    registry = tmp_path / "registry.toml"
    registry.write_text(REGISTRY_TOML)
    recovery = tmp_path / "recovery"
    fresh_directory(recovery)
    changelog = unique_topic("changelog")  # created by the service as it starts
    env = {**two_topic_env(kafka_bootstrap, registry, topics), "TSI_TOPIC_CHANGELOG": changelog}
    read = [topics[n] for n in ("requests", "feedback", "internal")]
    requests, feedback = pairs(0, FIRST)
    later_requests, later_feedback = pairs(FIRST, THEN)
    sel = topics["sel"]

    with open(tmp_path / "first.log", "wb") as log:
        proc = start(env, recovery, log)
        try:
            produce(kafka_bootstrap, topics["requests"], requests)
            wait_for(lambda: len(answered(kafka_bootstrap, sel)) == FIRST, proc, 240, "the answers")
            produce(kafka_bootstrap, topics["feedback"], feedback)
            wait_for(  # every input and copy read, and its epoch committed
                lambda: caught_up(kafka_bootstrap, read),
                proc,
                240,
                "the group's commits at the ends",
            )
            input_ends = ends(kafka_bootstrap, read)
            assert proc.poll() is None
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    total = sum(input_ends.values())  # what the first run read: inputs and copies
    fresh_directory(recovery)  # the directory lost: only the changelog holds the shards

    with open(tmp_path / "second.log", "wb") as log:
        proc = start(env, recovery, log)
        try:
            wait_for(
                lambda: "committed offsets" in (tmp_path / "second.log").read_text(),
                proc,
                240,
                "the resume",
            )
            produce(kafka_bootstrap, topics["requests"], later_requests)
            wait_for(
                lambda: len(answered(kafka_bootstrap, sel)) == FIRST + THEN,
                proc,
                240,
                "the answers",
            )
            produce(kafka_bootstrap, topics["feedback"], later_feedback)
            wait_for(lambda: caught_up(kafka_bootstrap, read), proc, 240, "the last commits")
            assert proc.poll() is None
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()

    said = (tmp_path / "second.log").read_text()
    [where] = re.findall(r"committed offsets \((.*?); partitions without", said)
    resumed = {}
    for item in where.split(", "):
        topic, partition, offset = re.fullmatch(r"(.+)\[(\d+)\]@(\d+)", item).groups()
        resumed[(topic, int(partition))] = int(offset)
    assert set(resumed) == set(input_ends)  # every partition read resumes at a commit
    again = sum(input_ends[tp] - offset for tp, offset in resumed.items())
    assert 0 <= again < total / 10, (again, total)  # read again: far less than all of it

    expected = reference_states(
        Registry.from_toml(REGISTRY_TOML),
        requests + feedback + later_requests + later_feedback,
    )
    held = changelog_states(kafka_bootstrap, changelog)
    assert set(held) == set(expected)
    for key, state in expected.items():  # weights, counters, tickets: all equal
        assert comparable(held[key]) == comparable(state), key
    applied = sum(s["bandit"]["n_updates"] for s in held.values())
    assert applied == FIRST + THEN  # every feedback applied once
    answers = answered(kafka_bootstrap, sel)
    assert len(answers) == FIRST + THEN and all(len(a) == 1 for a in answers.values())
    assert consume_all(kafka_bootstrap, topics["dlq"])[0] == []  # none refused
