"""A real Kafka broker for tests and benchmarks, and small helpers around it.

`broker_session(data_dir)` yields a bootstrap address: `$KAFKA_BOOTSTRAP_SERVERS` when set
(that broker is used as is), otherwise a single-node broker started with
`deploy/kafka/start.sh` on free ports and stopped with `stop.sh` at the end. Missing
Java/Maven or a failed start raises `BrokerStartError` saying what to install; the
`kafka_bootstrap` fixture (tests/conftest.py) turns it into a FAILED session, never a skip:
the Kafka tests are part of the suite.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

KAFKA_DIR = Path(__file__).resolve().parents[2] / "deploy" / "kafka"
INSTALL_HINT = (
    "the Kafka tests need a broker: install Java 17+ and Maven 3.8+ "
    "(Debian/Ubuntu: apt-get install openjdk-17-jdk-headless maven), "
    "or set KAFKA_BOOTSTRAP_SERVERS to a running broker"
)


class BrokerStartError(RuntimeError):
    """The broker could not start; the message says what to install or what failed."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _java_missing() -> str | None:
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if not java or not Path(java).exists():
        return "java not found"
    return None


def start_broker(data_dir: Path, attempts: int = 3) -> str:
    """Start deploy/kafka/start.sh into data_dir on free ports; return the bootstrap address.

    Raises ``BrokerStartError`` with what to install when it cannot start. Maven is
    only needed while the broker jars are not cached yet; fetch.sh then says so itself.
    """
    problem = _java_missing()
    if problem:
        raise BrokerStartError(f"{problem}: {INSTALL_HINT}")
    err = ""
    for _ in range(attempts):  # a "free" port may be taken before the broker binds it
        port, cport = free_port(), free_port()
        if port == cport:
            continue
        proc = subprocess.run(
            [str(KAFKA_DIR / "start.sh"), str(data_dir), str(port), str(cport)],
            capture_output=True,
            text=True,
            timeout=300,  # the first run downloads the broker's jars with Maven
            check=False,
        )
        if proc.returncode == 0:
            return proc.stdout.strip().splitlines()[-1]
        err = proc.stderr.strip()
        if "already in use" not in err:
            break
    raise BrokerStartError(f"Kafka broker did not start ({INSTALL_HINT}):\n{err}")


def restart_broker(data_dir: Path) -> str:
    """Start again the broker of ``data_dir`` (stopped by ``stop_broker``) on its old ports,
    with its topics and messages: what a broker outage ends with."""
    settings = (Path(data_dir) / "server.properties").read_text()
    listeners = next(line for line in settings.splitlines() if line.startswith("listeners="))
    ports = [part.rsplit(":", 1)[1] for part in listeners.split("=", 1)[1].split(",")]
    proc = subprocess.run(
        [str(KAFKA_DIR / "start.sh"), str(data_dir), *ports],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        raise BrokerStartError(f"Kafka broker did not start again:\n{proc.stderr.strip()}")
    return proc.stdout.strip().splitlines()[-1]


def stop_broker(data_dir: Path) -> None:
    subprocess.run([str(KAFKA_DIR / "stop.sh"), str(data_dir)], check=False, timeout=60)


def broker_session(data_dir: Path) -> Iterator[str]:
    """Yield a bootstrap address for the whole session (see the module docstring)."""
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if external:
        yield external
        return
    bootstrap = start_broker(data_dir)
    try:
        yield bootstrap
    finally:
        stop_broker(data_dir)


def unique_topic(prefix: str = "test") -> str:
    """A topic name no other test (or earlier run against the same broker) uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def create_topic(bootstrap: str, name: str, partitions: int = 1, timeout: float = 30.0) -> str:
    """Create a topic (auto-create is off) and wait until all its partitions have leaders."""
    admin = AdminClient({"bootstrap.servers": bootstrap})  # keep a reference: see below
    deadline = time.monotonic() + timeout
    while True:
        # The futures fail with _DESTROY if the AdminClient is garbage collected first.
        future = admin.create_topics([NewTopic(name, num_partitions=partitions)])[name]
        try:
            future.result(timeout=timeout)
            break
        except KafkaException as exc:
            err = exc.args[0]
            if err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                break
            if not err.retriable() or time.monotonic() > deadline:
                raise
            time.sleep(0.2)  # e.g. controller not ready right after start
    while time.monotonic() < deadline:
        meta = admin.list_topics(name, timeout=timeout).topics.get(name)
        if (
            meta is not None
            and meta.error is None
            and len(meta.partitions) == partitions
            and all(p.leader >= 0 for p in meta.partitions.values())
        ):
            return name
        time.sleep(0.05)
    msg = f"topic {name!r} has no leaders after {timeout} s"
    raise TimeoutError(msg)


def consume_all(
    bootstrap: str, topic: str, timeout: float = 30.0
) -> dict[int, list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]]]:
    """Every message now in `topic`: {partition: [(key, value, headers), ...]} in offset order."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    parts = sorted(admin.list_topics(topic, timeout=timeout).topics[topic].partitions)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "tsi-tests-unused",  # required, but nothing is committed
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 10,  # an idle fetch (hence EOF) returns after 10 ms, not 500
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
    out: dict[int, list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]]] = {
        p: [] for p in parts
    }
    at_end: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        while len(at_end) < len(parts):
            if time.monotonic() > deadline:
                msg = f"reading {topic!r}: partitions {set(parts) - at_end} not at end"
                raise TimeoutError(msg)
            for msg in consumer.consume(500, 0.2):
                err = msg.error()
                if err is not None and err.code() == KafkaError._PARTITION_EOF:
                    at_end.add(msg.partition())
                elif err is not None:
                    raise KafkaException(err)
                else:
                    out[msg.partition()].append((msg.key(), msg.value(), msg.headers() or []))
    finally:
        consumer.close()
    return out
