"""The recovery directory is a cache: the service, mirroring its shards to a changelog
topic, stopped or killed -9 under load and restarted with its recovery directory deleted,
(and what it had consumed of its input deleted, as retention would) ends with the
state of an uninterrupted run, every request answered once (re-emitted
answers identical) and no feedback lost or applied twice; a changelog partition that does
not read back is a ``state_lost`` dead letter for its shard, and the service serves on.

The service runs as a real process (``python -m bytewax.run flows.service.main:flow``) on
the project's Kafka broker, reading one combined events topic (``tests.service.streams``).
"""

import random
import shutil
import signal
import subprocess
import sys
import threading
import time

import orjson
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from flows.service.connectors.kafka_admin import create_topics, group_offsets
from flows.service.connectors.kafka_changelog import KafkaChangelog
from flows.service.instances.registry import Registry
from flows.service.instances.resting import state_of
from flows.service.runtime.recovery import read_states
from flows.service.runtime.settings import DEFAULT_GROUP
from flows.service.shards.changelog import MARKER_KEY, replay
from flows.service.wire.keys import DEFAULT_SHARDS, shard_names, shard_of
from flows.testing.kafka_broker import consume_all, create_topic, unique_topic
from tests.service.streams import (
    REGISTRY_TOML,
    assert_served_once_each,
    comparable,
    event_stream,
    reference_states,
    service_env,
    start_service,
)
from tests.service.test_two_topics import REGISTRY as TWO_TOPIC_REGISTRY
from tests.service.test_two_topics import REQUESTS, Clients, two_topic_env


def forget_consumed(bootstrap, topic):
    """Delete what the service's consumer group has consumed of ``topic`` (as retention
    does): a directory lost now can only come back from the changelog. The messages gone."""
    offsets = group_offsets([bootstrap], {}, DEFAULT_GROUP, [topic], 30.0)
    cuts = [TopicPartition(t, p, o) for (t, p), o in offsets.items() if o > 0]
    if cuts:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for future in admin.delete_records(cuts).values():
            future.result(30)
    return sum(cut.offset for cut in cuts)


def fresh_directory(recovery):
    """The recovery directory deleted, and a new one initialised (as a new volume is)."""
    shutil.rmtree(recovery, ignore_errors=True)
    recovery.mkdir()
    subprocess.run([sys.executable, "-m", "bytewax.recovery", str(recovery), "1"], check=True)


def changelog_states(bootstrap, topic):
    """{key: Instance.to_dict()} the changelog holds as of each shard's last marker (its
    partitions are the flow's shards)."""
    changelog, states = KafkaChangelog([bootstrap], topic), {}
    listed = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=30)
    for shard in shard_names(len(listed.topics[topic].partitions)):
        found = replay(changelog.read(shard))
        states.update((key, state_of(entry)) for key, entry in found.entries.items())
    return states


def test_a_deleted_recovery_directory_loses_nothing_whatever_the_workers(kafka_bootstrap, tmp_path):
    rng = random.Random(43)
    events_topic, sel_topic, dlq_topic = (unique_topic(n) for n in ("ev", "sel", "dlq"))
    changelog = unique_topic("changelog")
    create_topic(kafka_bootstrap, events_topic, 3)
    create_topic(kafka_bootstrap, sel_topic, 3)
    create_topic(kafka_bootstrap, dlq_topic, 1)
    create_topics([kafka_bootstrap], {}, [changelog], changelog=(changelog, DEFAULT_SHARDS))
    registry_path = tmp_path / "registry.toml"
    registry_path.write_text(REGISTRY_TOML)
    recovery = tmp_path / "recovery"
    fresh_directory(recovery)
    env = service_env(
        kafka_bootstrap,
        registry_path,
        events_topic,
        sel_topic,
        dlq_topic,
        TSI_TOPIC_CHANGELOG=changelog,
    )
    events = event_stream(rng)

    def produce_slowly():  # the stream keeps flowing while the service is down
        producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
        for start_at in range(0, len(events), 40):
            for key, value in events[start_at : start_at + 40]:
                producer.produce(events_topic, key=key, value=value)
            if producer.flush(30) or stop.is_set():
                return
            time.sleep(0.25)

    producer = threading.Thread(target=produce_slowly, daemon=True)
    stop = threading.Event()
    producer.start()
    ends, deleted, forgotten = [], 0, 0
    try:
        while producer.is_alive() or len(ends) < 4:
            workers = str(1 + len(ends) % 2)  # each restart with another number of workers
            proc = start_service(env, recovery, "-w", workers)
            time.sleep(rng.uniform(2.0, 4.0))
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            how = signal.SIGKILL if len(ends) % 2 else signal.SIGTERM  # stopped, or killed
            proc.send_signal(how)
            proc.wait(timeout=60)
            ends.append(how)
            if len(ends) % 3 != 0:  # two ends in three lose the directory
                forgotten = forget_consumed(kafka_bootstrap, events_topic)
                fresh_directory(recovery)
                deleted += 1
    finally:
        stop.set()
    producer.join()
    expected = reference_states(Registry.from_toml(REGISTRY_TOML), events)
    want = {k: comparable(v) for k, v in expected.items()}
    forgotten = forget_consumed(kafka_bootstrap, events_topic)
    fresh_directory(recovery)  # the last run too starts from the changelog alone
    proc = start_service(env, recovery, "-w", "2" if workers == "1" else "1")  # another
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            time.sleep(1.0)
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            if {
                k: comparable(v) for k, v in changelog_states(kafka_bootstrap, changelog).items()
            } == want:
                break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    held = changelog_states(kafka_bootstrap, changelog)
    assert set(held) == set(expected)
    for key, state in expected.items():  # weights, ψ, V, D, counters, tickets: all equal
        assert comparable(held[key]) == comparable(state), key
    local = read_states(recovery)  # what the last run's shards rebuilt and snapshotted
    assert all(comparable(local[k]) == want[k] for k in local)
    assert_served_once_each(kafka_bootstrap, sel_topic, dlq_topic)
    assert deleted >= 3 and forgotten > 0 and signal.SIGKILL in ends and signal.SIGTERM in ends


def test_a_changelog_that_does_not_read_back_is_a_dead_letter_and_the_service_serves_on(
    kafka_bootstrap, tmp_path
):
    events_topic, sel_topic, dlq_topic = (unique_topic(n) for n in ("ev", "sel", "dlq"))
    changelog = unique_topic("changelog")
    for topic in (events_topic, sel_topic, dlq_topic):
        create_topic(kafka_bootstrap, topic, 1)
    create_topics([kafka_bootstrap], {}, [changelog], changelog=(changelog, DEFAULT_SHARDS))
    key = "shop\x1fu1"
    damaged = int(shard_of(key)[6:9])
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    producer.produce(changelog, b"not a record", MARKER_KEY.encode(), damaged)
    request = {"type": "request", "experiment": "shop", "unit": "u1", "request_id": "r1"}
    producer.produce(events_topic, orjson.dumps(request), key.encode())
    assert producer.flush(30) == 0
    registry_path = tmp_path / "registry.toml"
    registry_path.write_text(REGISTRY_TOML)
    recovery = tmp_path / "recovery"
    fresh_directory(recovery)
    env = service_env(
        kafka_bootstrap,
        registry_path,
        events_topic,
        sel_topic,
        dlq_topic,
        TSI_TOPIC_CHANGELOG=changelog,
    )
    proc = start_service(env, recovery)
    try:
        deadline = time.monotonic() + 90
        answers = letters = []
        while time.monotonic() < deadline and not (answers and letters):
            time.sleep(1.0)
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            answers = consume_all(kafka_bootstrap, sel_topic, timeout=5)[0]
            letters = consume_all(kafka_bootstrap, dlq_topic, timeout=5)[0]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    [answer] = answers
    assert orjson.loads(answer[1])["request_id"] == "r1"  # served on, from an empty shard
    [letter] = [orjson.loads(value) for _, value, _ in letters]
    assert letter["reason"] == "state_lost" and "changelog cannot be read" in letter["detail"]


def test_two_topics_lose_their_directory_and_nothing_else(kafka_bootstrap, tmp_path):
    """The default setup (requests and feedback copied into the internal topic), killed -9
    under clients that retry and echo their arm, its directory and its consumed input
    (the internal topic's too) deleted two ends in three: no answer changes, no feedback
    is refused, every feedback is applied once."""
    topics = {n: unique_topic(n) for n in ("requests", "feedback", "sel", "dlq", "internal")}
    for name, topic in topics.items():
        create_topic(kafka_bootstrap, topic, 1 if name == "dlq" else 2)
    changelog = unique_topic("changelog")
    create_topics([kafka_bootstrap], {}, [changelog], changelog=(changelog, DEFAULT_SHARDS))
    (tmp_path / "registry.toml").write_text(TWO_TOPIC_REGISTRY)
    recovery = tmp_path / "recovery"
    fresh_directory(recovery)
    env = {
        **two_topic_env(kafka_bootstrap, tmp_path / "registry.toml", topics),
        "TSI_TOPIC_CHANGELOG": changelog,
    }
    clients = Clients(kafka_bootstrap, topics)
    threads = [threading.Thread(target=f, daemon=True) for f in (clients.ask, clients.answer)]
    for thread in threads:
        thread.start()
    rng, kills, forgotten = random.Random(4), 0, 0
    read = [topics[n] for n in ("requests", "feedback", "internal")]
    try:
        while threads[0].is_alive() or kills < 5:
            proc = start_service(env, recovery)
            time.sleep(rng.uniform(2.5, 4.5))
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills += 1
            if kills % 3:
                forgotten += sum(forget_consumed(kafka_bootstrap, topic) for topic in read)
                fresh_directory(recovery)
        proc = start_service(env, recovery)  # the last run: everything answered and applied
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            time.sleep(1.0)
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            with clients.lock:
                answered = len(clients.answers)
            states = changelog_states(kafka_bootstrap, changelog) if answered == REQUESTS else {}
            settled = sum(len(s["settled"]) for s in states.values())
            if answered == REQUESTS and settled == REQUESTS:
                break
    finally:
        clients.stop.set()
        for thread in threads:
            thread.join()
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    assert kills >= 5 and forgotten > 0
    changed = {rid: seen for rid, seen in clients.answers.items() if len(seen) > 1}
    assert changed == {}  # every re-emitted or retried answer is the first one
    assert len(clients.answers) == REQUESTS
    letters = [orjson.loads(v) for _, v, _ in consume_all(kafka_bootstrap, topics["dlq"])[0]]
    assert letters == []  # no feedback refused (arm_mismatch, duplicate, unknown, ...)
    states = changelog_states(kafka_bootstrap, changelog)
    assert sum(s["bandit"]["n_updates"] for s in states.values()) == REQUESTS  # once each
    assert sum(len(s["open"]) + len(s["early"]) for s in states.values()) == 0


def test_incarnations_killed_before_their_first_snapshot_lose_nothing(kafka_bootstrap, tmp_path):
    """The first three runs each serve, then are killed -9 before their first snapshot (the
    directory never holds an epoch); the fourth snapshots every second while the rest of
    the stream arrives and is killed -9 mid-stream; its directory is lost; the fifth ends
    as an uninterrupted run, every answer the same."""
    events_topic, sel_topic, dlq_topic = (unique_topic(n) for n in ("ev", "sel", "dlq"))
    changelog = unique_topic("changelog")
    for topic, partitions in ((events_topic, 3), (sel_topic, 3), (dlq_topic, 1)):
        create_topic(kafka_bootstrap, topic, partitions)
    registry_path = tmp_path / "registry.toml"
    registry_path.write_text(REGISTRY_TOML)
    recovery = tmp_path / "recovery"
    fresh_directory(recovery)
    env = service_env(
        kafka_bootstrap, registry_path, events_topic, sel_topic, dlq_topic,
        TSI_TOPIC_CHANGELOG=changelog,
    )  # fmt: skip
    events = event_stream(random.Random(61))
    half = len(events) // 2
    produce_events(kafka_bootstrap, events_topic, events[:half])
    answered = 0
    for _ in range(3):
        proc = start_service(env, recovery, "-s", "600")  # no snapshot before the kill
        answered = killed_after_answers(proc, kafka_bootstrap, sel_topic, answered)
    proc = start_service(env, recovery)  # a snapshot every second
    later = threading.Thread(
        target=produce_events, args=(kafka_bootstrap, events_topic, events[half:], 0.05)
    )
    later.start()
    killed_after_answers(proc, kafka_bootstrap, sel_topic, answered + 40)
    later.join()
    fresh_directory(recovery)
    registry = Registry.from_toml(REGISTRY_TOML)
    want = {k: comparable(v) for k, v in reference_states(registry, events).items()}
    proc = start_service(env, recovery)
    try:
        deadline = time.monotonic() + 180
        while comparable_states(kafka_bootstrap, changelog) != want:
            assert time.monotonic() < deadline, "the state never became the uninterrupted run's"
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            time.sleep(1.0)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert_served_once_each(kafka_bootstrap, sel_topic, dlq_topic)


def produce_events(bootstrap, topic, events, pause=0.0):
    """``events`` written to ``topic`` in order, 20 at a time ``pause`` seconds apart."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for start_at in range(0, len(events), 20):
        for key, value in events[start_at : start_at + 20]:
            producer.produce(topic, key=key, value=value)
        assert producer.flush(30) == 0
        time.sleep(pause)


def killed_after_answers(proc, bootstrap, topic, answered):
    """Kill -9 ``proc`` once ``topic`` holds more than ``answered`` selections; how many."""
    try:
        deadline = time.monotonic() + 120
        while selections(bootstrap, topic) <= answered:
            assert time.monotonic() < deadline, "no new answer from this run"
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    return selections(bootstrap, topic)


def selections(bootstrap, topic):
    """How many selections ``topic`` holds."""
    return sum(map(len, consume_all(bootstrap, topic, timeout=5).values()))


def comparable_states(bootstrap, changelog):
    """The changelog's states, each in the form two runs' states compare in."""
    return {k: comparable(v) for k, v in changelog_states(bootstrap, changelog).items()}
