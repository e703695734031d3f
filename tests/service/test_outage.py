"""A broker outage of any length is waited out: the service stays alive, reports
not-ready, and serves everything once the broker is back (its own broker, stopped here)."""

import os
import signal
import threading
import time
import urllib.request

import orjson
from confluent_kafka import Producer

from flows.testing.kafka_broker import (
    consume_all,
    create_topic,
    free_port,
    restart_broker,
    start_broker,
    stop_broker,
    unique_topic,
)
from tests.service.test_operating import TSI, ready, run_args, shop
from tests.waiting import wait_for

OUTAGE_S = 45.0  # longer than librdkafka's and the old sink's 30 s message timeout
# The broker stopped (its clients reconnect), then frozen with writes in flight: the old
# sink gave up on those after 30 s and the service died.


class Load:
    """Requests sent from a thread (held by the client while the broker is away)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._producer = Producer({"bootstrap.servers": bootstrap, "log_level": 0})
        self._topic = topic
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.sent: set[str] = set()

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            for _ in range(10):  # ~500 requests a second: the service is always writing
                unit = f"u{n % 5}"
                event = {
                    "type": "request",
                    "experiment": "shop",
                    "unit": unit,
                    "request_id": f"r{n}",
                }
                self._producer.produce(self._topic, orjson.dumps(event), key=f"shop\x1f{unit}")
                self.sent.add(f"r{n}")
                n += 1
            self._producer.poll(0)
            time.sleep(0.02)  # pacing the load, not a wait

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> set[str]:
        """Stop sending; every request sent is delivered (or this fails)."""
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join()
            assert self._producer.flush(120) == 0
        return set(self.sent)


def inputs(port: int) -> str:
    """The service's metrics of its input partitions (lag, consumers rebuilt)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except OSError as exc:
        return f"(no metrics: {exc})"
    wanted = ("tsi_consumer_lag{", "tsi_input_rebuilds_total{")
    return "\n".join(line for line in text.splitlines() if line.startswith(wanted))


def outlive(proc, seconds: float) -> None:
    """The service stays alive for ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        time.sleep(1.0)  # deliberate: checked over a period, whatever the host's speed


def test_a_broker_outage_longer_than_any_timeout_is_waited_out(tmp_path):
    import subprocess

    data = tmp_path / "kafka"
    bootstrap = start_broker(data)
    try:
        names = {n: unique_topic(n) for n in ("ev", "sel", "dlq")}
        for name in names.values():
            create_topic(bootstrap, name, 2)
        registry = tmp_path / "registry.toml"
        registry.write_text(shop("ab"))
        port = free_port()
        args = run_args(
            bootstrap,
            names,
            registry,
            "--recovery-dir",
            tmp_path / "rec",
            "--metrics-port",
            port,
            "--ready-timeout",
            "5",
            "--connect-timeout",  # a fresh broker on a loaded host: its first group answer
            "60",
        )
        proc = subprocess.Popen(
            [TSI, "run", *map(str, args), "--log-file", tmp_path / "run.log"],
            stderr=subprocess.PIPE,
            text=True,
        )

        def answered():
            return {
                orjson.loads(v)["request_id"]
                for part in consume_all(bootstrap, names["sel"]).values()
                for _, v, _ in part
            }

        load = Load(bootstrap, names["ev"])
        try:
            wait_for(lambda: ready(port), proc, what="readiness")
            load.start()  # a steady stream: writes are in flight when the broker goes
            wait_for(answered, proc, what="the first answers")  # writes are flowing
            stop_broker(data)  # an outage: the service's writes and reads wait
            outlive(proc, 20.0)
            assert not ready(port)  # not ready while the brokers are away
            assert restart_broker(data) == bootstrap
            wait_for(lambda: ready(port), proc, 120, "readiness after the restart")
            broker = int((data / "broker.pid").read_text())
            os.kill(broker, signal.SIGSTOP)  # a hung broker: writes in flight get no answer
            try:
                outlive(proc, OUTAGE_S)
            finally:
                os.kill(broker, signal.SIGCONT)
            wait_for(lambda: ready(port), proc, 120, "readiness after the hang")
            sent = load.stop()
            try:
                wait_for(lambda: answered() == sent, proc, seconds=180)
            except AssertionError:
                got = answered()
                log = (tmp_path / "run.log").read_text()[-4000:]
                missing = sorted(sent - got)[:10]
                raise AssertionError(
                    f"{len(sent - got)} of {len(sent)} requests unanswered (e.g. {missing}),"
                    f" {len(got - sent)} answers never sent; the inputs:\n{inputs(port)}\n"
                    f"the service's log ends:\n{log}"
                ) from None
            wait_for(lambda: ready(port), proc, seconds=60, what="readiness after the outage")
            assert proc.poll() is None
        finally:
            load.stop()
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        assert answered() == sent and len(sent) > 5000
        letters = consume_all(bootstrap, names["dlq"])
        assert not any(letters.values())  # nothing refused
    finally:
        stop_broker(data)
