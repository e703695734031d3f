"""Two Bytewax processes on loopback (-i/-a) give the single-process results.

Instances are partitioned by key across the workers of both processes; if an instance's
state were split or duplicated, its round counters and draws would differ from the
single-process run, and so would its weights.
"""

import random
import subprocess
import sys
from pathlib import Path

import orjson
from confluent_kafka import Producer

from flows.service.instances.registry import Registry
from flows.service.runtime.recovery import read_states
from flows.testing.kafka_broker import consume_all, create_topic, free_port, unique_topic
from tests.service.streams import (
    REGISTRY_TOML,
    REQUESTS,
    comparable,
    event_stream,
    reference_states,
    service_env,
    start_service,
)


def run_service(env, recovery, processes):
    """Run the service in `processes` processes until the end of the input; return the states."""
    recovery.mkdir()
    subprocess.run(
        [sys.executable, "-m", "bytewax.recovery", str(recovery), str(processes)], check=True
    )
    addresses = ";".join(f"127.0.0.1:{free_port()}" for _ in range(processes))
    procs = []
    for index in range(processes):
        cluster = ["-i", str(index), "-a", addresses] if processes > 1 else []
        procs.append(start_service(env, recovery, *cluster))
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err.decode()[-2000:]
    return read_states(recovery)


def selections(bootstrap, topic):
    return sorted(v for part in consume_all(bootstrap, topic).values() for _, v, _ in part)


def test_two_processes_equal_one_process(kafka_bootstrap, tmp_path):
    events_topic = create_topic(kafka_bootstrap, unique_topic("ev"), 4)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
    events = event_stream(random.Random(7))
    for key, value in events:
        producer.produce(events_topic, key=key, value=value)
    assert producer.flush(30) == 0
    (tmp_path / "registry.toml").write_text(REGISTRY_TOML)
    results = {}
    for processes in (1, 2):
        sel_topic = create_topic(kafka_bootstrap, unique_topic("sel"), 4)
        dlq_topic = create_topic(kafka_bootstrap, unique_topic("dlq"), 1)
        env = service_env(
            kafka_bootstrap,
            tmp_path / "registry.toml",
            events_topic,
            sel_topic,
            dlq_topic,
            TSI_STOP_AT_END="1",
            TSI_TOPIC_CHANGELOG=unique_topic("changelog"),  # each run's own
        )
        states = run_service(env, tmp_path / f"recovery-{processes}", processes)
        results[processes] = (
            {k: comparable(v) for k, v in states.items()},
            selections(kafka_bootstrap, sel_topic),
            [orjson.loads(v)["reason"] for _, v, _ in consume_all(kafka_bootstrap, dlq_topic)[0]],
        )
    expected = reference_states(Registry.from_toml(REGISTRY_TOML), events)
    assert results[1][0] == {k: comparable(v) for k, v in expected.items()}
    assert results[2] == results[1]
    assert len(results[2][1]) == REQUESTS and results[2][2] == ["malformed_json"]


def test_tsi_run_serves_a_topic_to_its_end_with_recovery(kafka_bootstrap, tmp_path):
    events_topic = create_topic(kafka_bootstrap, unique_topic("ev"), 2)
    sel_topic = create_topic(kafka_bootstrap, unique_topic("sel"), 2)
    dlq_topic = create_topic(kafka_bootstrap, unique_topic("dlq"), 1)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    events = event_stream(random.Random(5))[:200]
    for key, value in events:
        producer.produce(events_topic, key=key, value=value)
    assert producer.flush(30) == 0
    (tmp_path / "registry.toml").write_text(REGISTRY_TOML)
    tsi = Path(sys.executable).parent / "tsi"
    done = subprocess.run(
        [
            str(tsi),
            "run",
            "--registry",
            str(tmp_path / "registry.toml"),
            "--brokers",
            kafka_bootstrap,
            "--events-topic",
            events_topic,
            "--selections-topic",
            sel_topic,
            "--dlq-topic",
            dlq_topic,
            "--recovery-dir",
            str(tmp_path / "rec"),
            "--snapshot-every",
            "1",
            "--stop-at-end",
        ],
        capture_output=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    expected = reference_states(Registry.from_toml(REGISTRY_TOML), events)
    states = read_states(tmp_path / "rec")
    assert {k: comparable(v) for k, v in states.items()} == {
        k: comparable(v) for k, v in expected.items()
    }
    assert len(selections(kafka_bootstrap, sel_topic)) == 100
