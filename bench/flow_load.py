"""Open-loop load on a background service: requests sent at their intended times, their
selections read back as they are consumed, a probe until the service answers."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
from confluent_kafka import Producer

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the modules beside this one
import open_loop
from flow_kafka import topic_reader
from flow_plan import LatencyConfig, Plan
from flow_service import check_alive
from flow_workload import feedback_value, instance_key, loss_of, request_value


class SelectionReader:
    """A thread that records when each request_id's selection is consumed."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.received: dict[str, float] = {}
        self._consumer = topic_reader(bootstrap, topic)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # poll() returns as soon as one message is there (consume(n, t) waits to fill n).
        while not self._stop.is_set():
            msg = self._consumer.poll(0.05)
            if msg is None or msg.error() is not None:
                continue
            now = time.perf_counter()
            self.received[orjson.loads(msg.value())["request_id"]] = now

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._consumer.close()


class RequestSender:
    """Requests produced one by one at their intended times (``open_loop.schedule``), with
    both the intended and the actual time of each (``time.perf_counter``); requests and
    feedback go to the ``events`` topic when ``topics`` has one."""

    def __init__(self, bootstrap: str, topics: dict[str, str]) -> None:
        # No linger (nothing waits to fill a batch); idempotence caps the requests in flight
        # at 5, so under load messages batch while earlier requests are in flight (without it
        # every message is its own produce request, and the broker and the service's
        # consumers pay).
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "linger.ms": 0, "enable.idempotence": True}
        )
        self.typed = "events" in topics
        self.requests = topics["events" if self.typed else "requests"]
        self.feedback_topic = topics["events" if self.typed else "feedback"]
        self.intended: dict[str, float] = {}
        self.sent: dict[str, float] = {}

    def send(self, rid: str, unit: str, intended: float | None = None) -> None:
        """Request ``rid`` of ``unit``, due at ``intended`` (default: now)."""
        value = request_value(unit, rid, typed=self.typed, ts=time.time())
        t = time.perf_counter()
        self.producer.produce(self.requests, key=instance_key(unit), value=value)
        self.producer.poll(0)
        self.sent[rid] = t
        self.intended[rid] = t if intended is None else intended

    def feedback(self, rid: str, unit: str, loss: float) -> None:
        """The feedback of request ``rid`` of ``unit``."""
        self.producer.produce(
            self.feedback_topic,
            key=instance_key(unit),
            value=feedback_value(unit, rid, loss, typed=self.typed),
        )


def await_ready(
    proc: subprocess.Popen, logfile: Path, reader: SelectionReader, sender: RequestSender
) -> tuple[float, float]:
    """Probe requests until one is answered: (start time, seconds until ready)."""
    t0 = time.perf_counter()
    k = 0
    while not reader.received:  # ready: a probe request has been answered
        check_alive(proc, logfile)
        if time.perf_counter() - t0 > 90:
            raise TimeoutError("the service answered no request within 90 s")
        sender.send(f"probe{k}", f"probe{k}")
        k += 1
        time.sleep(0.2)
    return t0, time.perf_counter() - t0


def send_load(plan: Plan, cfg: LatencyConfig, sender: RequestSender) -> float:
    """Warm-up, then the measured requests, on one open-loop schedule at the plan's rate
    (request k due at start + k / rate; ``w`` ids in the warm-up seconds, ``m`` after);
    the intended time of the first measured one. With feedback, each request's comes
    0.5 s after it, warm-up included: the first feedback a topic and a service see (a new
    producer, the topic's first writes) is a transient that the measured seconds would
    otherwise begin with (bench/RESULTS.md, "the engine measured alone, latency on both
    topologies")."""
    lag = round(plan.latency_rate * 0.5)
    warm = round(plan.latency_rate * plan.latency_warmup_seconds)
    seconds = plan.latency_warmup_seconds + plan.latency_seconds
    sent: list[tuple[str, str]] = []  # (request id, unit), in the order sent
    t_start = float("nan")
    for k, due in open_loop.schedule(plan.latency_rate, seconds):
        rid, unit = (f"w{k}" if k < warm else f"m{k - warm}"), f"u{k % plan.units}"
        if k == warm:
            t_start = due
        sender.send(rid, unit, due)
        sent.append((rid, unit))
        if cfg.feedback and len(sent) > lag:
            sender.feedback(*sent[len(sent) - 1 - lag], loss_of(len(sent)))
    return t_start


def await_answers(
    reader: SelectionReader, measured: list[str], proc: subprocess.Popen, logfile: Path
) -> None:
    """Wait up to 10 s for every measured answer, then 0.5 s more (the unanswered count
    as infinitely slow)."""
    deadline = time.perf_counter() + 10
    while time.perf_counter() < deadline and not all(rid in reader.received for rid in measured):
        time.sleep(0.1)
    time.sleep(0.5)
    check_alive(proc, logfile)


def measure_open_loop(
    plan: Plan,
    cfg: LatencyConfig,
    sender: RequestSender,
    reader: SelectionReader,
    proc: subprocess.Popen,
    logfile: Path,
) -> tuple[float, float, float, list[str]]:
    """One open-loop run against a started service: (t0, ready_s, t_start, the measured
    request ids) once it is ready, the plan's schedule sent and every measured one answered."""
    t0, ready_s = await_ready(proc, logfile, reader, sender)
    t_start = send_load(plan, cfg, sender)
    sender.producer.flush(10)
    measured = [rid for rid in sender.sent if rid.startswith("m")]
    await_answers(reader, measured, proc, logfile)
    return t0, ready_s, t_start, measured
