"""A slow broker at start and a broker killed while serving, on a broker of these tests'
own (paused with SIGSTOP, killed with SIGKILL and started again on its port and log
directory): a start waits for the broker up to --connect-timeout and then serves, or ends
in one line naming the timeout; after the broker's return every request is answered once.
"""

import contextlib
import os
import signal
import threading
from collections import Counter
from pathlib import Path

import orjson
import psutil

from flows.testing.kafka_broker import (
    consume_all,
    free_port,
    restart_broker,
    unique_topic,
)
from tests.service.test_operating import (
    produce,
    requests,
    service_topics,
    shop,
    start,
)
from tests.service.test_outage import Load, outlive, ready
from tests.waiting import wait_for

PAUSE_S = 4.0  # the broker paused at start, well within the start's --connect-timeout
OUTAGE_S = 10.0  # the broker killed while serving
SLOW_STOP_S, SLOW_RUN_S = 0.9, 0.1  # a slow broker: frozen, then running, in turn


def broker_pid(data: Path) -> int:
    return int((data / "broker.pid").read_text())


@contextlib.contextmanager
def paused(data: Path):
    """The broker frozen (SIGSTOP) inside the block: it takes connections, answers nothing."""
    pid = broker_pid(data)
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@contextlib.contextmanager
def slowed(data: Path):
    """The broker slow inside the block: frozen most of the time, running in short bursts."""
    pid, done = broker_pid(data), threading.Event()

    def stutter() -> None:
        while not done.is_set():
            os.kill(pid, signal.SIGSTOP)
            done.wait(SLOW_STOP_S)
            os.kill(pid, signal.SIGCONT)
            done.wait(SLOW_RUN_S)

    thread = threading.Thread(target=stutter, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        os.kill(pid, signal.SIGCONT)


def killed(data: Path) -> None:
    """The broker killed at once (SIGKILL), as a crash or a lost machine kills it."""
    pid = broker_pid(data)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not running(pid), None, seconds=30, what="the killed broker's exit")


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def talks_to(pid: int, bootstrap: str) -> bool:
    """Whether process ``pid`` holds a connection to the broker at ``bootstrap``."""
    port = int(bootstrap.rsplit(":", 1)[1])
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.NoSuchProcess:
        return False
    return any(c.raddr and c.raddr.port == port for c in conns)


def answered(bootstrap: str, topic: str) -> Counter:
    """How often each request id was answered on the selections ``topic``."""
    return Counter(
        orjson.loads(value)["request_id"]
        for part in consume_all(bootstrap, topic).values()
        for _, value, _ in part
    )


def run_args(bootstrap, names, tmp_path, connect_timeout, *more):
    registry = tmp_path / "registry.toml"
    registry.write_text(shop("ab"))
    return [
        *("--registry", registry, "--brokers", bootstrap, "--events-topic", names["ev"]),
        *("--selections-topic", names["sel"], "--dlq-topic", names["dlq"]),
        *("--recovery-dir", tmp_path / "rec", "--snapshot-every", "0.5"),
        *("--changelog-topic", unique_topic("changelog")),  # a fresh one: created at start
        *("--connect-timeout", connect_timeout),
        *more,
    ]


def test_a_start_on_a_paused_then_slow_broker_waits_for_it_then_serves(own_broker, tmp_path):
    data, bootstrap = own_broker
    names = service_topics(bootstrap)
    produce(bootstrap, names["ev"], requests(["r1", "r2", "r3"]))
    port = free_port()
    args = run_args(bootstrap, names, tmp_path, 120, "--metrics-port", port)
    with paused(data):
        proc = start(*args, log_file=tmp_path / "run.log")
        try:
            wait_for(lambda: talks_to(proc.pid, bootstrap), proc, what="the start's first call")
            outlive(proc, PAUSE_S)  # it waits: no error while the broker answers nothing
        except BaseException:
            proc.kill()
            raise
    try:
        with slowed(data):  # the changelog's partitions created and led slowly
            wait_for(lambda: ready(port), proc, seconds=240, what="readiness")
        wait_for(lambda: set(answered(bootstrap, names["sel"])) == {"r1", "r2", "r3"}, proc)
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
    assert "changelog topic created" in (tmp_path / "run.log").read_text()


def test_a_broker_paused_past_the_connect_timeout_ends_the_start_in_one_line(own_broker, tmp_path):
    data, bootstrap = own_broker
    names = service_topics(bootstrap)
    args = run_args(bootstrap, names, tmp_path, 3)
    with paused(data):
        proc = start(*args, log_file=tmp_path / "run.log")
        try:
            _, stderr = proc.communicate(timeout=120)
        finally:
            proc.kill()
    assert proc.returncode not in (0, None)
    assert "Traceback" not in stderr
    [line] = stderr.strip().splitlines()
    assert line.startswith(f"tsi run: no Kafka broker answers at {bootstrap} within 3 s")
    assert line.endswith("a slow broker may need a longer --connect-timeout")


def test_every_request_sent_during_and_after_a_killed_broker_is_answered_once(own_broker, tmp_path):
    data, bootstrap = own_broker
    names = service_topics(bootstrap)
    port = free_port()
    args = run_args(bootstrap, names, tmp_path, 60, "--metrics-port", port, "--ready-timeout", "5")
    proc = start(*args, log_file=tmp_path / "run.log")
    load = Load(bootstrap, names["ev"])
    try:
        wait_for(lambda: ready(port), proc, what="readiness")
        load.start()  # a steady stream: reads and writes are in flight when the broker dies
        wait_for(lambda: answered(bootstrap, names["sel"]), proc, what="the first answers")
        killed(data)
        outlive(proc, OUTAGE_S)
        assert restart_broker(data) == bootstrap
        wait_for(lambda: ready(port), proc, seconds=120, what="readiness after the outage")
        sent = load.stop()  # every request sent is in the topic
        wait_for(lambda: set(answered(bootstrap, names["sel"])) == sent, proc, seconds=240)
        assert proc.poll() is None
    finally:
        load.stop()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    counts = answered(bootstrap, names["sel"])
    assert set(counts) == sent and len(sent) > 1000
    assert [rid for rid, n in counts.items() if n != 1] == []  # none answered twice
    assert not any(consume_all(bootstrap, names["dlq"]).values())  # nothing refused


def test_a_restart_with_state_during_a_broker_outage_waits_for_the_broker(own_broker, tmp_path):
    """A service that served, stopped, and restarted while the broker is away outlives
    many --connect-timeouts (no exit a supervisor would repeat), then serves old and new
    requests once the broker is back (a first start, on an empty directory, still ends: above)."""
    data, bootstrap = own_broker
    names = service_topics(bootstrap)
    args = run_args(bootstrap, names, tmp_path, 2)
    produce(bootstrap, names["ev"], requests(["r1", "r2"]))
    proc = start(*args, log_file=tmp_path / "run.log")
    try:
        wait_for(lambda: set(answered(bootstrap, names["sel"])) == {"r1", "r2"}, proc)
        outlive(proc, 2.0)  # an epoch or more closed: the directory holds state
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    killed(data)
    proc = start(*args, log_file=tmp_path / "again.log")
    try:
        outlive(proc, 10.0)  # five connect timeouts
        assert restart_broker(data) == bootstrap
        produce(bootstrap, names["ev"], requests(["r3"]))
        wait_for(lambda: set(answered(bootstrap, names["sel"])) == {"r1", "r2", "r3"}, proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert "the state is kept: waiting for the brokers" in (tmp_path / "again.log").read_text()
    assert answered(bootstrap, names["sel"])["r3"] == 1
