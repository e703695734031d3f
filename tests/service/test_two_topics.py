"""The default setup (requests and feedback on two topics) keeps the combined topic's
guarantees across kill -9: clients that retry and echo the served arm see no answer change
and no feedback refused; every feedback is applied exactly once.

The service copies both topics into one instance-keyed internal topic and serves from that
log (``Topics.internal``); this test fails against the direct two-topic merge.
"""

import base64
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from flows.service.runtime.recovery import read_states
from flows.testing.kafka_broker import consume_all, create_topic, unique_topic
from tests.service.streams import start_service

REGISTRY = """
[experiments.shop]
arms = ["a", "b", "c", "d"]
per_unit = true
seed = 5
competition = { kind = "switching", rate = 0.02 }

[experiments.banner]
arms = ["x", "y", "z"]
seed = 6
"""
REQUESTS = 900


class Clients:
    """Users who ask, read their answer, send feedback naming the arm they were shown, and
    sometimes ask again (a retry). Every answer seen is recorded."""

    def __init__(self, bootstrap: str, topics: dict[str, str]) -> None:
        self.bootstrap, self.topics = bootstrap, topics
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
        self.answers: dict[str, set[tuple]] = {}
        self.stop = threading.Event()
        self.rng = random.Random(11)
        self.lock = threading.Lock()

    def send(self, topic: str, event: dict) -> None:
        key = event["experiment"] + ("\x1f" + event["unit"] if "unit" in event else "")
        self.producer.produce(self.topics[topic], orjson.dumps(event), key=key)
        self.producer.poll(0)

    def request(self, i: int) -> dict:
        if i % 3 == 0:
            return {"experiment": "banner", "request_id": f"r{i}"}
        return {"experiment": "shop", "unit": f"u{i % 17}", "request_id": f"r{i}"}

    def ask(self) -> None:
        for i in range(REQUESTS):
            if self.stop.is_set():
                return
            self.send("requests", self.request(i))
            if i % 7 == 0 and i > 20:  # a retry of an earlier request
                self.send("requests", self.request(self.rng.randrange(i)))
            time.sleep(0.03)

    def answer(self) -> None:
        consumer = Consumer(
            {"bootstrap.servers": self.bootstrap, "group.id": unique_topic("clients")}
        )
        consumer.assign([TopicPartition(self.topics["sel"], p, OFFSET_BEGINNING) for p in (0, 1)])
        try:
            while not self.stop.is_set():
                for msg in consumer.consume(200, 0.2):
                    if msg.error():
                        continue
                    sel = orjson.loads(msg.value())
                    rid = sel["request_id"]
                    seen = (sel["arm_name"], sel["prob"], sel["round"])
                    with self.lock:
                        first = rid not in self.answers
                        self.answers.setdefault(rid, set()).add(seen)
                    if first:  # feedback echoing the arm the user was shown
                        loss = 1.0 if sel["arm_name"] in ("a", "x") else self.rng.random() * 5
                        event = {k: sel[k] for k in ("experiment", "request_id")}
                        if sel["unit"] is not None:
                            event["unit"] = sel["unit"]
                        self.send("feedback", {**event, "loss": loss, "arm": sel["arm_name"]})
        finally:
            consumer.close()


def two_topic_env(bootstrap: str, registry: Path, topics: dict[str, str]) -> dict[str, str]:
    """Environment for ``python -m bytewax.run flows.service.main:flow`` on two topics."""
    return {
        **os.environ,
        "TSI_REGISTRY": str(registry),
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "TSI_TOPIC_REQUESTS": topics["requests"],
        "TSI_TOPIC_FEEDBACK": topics["feedback"],
        "TSI_TOPIC_SELECTIONS": topics["sel"],
        "TSI_TOPIC_DLQ": topics["dlq"],
        "TSI_TOPIC_INTERNAL": topics["internal"],
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }


def test_two_topics_give_identical_answers_and_every_feedback_once_across_kill_9(
    kafka_bootstrap, tmp_path
):
    topics = {n: unique_topic(n) for n in ("requests", "feedback", "sel", "dlq", "internal")}
    for name, topic in topics.items():
        create_topic(kafka_bootstrap, topic, 1 if name == "dlq" else 2)
    (tmp_path / "registry.toml").write_text(REGISTRY)
    recovery = tmp_path / "recovery"
    recovery.mkdir()
    subprocess.run([sys.executable, "-m", "bytewax.recovery", str(recovery), "1"], check=True)
    env = two_topic_env(kafka_bootstrap, tmp_path / "registry.toml", topics)
    clients = Clients(kafka_bootstrap, topics)
    threads = [threading.Thread(target=f, daemon=True) for f in (clients.ask, clients.answer)]
    for thread in threads:
        thread.start()
    rng, kills = random.Random(3), 0
    try:
        while threads[0].is_alive() or kills < 5:
            proc = start_service(env, recovery)
            time.sleep(rng.uniform(2.5, 4.5))
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills += 1
        proc = start_service(env, recovery)  # the last run: everything answered and applied
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            time.sleep(1.0)
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            with clients.lock:
                answered = len(clients.answers)
            states = read_states(recovery) if answered == REQUESTS else {}
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
    assert kills >= 5
    changed = {rid: seen for rid, seen in clients.answers.items() if len(seen) > 1}
    assert changed == {}  # every re-emitted or retried answer is the first one
    assert len(clients.answers) == REQUESTS
    letters = [orjson.loads(v) for _, v, _ in consume_all(kafka_bootstrap, topics["dlq"])[0]]
    assert letters == []  # no feedback refused (arm_mismatch, duplicate, unknown, ...)
    states = read_states(recovery)
    assert sum(s["bandit"]["n_updates"] for s in states.values()) == REQUESTS  # once each
    assert sum(len(s["open"]) + len(s["early"]) for s in states.values()) == 0


def test_a_downtime_longer_than_the_time_to_live_loses_no_feedback(kafka_bootstrap, tmp_path):
    topics = {n: unique_topic(n) for n in ("requests", "feedback", "sel", "dlq", "internal")}
    for name, topic in topics.items():
        create_topic(kafka_bootstrap, topic, 1 if name == "dlq" else 2)
    (tmp_path / "registry.toml").write_text(
        '[experiments.shop]\narms = ["a", "b"]\nper_unit = true\nfeedback_ttl = 12\n'
    )
    recovery = tmp_path / "recovery"
    recovery.mkdir()
    subprocess.run([sys.executable, "-m", "bytewax.recovery", str(recovery), "1"], check=True)
    env = two_topic_env(kafka_bootstrap, tmp_path / "registry.toml", topics)
    clients = Clients(kafka_bootstrap, topics)
    asked = [clients.request(i) for i in range(1, 60) if i % 3]  # per-unit requests only
    proc = start_service(env, recovery)
    try:
        for event in asked:
            clients.send("requests", event)
        clients.producer.flush(10)
        deadline = time.monotonic() + 60
        while len(consume_all(kafka_bootstrap, topics["sel"])[0]) + len(
            consume_all(kafka_bootstrap, topics["sel"])[1]
        ) < len(asked):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.5)
        time.sleep(2.0)  # a snapshot holds the open tickets
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    for event in asked:  # the feedback comes within the time to live, while the service is down
        clients.send("feedback", {**event, "loss": 1.0})
    assert clients.producer.flush(10) == 0
    time.sleep(20.0)  # down for longer than the 12 s time to live
    later = [  # requests keep coming: newer than every deadline, read before some feedback
        {"experiment": "shop", "unit": f"v{i}", "request_id": f"later{i}"} for i in range(200)
    ]
    for event in later:
        clients.send("requests", event)
    assert clients.producer.flush(10) == 0
    proc = start_service(env, recovery)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(1.0)
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            states = read_states(recovery)
            if sum(s["bandit"]["n_updates"] for s in states.values()) == len(asked):
                break
        time.sleep(14.0)  # past every deadline: anything left would expire now
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    states = read_states(recovery)
    assert sum(s["bandit"]["n_updates"] for s in states.values()) == len(asked)
    letters = [orjson.loads(v) for _, v, _ in consume_all(kafka_bootstrap, topics["dlq"])[0]]
    reasons = [d["reason"] for d in letters]  # the later requests expire, nothing else
    assert all(d["reason"] == "ticket_expired" for d in letters), reasons
    expired = {orjson.loads(base64.b64decode(d["raw_b64"]))["request_id"] for d in letters}
    assert expired <= {event["request_id"] for event in later}
