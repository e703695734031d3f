"""Readiness (/ready), liveness (/healthz) and the progress metrics, over real HTTP.

Every test runs its own server on a free port, with its own ``Readiness`` and a clock the
test moves by hand: no sleeping through a timeout. The process-wide state the service
feeds (``metrics.READINESS``, the lag table) is replaced for each test.
"""

from __future__ import annotations

import errno
import logging
import socket
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, TopicPartition
from prometheus_client import REGISTRY

from flows.service.observe import metrics
from flows.service.observe.metrics import (
    MetricsPortError,
    Readiness,
    note_broker_contact,
    note_epoch_completed,
    observe_consumer_position,
    observe_kafka_stats,
    serve_metrics,
)
from flows.service.observe.restoring import Restoring

TIMEOUT = 30.0
# Trimmed from real librdkafka statistics (confluent-kafka 2.x, Kafka 4.1): a consumer
# assigned partition 0 of "statst" at offset 4, after reading up to offset 10.
STATS_UP = {
    "name": "rdkafka#consumer-3",
    "type": "consumer",
    "brokers": {
        "127.0.0.1:29391/1": {
            "name": "127.0.0.1:29391/1",
            "nodeid": 1,
            "source": "learned",
            "state": "UP",
        },
        "GroupCoordinator": {
            "name": "GroupCoordinator",
            "nodeid": -1,
            "source": "logical",
            "state": "UP",
        },
    },
    "topics": {
        "statst": {
            "topic": "statst",
            "partitions": {
                "0": {"partition": 0, "desired": True, "fetch_state": "active",
                      "next_offset": 10, "app_offset": 10, "lo_offset": 0, "hi_offset": 10,
                      "ls_offset": 10, "consumer_lag": -1, "committed_offset": -1001},
                "1": {"partition": 1, "desired": False, "fetch_state": "none",
                      "next_offset": 0, "app_offset": -1001, "lo_offset": -1001,
                      "hi_offset": -1001, "ls_offset": -1001, "consumer_lag": -1},
                "-1": {"partition": -1, "desired": False, "fetch_state": "none",
                       "next_offset": 0, "app_offset": -1001, "hi_offset": -1001,
                       "ls_offset": -1001},
            },
        }
    },
}  # fmt: skip


class Clock:
    """A clock the test sets."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def state(monkeypatch, clock) -> Readiness:
    """A fresh process-wide READINESS (what note_* feed) and lag table."""
    fresh = Readiness(TIMEOUT, clock)
    monkeypatch.setattr(metrics, "READINESS", fresh)
    monkeypatch.setattr(metrics, "_lag", {})
    return fresh


@pytest.fixture
def port(state) -> Iterator[int]:
    """A server on a free port, reading the fresh READINESS."""
    server, thread = serve_metrics(0, "127.0.0.1", ready_timeout=TIMEOUT)
    yield server.server_port
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def one_line(body: str) -> str:
    assert body.endswith("\n") and body.count("\n") == 1, repr(body)
    return body.rstrip("\n")


# ------------------------------------------------------------------------------- /ready


def test_not_ready_before_the_first_epoch_then_ready_after_an_epoch_and_a_contact(port, clock):
    clock.now = 1012.0
    status, body = get(port, "/ready")
    assert status == 503
    assert one_line(body) == (
        "not ready: no epoch completed yet, started 12 s ago; no Kafka broker reached yet"
    )
    note_epoch_completed()
    status, body = get(port, "/ready")
    assert status == 503 and "no epoch" not in body and "no Kafka broker reached yet" in body
    clock.now = 1015.0
    note_broker_contact(True)
    status, body = get(port, "/ready")
    assert status == 200
    assert one_line(body) == "ready: last epoch 3 s ago, Kafka broker reached 0 s ago"


def test_not_ready_while_held_shards_restore_naming_the_count_then_ready(state, port, clock):
    state.restoring = Restoring()
    state.restoring.expect(["shard-000-of-002", "shard-001-of-002"])
    note_epoch_completed()
    note_broker_contact(True)
    state.restoring.note("shard-001-of-002")
    status, body = get(port, "/ready")
    assert status == 503
    assert one_line(body) == "not ready: restoring: 1 of 2 shards"
    state.restoring.note("shard-000-of-002")
    status, body = get(port, "/ready")
    assert status == 200 and "restoring" not in body


def test_the_restore_gauges_count_the_held_and_the_restored_shards(port, monkeypatch):
    restoring = Restoring()
    monkeypatch.setattr(metrics, "RESTORING", restoring)
    restoring.expect(["shard-000-of-002", "shard-001-of-002"])
    restoring.note("shard-000-of-002")
    restoring.note("shard-000-of-003")  # not one of this start's: ignored
    _, body = get(port, "/metrics")
    assert "tsi_shards_held 2.0" in body and "tsi_shards_restored 1.0" in body


def test_not_ready_again_once_the_clock_passes_the_timeout(port, clock):
    note_epoch_completed()
    note_broker_contact(True)
    clock.now += TIMEOUT  # exactly the timeout: still ready
    assert get(port, "/ready")[0] == 200
    clock.now += 1.0
    status, body = get(port, "/ready")
    assert status == 503
    assert one_line(body) == (
        "not ready: no epoch for 31 s (ready timeout 30 s); no Kafka broker reached for 31 s"
    )
    note_epoch_completed()  # the flow moves again, the brokers still silent
    status, body = get(port, "/ready")
    assert status == 503 and one_line(body) == "not ready: no Kafka broker reached for 31 s"
    note_broker_contact(True)
    assert get(port, "/ready")[0] == 200


def test_a_broker_outage_longer_than_the_timeout_is_named_in_the_reason(port, clock):
    note_epoch_completed()
    note_broker_contact(True)
    error = 'KafkaError{code=_TRANSPORT,val=-195,str="kafka:9092/1: Connect failed"}'
    for _ in range(int(TIMEOUT) + 10):  # epochs go on (the source idles); every contact fails
        clock.now += 1.0
        note_epoch_completed()
        note_broker_contact(False, error)
        if clock.now - 1000.0 <= TIMEOUT:  # a short outage does not make it unready
            assert metrics.READINESS.status()[0], clock.now
    status, body = get(port, "/ready")
    assert status == 503
    assert one_line(body) == (
        f"not ready: no Kafka broker reached for 40 s, last error 0 s ago: {error}"
    )
    note_broker_contact(True)  # back
    assert get(port, "/ready")[0] == 200


def test_a_multi_line_error_detail_still_gives_a_one_line_reason(port, clock):
    note_epoch_completed()
    note_broker_contact(False, "first line\nsecond line\n" + "x" * 500)
    status, body = get(port, "/ready")
    reason = one_line(body)
    assert status == 503 and "first line second line" in reason and len(reason) < 300


def test_readiness_changes_are_logged_once_each(state, clock, caplog):
    with caplog.at_level(logging.INFO, logger="flows.service.observe.metrics"):
        for _ in range(3):
            assert state.status()[0] is False
        state.note_epoch()
        state.note_broker(True)
        for _ in range(3):
            assert state.status()[0] is True
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert messages[0].startswith("not ready: no epoch completed yet")
    assert messages[1].startswith("ready: last epoch 0 s ago")
    assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.INFO]


def test_serve_metrics_sets_the_timeout_and_refuses_a_senseless_one(state):
    server, _ = serve_metrics(0, "127.0.0.1", 7.5)
    try:
        assert state.timeout == 7.5
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(ValueError, match="ready_timeout"):
        serve_metrics(0, "127.0.0.1", ready_timeout=0)


def test_a_given_readiness_is_served_instead_of_the_process_one(state, clock):
    own = Readiness(5.0, clock)
    own.note_epoch()
    own.note_broker(True)
    server, _ = serve_metrics(0, "127.0.0.1", 5.0, readiness=own)
    try:
        assert get(server.server_port, "/ready")[0] == 200  # READINESS has no epoch
        assert state.status()[0] is False
    finally:
        server.shutdown()
        server.server_close()


# ------------------------------------------------------------------- /healthz and /metrics


def test_healthz_answers_while_not_ready_and_metrics_are_still_served(port):
    assert get(port, "/ready")[0] == 503
    status, body = get(port, "/healthz")
    assert (status, body) == (200, "alive\n")
    status, body = get(port, "/metrics")
    assert status == 200 and "# TYPE tsi_decisions_total counter" in body


def test_the_progress_gauges_and_tsi_ready_follow_the_notes(port, clock):
    body = get(port, "/metrics")[1]
    assert "tsi_ready 0.0\n" in body
    assert "tsi_last_epoch_timestamp_seconds 0.0\n" in body
    assert "tsi_last_broker_contact_timestamp_seconds 0.0\n" in body
    clock.now = 1234.0
    note_epoch_completed()
    note_broker_contact(True, now=1230.0)
    body = get(port, "/metrics")[1]
    assert "tsi_ready 1.0\n" in body
    assert "tsi_last_epoch_timestamp_seconds 1234.0\n" in body
    assert "tsi_last_broker_contact_timestamp_seconds 1230.0\n" in body
    clock.now = 1234.0 + TIMEOUT + 1
    assert REGISTRY.get_sample_value("tsi_ready") == 0.0


def test_consumer_lag_appears_with_its_labels(port):
    observe_consumer_position("tsi.requests", 3, 90, 125)
    observe_consumer_position("tsi.feedback", 0, 7, 7)
    body = get(port, "/metrics")[1]
    assert "# TYPE tsi_consumer_lag gauge" in body
    assert 'tsi_consumer_lag{partition="3",topic="tsi.requests"} 35.0\n' in body
    assert (
        REGISTRY.get_sample_value("tsi_consumer_lag", {"topic": "tsi.feedback", "partition": "0"})
        == 0.0
    )
    observe_consumer_position("tsi.requests", 3, -1001, 130)  # unknown position: kept
    observe_consumer_position("tsi.requests", 3, 126, -1)  # unknown end: kept
    lag = {"topic": "tsi.requests", "partition": "3"}
    assert REGISTRY.get_sample_value("tsi_consumer_lag", lag) == 35.0
    observe_consumer_position("tsi.requests", 3, 130, 125)  # watermark seen before the read
    assert REGISTRY.get_sample_value("tsi_consumer_lag", lag) == 0.0


def test_a_bad_lag_observation_never_raises(state, caplog):
    with caplog.at_level(logging.WARNING, logger="flows.service.observe.metrics"):
        observe_consumer_position("t", 0, None, 5)  # type: ignore[arg-type]
        observe_kafka_stats("{not json")
        observe_kafka_stats({"brokers": None, "topics": {"t": {"partitions": {"x": {}}}}})
    assert "observe_consumer_position failed" in caplog.text
    assert "observe_kafka_stats failed" in caplog.text
    assert metrics._lag == {}


# --------------------------------------------------------------- librdkafka statistics


def test_kafka_statistics_give_the_contact_and_the_lag(state, clock):
    observe_kafka_stats(STATS_UP, next_offset=4)  # the flow's next offset: 4
    assert state.last_contact == clock.now
    assert metrics._lag == {("statst", 0): 6}  # ls_offset 10 - 4; partitions 1, -1 unassigned
    observe_kafka_stats(STATS_UP)  # without the flow's position: the client's app_offset
    assert metrics._lag == {("statst", 0): 0}


def test_kafka_statistics_without_a_broker_up_are_a_failure_naming_them(state, clock):
    down = {
        **STATS_UP,
        "brokers": {
            "kafka:9092/bootstrap": {
                "name": "kafka:9092/bootstrap",
                "source": "configured",
                "state": "CONNECT",
            },
            "GroupCoordinator": {"name": "GroupCoordinator", "source": "logical", "state": "UP"},
        },
    }
    observe_kafka_stats(down)
    assert state.last_contact is None  # the logical coordinator is no broker
    assert state.last_error == (clock.now, "no Kafka broker up (kafka:9092/bootstrap CONNECT)")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_real_consumer_without_a_broker_reports_the_failure(state, clock):
    seen: list[str] = []

    def stats_cb(json_stats: str) -> None:
        seen.append(json_stats)
        observe_kafka_stats(json_stats, next_offset=5)

    consumer = Consumer(
        {
            "bootstrap.servers": f"127.0.0.1:{closed_port()}",
            "group.id": "BYTEWAX_IGNORED",
            "statistics.interval.ms": 100,
            "stats_cb": stats_cb,
            "log_level": 0,
        }
    )
    try:
        consumer.assign([TopicPartition("x", 0, 5)])
        deadline = time.monotonic() + 20
        while len(seen) < 2 and time.monotonic() < deadline:
            consumer.consume(10, 0.1)
    finally:
        consumer.close()
    assert len(seen) >= 2
    assert state.last_contact is None
    assert state.last_error is not None
    assert state.last_error[1].startswith("no Kafka broker up (127.0.0.1:")
    assert "/bootstrap" in state.last_error[1]
    assert metrics._lag == {}  # no watermark known
    state.note_epoch()
    clock.now += TIMEOUT + 1
    ready, reason = state.status()
    assert not ready and "no Kafka broker reached yet, last error" in reason
    assert "no Kafka broker up (127.0.0.1:" in reason


# ------------------------------------------------------------------------- port in use


def test_a_port_in_use_is_one_line_naming_the_port_and_the_fix(state):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        with pytest.raises(MetricsPortError) as caught:
            serve_metrics(busy, "127.0.0.1")
    error = caught.value
    message = str(error)
    assert "\n" not in message
    assert message.startswith(f"metrics port {busy} is already in use (127.0.0.1:{busy}: ")
    assert message.endswith("; choose another with --metrics-port / TSI_METRICS_PORT")
    assert isinstance(error, OSError) and error.errno == errno.EADDRINUSE
    assert error.__suppress_context__  # no chained traceback of the bind
    assert len(traceback.format_exception_only(error)) == 1
    assert ("127.0.0.1", busy) not in metrics._servers
