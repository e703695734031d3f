"""``/ready`` after a start means every shard is restored: ``tsi run`` with the defaults
(``tsi topics create``'s 128 shards, recovery and the changelog on) on the project's real
broker serves instances, stops, restarts on its directory and, with it deleted, again:
at the first 200 of each restart every held shard is restored and every instance held,
before any new event, and a request after the restart is served from the restored
state (its instance's next round)."""

import json
import shutil

import orjson
from confluent_kafka import Producer

from flows.testing.kafka_broker import consume_all, free_port, unique_topic
from flows.testing.service_run import (
    create_topics,
    environment,
    gauges,
    start,
    stop,
    wait_ready,
    wait_served,
)

REGISTRY = '[experiments.e]\narms = ["a", "b"]\nper_unit = true\nfeedback_ttl = 3600\n'
UNITS = 300
TIMEOUT = 180.0
COUNTS = ("tsi_shards_restored", "tsi_shards_held", "tsi_instances")
ALL = {"tsi_shards_restored": 128, "tsi_shards_held": 128, "tsi_instances": UNITS}


def request(topic, bootstrap, units, request_id=None):
    producer = Producer({"bootstrap.servers": bootstrap})
    for unit in units:
        body = {"experiment": "e", "unit": unit, "request_id": request_id or unit}
        producer.produce(topic, key=f"e\x1f{unit}", value=json.dumps(body))
    assert producer.flush(60) == 0


def rounds(bootstrap, topic, request_id):
    """The rounds of the answers to ``request_id`` on the selections topic."""
    found = []
    for part in consume_all(bootstrap, topic, timeout=5).values():
        for _, value, _ in part:
            answer = orjson.loads(value)
            if answer["request_id"] == request_id:
                found.append(answer["round"])
    return found


def ready_counts(env, recovery):
    """A start: the counts at its first 200, the 503 reasons before, the process and its
    metrics port."""
    port = free_port()
    process = start(env, recovery, port)
    try:
        _, reasons = wait_ready(process, port, TIMEOUT)
        return gauges(port, *COUNTS), reasons, process, port
    except BaseException:
        process.kill()
        raise


def test_ready_only_once_every_shard_is_restored_after_a_restart_and_a_lost_directory(
    kafka_bootstrap, tmp_path
):
    registry = tmp_path / "registry.toml"
    registry.write_text(REGISTRY)
    env = environment(kafka_bootstrap, unique_topic("startup"), registry, TSI_SNAPSHOT_EVERY="1")
    create_topics(env)
    recovery, units = tmp_path / "recovery", [f"u{i}" for i in range(UNITS)]
    _, _, process, port = ready_counts(env, recovery)
    try:
        request(env["TSI_TOPIC_REQUESTS"], kafka_bootstrap, units)
        wait_served(process, port, UNITS, TIMEOUT)
    finally:
        stop(process)
    counts, reasons, process, port = ready_counts(env, recovery)  # a restart with its state
    try:
        assert counts == ALL
        assert all(r.startswith("not ready: ") for r in reasons)
        request(env["TSI_TOPIC_REQUESTS"], kafka_bootstrap, ["u7"], "again")
        selections = env["TSI_TOPIC_SELECTIONS"]
        wait_served(process, port, UNITS, TIMEOUT)  # an epoch after it
        assert rounds(kafka_bootstrap, selections, "again") == [2]  # u7's second round
    finally:
        stop(process)
    shutil.rmtree(recovery)
    counts, _, process, _ = ready_counts(env, recovery)  # the directory lost
    stop(process)
    assert counts == ALL
