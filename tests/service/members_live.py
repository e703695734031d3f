"""Helpers of the members' tests on the real broker: members started as ``tsi run``
processes, clients that ask and answer, and the oracle of what the internal topic holds."""

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

from flows.service.connectors.kafka_admin import create_topics
from flows.service.instances.instance import Instance
from flows.service.instances.registry import Registry
from flows.service.runtime.recovery import read_states
from flows.service.wire.events import Origin, parse_feedback, parse_request
from flows.service.wire.keys import DEFAULT_SHARDS, shard_index
from flows.testing.kafka_broker import consume_all, create_topic, unique_topic
from tests.waiting import wait_for

REGISTRY = """
[experiments.shop]
arms = ["a", "b", "c", "d"]
per_unit = true
seed = 5
competition = { kind = "switching", rate = 0.02 }
"""
PARTITIONS = 4  # every topic the members read: partition p is member p % N's
UNITS = 40
TSI = Path(sys.executable).parent / "tsi"


def make_topics(bootstrap: str, internal_partitions: int = PARTITIONS) -> dict[str, str]:
    topics = {n: unique_topic(n) for n in ("requests", "feedback", "sel", "dlq", "internal")}
    for name, topic in topics.items():
        count = {"dlq": 1, "internal": internal_partitions}.get(name, PARTITIONS)
        create_topic(bootstrap, topic, count)
    return topics


def changelog_setup(
    bootstrap: str,
    tmp_path: Path,
    shards: int = DEFAULT_SHARDS,
    internal_partitions: int = PARTITIONS,
) -> tuple[dict[str, str], str, Path]:
    """(topics, a changelog topic of ``shards`` partitions, the registry file) of members
    with a changelog."""
    topics = make_topics(bootstrap, internal_partitions)
    changelog = unique_topic("changelog")
    create_topics([bootstrap], {}, [changelog], changelog=(changelog, shards))
    registry = tmp_path / "registry.toml"
    registry.write_text(REGISTRY)
    return topics, changelog, registry


def changelog_env(bootstrap, registry, topics, changelog, members, member) -> dict[str, str]:
    """``member_env`` of member ``member`` of ``members``, mirroring to ``changelog``."""
    env = member_env(bootstrap, registry, topics, members, member)
    return {**env, "TSI_TOPIC_CHANGELOG": changelog}


def key_of(unit: int) -> str:
    return f"shop\x1fu{unit}"


def home(unit: int, members: int) -> int:
    """The member serving ``unit``'s instance: its shard's internal partition's owner (the
    clients write each event to the same partition of its input topic)."""
    return shard_index(key_of(unit)) % PARTITIONS % members


class Clients:
    """Users who ask (each event written to its shard's partition, as a producer keyed by
    shard would), read their answer and send feedback naming the arm they were shown.
    Every answer is recorded with the time it was first seen."""

    def __init__(self, bootstrap: str, topics: dict[str, str], requests: int, pace: float):
        self.bootstrap, self.topics, self.requests, self.pace = bootstrap, topics, requests, pace
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
        self.asked: dict[str, tuple[int, float]] = {}  # request_id: (unit, when)
        self.answers: dict[str, set[bytes]] = {}
        self.first_seen: dict[str, float] = {}
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.rng = random.Random(17)

    def send(self, topic: str, unit: int, event: dict) -> None:
        partition = shard_index(key_of(unit)) % PARTITIONS
        self.producer.produce(
            self.topics[topic], orjson.dumps(event), key=key_of(unit), partition=partition
        )
        self.producer.poll(0)

    def ask(self) -> None:
        for i in range(self.requests):
            if self.stop.is_set():
                return
            unit = i % UNITS
            with self.lock:
                self.asked[f"r{i}"] = (unit, time.monotonic())
            request = {"experiment": "shop", "unit": f"u{unit}", "request_id": f"r{i}"}
            self.send("requests", unit, request)
            time.sleep(self.pace)  # pacing the clients, not a wait: they ask over a period
        self.producer.flush(30)

    def answer(self) -> None:
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": unique_topic("c")})
        sel = self.topics["sel"]
        consumer.assign([TopicPartition(sel, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        try:
            while not self.stop.is_set():
                for msg in consumer.consume(200, 0.2):
                    if msg.error():
                        continue
                    answer = orjson.loads(msg.value())
                    rid = answer["request_id"]
                    with self.lock:
                        first = rid not in self.answers
                        self.answers.setdefault(rid, set()).add(msg.value())
                        self.first_seen.setdefault(rid, time.monotonic())
                    if first:
                        loss = 1.0 if answer["arm_name"] == "a" else self.rng.random() * 5
                        unit = int(answer["unit"][1:])
                        feedback = {
                            "experiment": "shop",
                            "unit": answer["unit"],
                            "request_id": rid,
                            "loss": loss,
                            "arm": answer["arm_name"],
                        }
                        self.send("feedback", unit, feedback)
        finally:
            consumer.close()

    def start(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=f, daemon=True) for f in (self.ask, self.answer)]
        for thread in threads:
            thread.start()
        return threads

    def answered(self) -> int:
        with self.lock:
            return len(self.answers)


def member_env(bootstrap: str, registry: Path, topics: dict[str, str], members: int, member: int):
    return {
        **os.environ,
        "TSI_REGISTRY": str(registry),
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "TSI_TOPIC_REQUESTS": topics["requests"],
        "TSI_TOPIC_FEEDBACK": topics["feedback"],
        "TSI_TOPIC_SELECTIONS": topics["sel"],
        "TSI_TOPIC_DLQ": topics["dlq"],
        "TSI_TOPIC_INTERNAL": topics["internal"],
        # the changelog of these topics' service (created as the first member starts)
        "TSI_TOPIC_CHANGELOG": f"{topics['internal']}-changelog",
        "TSI_MEMBERS": str(members),
        "TSI_MEMBER": str(member),
        "TSI_SNAPSHOT_EVERY": "0.5",
        "TSI_GROUP_ID": topics["internal"],  # one group for the members, as in a deployment
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }


def start_member(env: dict[str, str], recovery: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [str(TSI), "run", "--recovery-dir", str(recovery), "--log-file", str(log)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop_member(proc: subprocess.Popen, log: Path) -> None:
    """A clean stop (SIGTERM: the last epoch is committed)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]


def alive(proc: subprocess.Popen, log: Path) -> None:
    assert proc.poll() is None, log.read_text()[-3000:]


def states_of(recovery_dirs: list[Path]) -> dict[str, dict]:
    """Each member's committed states, merged: no instance in two members."""
    merged: dict[str, dict] = {}
    for directory in recovery_dirs:
        states = read_states(directory)
        assert not merged.keys() & states.keys()  # one home per instance
        merged.update(states)
    return merged


def internal_oracle(bootstrap: str, topic: str) -> dict[str, dict]:
    """What an uninterrupted run makes of the internal topic: each instance fed the copies
    of its internal partition in offset order, a second copy (a crash's) dropped as the
    service drops it (its input offset no higher than the last read of that input
    partition), by the Python instance with no stream clock (deadlines aside)."""
    registry = Registry.from_toml(REGISTRY)
    instances: dict[str, Instance] = {}
    for part in consume_all(bootstrap, topic).values():
        seen: dict[bytes, int] = {}
        for key, value, headers in part:
            named = dict(headers)["o"]
            where, _, offset = named.rpartition(b":")
            if int(offset) <= seen.get(where, -1):
                continue
            seen[where] = int(offset)
            parse = parse_request if where.startswith(b"r") else parse_feedback
            event = parse(value, Origin("oracle"))
            instance = instances.setdefault(key.decode(), Instance(registry["shop"], key.decode()))
            (instance.on_request if where.startswith(b"r") else instance.on_feedback)(event, 0.0)
    return {key: instance.to_dict() for key, instance in instances.items()}


def comparable(state: dict) -> tuple:
    """What must match exactly (deadlines are wall-clock times)."""
    return (
        state["bandit"],
        sorted(o["request_id"] for o in state["open"]),
        sorted(s[0] for s in state["settled"]),
        sorted(e[0] for e in state["early"]),
    )


def served(bootstrap: str, topics: dict[str, str]) -> tuple[dict[str, set[bytes]], list]:
    """({request_id: the distinct answers written}, the dead letters)."""
    answers: dict[str, set[bytes]] = {}
    for part in consume_all(bootstrap, topics["sel"]).values():
        for _, value, _ in part:
            answers.setdefault(orjson.loads(value)["request_id"], set()).add(value)
    letters = [orjson.loads(v) for _, v, _ in consume_all(bootstrap, topics["dlq"])[0]]
    return answers, letters


def wait_until(
    done, seconds: float, procs: list[tuple[subprocess.Popen, Path]], what: str = "the members"
) -> None:
    """``wait_for`` ``done``, failing as soon as one of ``procs`` stops (its log shown)."""
    wait_for(done, None, seconds, what, alive=lambda: [alive(p, log) for p, log in procs])


def wait_answered_and_applied(clients, requests: int, dirs, procs, logs) -> None:
    """Until every request is answered and every feedback applied in the members' stores."""
    running = list(zip(procs, logs, strict=True))
    wait_until(lambda: clients.answered() == requests, 240, running)
    applied = lambda: sum(s["bandit"]["n_updates"] for s in states_of(dirs).values())  # noqa: E731
    wait_until(lambda: applied() == requests, 120, running)


def stop_all(clients, threads, procs, logs) -> None:
    """The clients stopped and joined, then every member stopped cleanly."""
    clients.stop.set()
    for thread in threads:
        thread.join()
    for proc, log in zip(procs, logs, strict=True):
        stop_member(proc, log)
