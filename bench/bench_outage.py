"""How soon decisions flow again after a broker outage: the seconds from the broker's
return to the first answer of a request sent after it.

Run from the repository root (about a minute a run)::

    .venv/bin/python bench/bench_outage.py [--outage 10] [--librdkafka-defaults]

A broker of its own is started as the tests start theirs (``flows.testing.kafka_broker``),
and ``tsi run`` serves a steady stream of requests from it. The broker is then killed
(SIGKILL) for ``--outage`` seconds and started again on its port and log directory. From
the moment it listens again, a new request goes out every ``PROBE_EVERY_S`` seconds (from
a client created then, so the client's own reconnection is not measured); the figure is
the time until the first of them is answered on the selections topic.
``--librdkafka-defaults``: the service runs with librdkafka's own connection settings
instead of ``RECONNECT_DEFAULTS`` (flows.service.connectors.kafka_config), for comparison.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flows.testing.kafka_broker import (
    create_topic,
    restart_broker,
    start_broker,
    stop_broker,
    unique_topic,
)
from tests.service.test_operating import TSI, shop
from tests.service.test_outage import Load

PROBE_EVERY_S = 0.1
GIVE_UP_S = 600.0
#: librdkafka's own values of what `RECONNECT_DEFAULTS` changes.
LIBRDKAFKA_DEFAULTS = """[kafka]
"reconnect.backoff.max.ms" = 10000
"socket.connection.setup.timeout.ms" = 30000
"socket.timeout.ms" = 60000
"""


def answers(consumer: Consumer, seen: set[str], until: float) -> None:
    """Add to ``seen`` the request ids answered, reading until ``until`` (monotonic)."""
    while time.monotonic() < until:
        for msg in consumer.consume(1000, 0.05):
            if msg.error() is None:
                seen.add(orjson.loads(msg.value())["request_id"])


def selections_reader(bootstrap: str, topic: str, partitions: int) -> Consumer:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "bench-outage", "log_level": 0}
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    return consumer


def recovery_seconds(bootstrap: str, names: dict[str, str], since: float) -> float:
    """Seconds from ``since`` to the first answer of a probe sent after it."""
    producer = Producer({"bootstrap.servers": bootstrap, "log_level": 0})
    consumer = selections_reader(bootstrap, names["sel"], 2)
    probes: set[str] = set()
    seen: set[str] = set()
    n = 0
    try:
        while time.monotonic() - since < GIVE_UP_S:
            rid = f"probe{n}"
            event = {"type": "request", "experiment": "shop", "unit": "p", "request_id": rid}
            producer.produce(names["ev"], orjson.dumps(event), key="shop\x1fp")
            producer.poll(0)
            probes.add(rid)
            n += 1
            answers(consumer, seen, time.monotonic() + PROBE_EVERY_S)
            if probes & seen:
                return time.monotonic() - since
    finally:
        consumer.close()
    msg = f"no probe answered within {GIVE_UP_S:g} s of the broker's return"
    raise TimeoutError(msg)


def serve(tmp: Path, bootstrap: str, names: dict[str, str], old: bool) -> subprocess.Popen:
    """``tsi run`` on the topics, once it answers a request."""
    registry = tmp / "registry.toml"
    registry.write_text(shop("ab"))
    extra = []
    if old:
        (tmp / "kafka.toml").write_text(LIBRDKAFKA_DEFAULTS)
        extra = ["--kafka-config", str(tmp / "kafka.toml")]
    args = [
        *("--registry", registry, "--brokers", bootstrap, "--events-topic", names["ev"]),
        *("--selections-topic", names["sel"], "--dlq-topic", names["dlq"]),
        *("--recovery-dir", tmp / "rec", "--snapshot-every", "0.5", "--connect-timeout", "60"),
        *("--changelog-topic", unique_topic("changelog"), "--log-file", tmp / "run.log"),
    ]
    return subprocess.Popen([TSI, "run", *map(str, args), *extra], stderr=subprocess.PIPE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outage", type=float, default=10.0, help="seconds the broker is away")
    parser.add_argument("--librdkafka-defaults", action="store_true")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        data = tmp / "kafka"
        data.mkdir()
        bootstrap = start_broker(data)
        try:
            names = {n: create_topic(bootstrap, unique_topic(n), 2) for n in ("ev", "sel", "dlq")}
            proc = serve(tmp, bootstrap, names, opts.librdkafka_defaults)
            load = Load(bootstrap, names["ev"])
            try:
                load.start()
                seen: set[str] = set()
                reader = selections_reader(bootstrap, names["sel"], 2)
                while not seen and proc.poll() is None:  # serving before the outage
                    answers(reader, seen, time.monotonic() + 1.0)
                reader.close()
                os.kill(int((data / "broker.pid").read_text()), signal.SIGKILL)
                time.sleep(opts.outage)
                restart_broker(data)
                figure = recovery_seconds(bootstrap, names, time.monotonic())
            finally:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                load.stop()
        finally:
            stop_broker(data)
    settings = "librdkafka's defaults" if opts.librdkafka_defaults else "RECONNECT_DEFAULTS"
    print(
        f"outage {opts.outage:g} s ({settings}): first new request answered "
        f"{figure:.1f} s after the broker's return"
    )


if __name__ == "__main__":
    main()
