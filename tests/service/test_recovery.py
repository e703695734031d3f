"""kill -9 and restart with recovery: the state and the answers of an uninterrupted run.

The service runs as a real process (`python -m bytewax.run flows.service.main:flow`) on the
project's Kafka broker, reading one combined events topic: requests and feedback of an
instance share a partition, so every run sees an instance's events in the same order.
"""

import random
import signal
import subprocess
import sys
import threading
import time

import orjson
from confluent_kafka import Producer

from flows.service.instances.registry import Registry
from flows.service.runtime.recovery import read_states
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
from tests.service.test_operating import tsi


def kill_repeatedly(env, recovery, rng, producer):
    """Start the service and kill -9 it mid-run, until the stream is in and 3 kills done."""
    kills = 0
    while producer.is_alive() or kills < 3:
        proc = start_service(env, recovery)
        time.sleep(rng.uniform(1.5, 4.0))  # deliberate: a kill at a random point
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]  # killed mid-run
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
    return kills


def test_kill_9_at_random_points_then_restart_equals_an_uninterrupted_run(
    kafka_bootstrap, tmp_path
):
    rng = random.Random(2026)
    events_topic, sel_topic, dlq_topic = (unique_topic(n) for n in ("ev", "sel", "dlq"))
    create_topic(kafka_bootstrap, events_topic, 3)
    create_topic(kafka_bootstrap, sel_topic, 3)
    create_topic(kafka_bootstrap, dlq_topic, 1)
    registry_path = tmp_path / "registry.toml"
    registry_path.write_text(REGISTRY_TOML)
    recovery = tmp_path / "recovery"
    recovery.mkdir()
    subprocess.run([sys.executable, "-m", "bytewax.recovery", str(recovery), "1"], check=True)
    env = service_env(kafka_bootstrap, registry_path, events_topic, sel_topic, dlq_topic)
    events = event_stream(rng)

    def produce_slowly():  # the stream keeps flowing while the service is killed
        producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
        for start_at in range(0, len(events), 40):
            for key, value in events[start_at : start_at + 40]:
                producer.produce(events_topic, key=key, value=value)
            if producer.flush(30) or stop.is_set():
                return
            time.sleep(0.25)  # pacing the stream, not a wait

    producer = threading.Thread(target=produce_slowly, daemon=True)
    stop = threading.Event()
    producer.start()
    try:
        kills = kill_repeatedly(env, recovery, rng, producer)
    finally:
        stop.set()
    producer.join()
    expected = reference_states(Registry.from_toml(REGISTRY_TOML), events)
    proc = start_service(env, recovery)  # the last run catches up, snapshots, and is killed too
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            time.sleep(1.0)  # the poll's interval, within the deadline above
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            states = read_states(recovery)
            if {k: comparable(v) for k, v in states.items()} == {
                k: comparable(v) for k, v in expected.items()
            }:
                break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    states = read_states(recovery)
    assert set(states) == set(expected)
    for key, state in expected.items():  # weights, ψ, V, D, counters, tickets: all equal
        assert comparable(states[key]) == comparable(state), key
    assert_served_once_each(kafka_bootstrap, sel_topic, dlq_topic)
    assert kills >= 3


def test_a_refused_output_fails_the_flow_and_is_delivered_after_restart(kafka_bootstrap, tmp_path):
    events_topic = create_topic(kafka_bootstrap, unique_topic("ev"), 2)
    dlq_topic = create_topic(kafka_bootstrap, unique_topic("dlq"), 1)
    sel_topic = unique_topic("sel")  # not created yet: the broker refuses the selections
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for key, value in event_stream(random.Random(3))[:120]:
        producer.produce(events_topic, key=key, value=value)
    assert producer.flush(30) == 0
    (tmp_path / "registry.toml").write_text(REGISTRY_TOML)
    (tmp_path / "kafka.toml").write_text('[kafka.producer]\n"message.timeout.ms" = 3000\n')
    recovery = tmp_path / "recovery"
    recovery.mkdir()
    subprocess.run([sys.executable, "-m", "bytewax.recovery", str(recovery), "1"], check=True)
    env = service_env(
        kafka_bootstrap,
        tmp_path / "registry.toml",
        events_topic,
        sel_topic,
        dlq_topic,
        TSI_KAFKA_CONFIG=str(tmp_path / "kafka.toml"),
        TSI_STOP_AT_END="1",
    )
    failed = start_service(env, recovery)
    _, err = failed.communicate(timeout=120)
    assert failed.returncode != 0
    assert sel_topic in err.decode()  # the error names the topic that refused
    create_topic(kafka_bootstrap, sel_topic, 2)
    again = start_service(env, recovery)
    _, err = again.communicate(timeout=120)
    assert again.returncode == 0, err.decode()[-2000:]
    answered = {
        orjson.loads(v)["request_id"]
        for part in consume_all(kafka_bootstrap, sel_topic).values()
        for _, v, _ in part
    }
    assert answered == {f"r{i}" for i in range(60)}  # nothing lost with the failed batch


def other_topics_setup(bootstrap, tmp_path):
    """An old and a new events topic (the old one with 40 events), the output topics, the
    registry file and an initialised recovery directory."""
    old = create_topic(bootstrap, unique_topic("ev-old"), 2)
    new = create_topic(bootstrap, unique_topic("ev-new"), 2)
    dlq_topic = create_topic(bootstrap, unique_topic("dlq"), 1)
    sel_topic = create_topic(bootstrap, unique_topic("sel"), 2)
    producer = Producer({"bootstrap.servers": bootstrap})
    for key, value in event_stream(random.Random(5))[:40]:
        producer.produce(old, key=key, value=value)
    assert producer.flush(30) == 0
    (tmp_path / "registry.toml").write_text(REGISTRY_TOML)
    recovery = tmp_path / "recovery"
    recovery.mkdir()
    subprocess.run([sys.executable, "-m", "bytewax.recovery", str(recovery), "1"], check=True)
    return old, new, sel_topic, dlq_topic, recovery


def test_a_directory_of_other_input_topics_is_refused_in_one_line_and_kept(
    kafka_bootstrap, tmp_path
):
    """A recovery directory written for one events topic, started on another
    (``python -m bytewax.run``): one line naming both and the way out (Bytewax would stop
    the flow at every start on the old topic's positions); the directory still serves its
    own topic."""
    old, new, sel_topic, dlq_topic, recovery = other_topics_setup(kafka_bootstrap, tmp_path)

    def run(topic):
        env = service_env(
            kafka_bootstrap,
            tmp_path / "registry.toml",
            topic,
            sel_topic,
            dlq_topic,
            TSI_STOP_AT_END="1",
        )
        proc = start_service(env, recovery)
        _, err = proc.communicate(timeout=120)
        return proc.returncode, err.decode()

    code, err = run(old)
    assert code == 0, err[-2000:]
    code, err = run(new)
    assert code == 1, err[-2000:]
    said = err.strip().splitlines()[-1]
    assert f"holds the input positions of {old}, which this run does not read" in said
    assert f"(it reads {new})" in said and "routing map" not in err
    code, err = run(old)
    assert code == 0, err[-2000:]


def test_tsi_run_refuses_a_directory_of_other_input_topics_with_status_2(kafka_bootstrap, tmp_path):
    """The same refusal from ``tsi run``: exit status 2, the reason on its last line."""
    old, new, sel_topic, dlq_topic, recovery = other_topics_setup(kafka_bootstrap, tmp_path)
    group = unique_topic("group")

    def run(topic):
        args = ["run", "--registry", tmp_path / "registry.toml", "--brokers", kafka_bootstrap]
        args += ["--events-topic", topic, "--selections-topic", sel_topic]
        args += ["--dlq-topic", dlq_topic, "--recovery-dir", recovery, "--group-id", group]
        args += ["--no-changelog", "--stop-at-end", "--log-file", tmp_path / "run.log"]
        return tsi(*args, timeout=180)

    served = run(old)
    assert served.returncode == 0, served.stderr[-2000:]
    ended = run(new)
    assert ended.returncode == 2, ended.stderr[-2000:]
    said = ended.stderr.strip().splitlines()[-1]
    assert f"holds the input positions of {old}, which this run does not read" in said
    assert "Traceback" not in ended.stderr and "routing map" not in ended.stderr
