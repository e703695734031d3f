"""Kafka client settings (connectors.kafka_config): the TOML file, masking, bounded logs."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from confluent_kafka import KafkaError

from flows.service.connectors.kafka_config import (
    RateLimitFilter,
    describe_settings,
    flatten,
    is_secret,
    kafka_logger,
    settings_lines,
    with_rate_limited_logs,
)
from flows.service.runtime.settings import ConfigError, client_config
from flows.testing.kafka_broker import free_port

ROOT = Path(__file__).resolve().parents[2]


def load(tmp_path: Path, text: str) -> tuple[dict, dict]:
    path = tmp_path / "kafka.toml"
    path.write_text(text)
    return client_config(path)


def refusal(tmp_path: Path, text: str) -> str:
    """The one-line ConfigError a settings file gets."""
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    message = str(info.value)
    assert "\n" not in message and str(tmp_path / "kafka.toml") in message
    return message


# ----------------------------------------------------------------------------- the file
def test_unquoted_dotted_keys_are_the_same_settings_as_quoted_ones(tmp_path):
    quoted = load(
        tmp_path,
        '[kafka]\n"security.protocol" = "SASL_SSL"\n"sasl.mechanism" = "PLAIN"\n'
        '[kafka.consumer]\n"fetch.min.bytes" = 1\n[kafka.producer]\n"linger.ms" = 2\n',
    )
    dotted = load(
        tmp_path,
        '[kafka]\nsecurity.protocol = "SASL_SSL"\nsasl.mechanism = "PLAIN"\n'
        "[kafka.consumer]\nfetch.min.bytes = 1\n[kafka.producer]\nlinger.ms = 2\n",
    )
    assert dotted == quoted
    assert dotted[0] == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "fetch.min.bytes": 1,
    }
    assert dotted[1] == {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "linger.ms": 2}


def test_inline_tables_flatten_and_a_side_wins_over_kafka(tmp_path):
    consumer, producer = load(
        tmp_path,
        '[kafka]\nssl = { ca.location = "/ca.pem" }\nclient.id = "both"\n'
        '[kafka.producer]\nclient.id = "writer"\ncompression = { type = "lz4" }\n',
    )
    assert consumer == {"ssl.ca.location": "/ca.pem", "client.id": "both"}
    assert producer == {
        "ssl.ca.location": "/ca.pem",
        "client.id": "writer",
        "compression.type": "lz4",
    }


def test_only_consumer_and_producer_right_under_kafka_are_side_tables():
    # a "consumer" deeper down is part of a dotted name, not a side table
    assert flatten({"a": {"consumer": {"b": 1}}}, "x") == {"a.consumer.b": 1}


def test_the_shipped_kubernetes_example_is_accepted(tmp_path):
    secret = yaml.safe_load((ROOT / "deploy/k8s/secret-kafka.yaml").read_text())
    consumer, producer = load(tmp_path, secret["stringData"]["kafka.toml"])
    assert consumer["security.protocol"] == producer["security.protocol"] == "SASL_SSL"
    assert consumer["sasl.mechanism"] == "SCRAM-SHA-512"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[kafka.consumer]\nfetch.min.byte = 1\n", "[kafka.consumer]: unknown Kafka setting"),
        ('[kafka]\nsecurity.protocoll = "SSL"\n', "'security.protocoll'"),
        ('[kafka]\n"sasl.mechanisms.x" = "PLAIN"\n', "No such configuration property"),
        ('[kafka]\nacks = "sometimes"\n', "invalid value 'sometimes'"),
        ('[kafka]\nsecurity.protocol = "TLS"\n', "invalid value 'TLS'"),
        ('[kafka.producer]\ngroup.id = "g"\n', "'group.id' is a consumer setting"),
        ("[kafka]\nlinger.ms = 5\n", "move it to [kafka.producer]"),
        ('[kafka.consumer]\nacks = "all"\n', "'acks' is a producer setting"),
        ('[kafka]\nbootstrap.servers = "h:9092"\n', "--brokers"),
        ('[kafak]\n"client.id" = "x"\n', "unknown table or key 'kafak'"),
        ('[kafka]\n"client.id" = "a"\nclient.id = "b"\n', "'client.id' is set twice"),
        ("[kafka]\nsocket = { timeout.ms = [1] }\n", "'socket.timeout.ms' must be a scalar"),
        ("[kafka]\nx = 1979-05-27\n", "must be a scalar"),
        ("[[kafka.consumer]]\nx = 1\n", "[kafka.consumer] must be a table"),
        ('[kafka]\nerror_cb = "print"\n', "invalid value 'print' for Kafka setting 'error_cb'"),
        ("[kafka\n", "not valid TOML"),
    ],
)
def test_a_setting_librdkafka_refuses_is_one_line_naming_it(tmp_path, text, expected):
    assert expected in refusal(tmp_path, text)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"cannot read Kafka config .*nope\.toml"):
        client_config(tmp_path / "nope.toml")


# --------------------------------------------------------------------------- masking
SECRETS = {
    "sasl.password": "pw-1",
    "ssl.key.password": "pw-2",
    "ssl.keystore.password": "pw-3",
    "sasl.oauthbearer.client.secret": "pw-4",
    "ssl.key.pem": "-----BEGIN PRIVATE KEY-----pw-5",
    "sasl.oauthbearer.config": "principal=me secret=pw-6",
    "sasl.jaas.config": "org.apache...PlainLoginModule password=pw-7",
    "sasl.oauthbearer.extensions": "token=pw-8",
    "sasl.oauthbearer.assertion.private.key.passphrase": "pw-9",
    "https.token": "pw-10",
}
PLAIN = {
    "bootstrap.servers": "b1:9092,b2:9092",
    "sasl.username": "tsi",
    "ssl.ca.location": "/etc/tsi/kafka/ca.crt",
    "ssl.key.location": "/etc/tsi/kafka/tls.key",
    "enable.idempotence": True,
}


def test_effective_settings_are_logged_with_every_secret_masked():
    lines = settings_lines({**SECRETS, **PLAIN}, {"acks": "all", "sasl.password": "pw-1"})
    assert len(lines) == 2
    consumer, producer = lines
    assert (
        consumer.startswith("consumer: ") and producer == "producer: acks=all, sasl.password=****"
    )
    assert "pw-" not in consumer
    for name in SECRETS:
        assert f"{name}=****" in consumer
    assert "bootstrap.servers=b1:9092,b2:9092" in consumer
    assert "sasl.username=tsi" in consumer and "enable.idempotence=true" in consumer
    assert "ssl.key.location=/etc/tsi/kafka/tls.key" in consumer  # a path, not the key


def test_secret_names_are_recognised_whatever_their_case():
    assert is_secret("SASL.PASSWORD") and is_secret("ssl_key")
    assert not any(is_secret(name) for name in PLAIN)


def test_callables_in_a_config_are_shown_by_name_not_repr():
    config = with_rate_limited_logs({"client.id": "x"})
    line = describe_settings("producer", config)
    assert "logger=<logger tsi.kafka>" in line and "error_cb=<" in line and " at 0x" not in line
    assert describe_settings("consumer", {}) == "consumer: (librdkafka defaults)"


# -------------------------------------------------------------------- bounded logging
class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def limited():
    """(logger with a RateLimitFilter on a fake clock, the messages it lets out, the clock)."""
    clock = Clock()
    logger = logging.getLogger(f"tsi.test.limit.{id(clock)}")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    out: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: out.append(record.getMessage())
    logger.addHandler(handler)
    limit = RateLimitFilter(burst=2, interval=60.0, clock=clock)
    logger.addFilter(limit)
    yield logger, out, clock, limit
    logger.removeHandler(handler)


def fail_line(port: int) -> tuple[str, str, str]:
    """The (facility, client, message) confluent_kafka logs for a refused connection."""
    text = f"127.0.0.1:{port}/bootstrap: Connect to ipv4#127.0.0.1:{port} failed: refused"
    return ("FAIL", "rdkafka#producer-1", text)


def test_repeats_beyond_the_burst_are_counted_and_summarised(limited):
    logger, out, clock, _ = limited
    for i in range(10):
        logger.error("%s [%s] %s", *fail_line(9000 + i))  # ports differ: same pattern
        clock.now += 1.0
    assert len(out) == 2
    clock.now = 1000.0 + 61
    logger.error("%s [%s] %s", *fail_line(9999))
    assert len(out) == 4
    assert out[2].startswith("suppressed 8 similar messages in the last 61 s: FAIL ")
    assert "9009" in out[2]  # the last one cut
    assert out[3].endswith("ipv4#127.0.0.1:9999 failed: refused")


def test_each_pattern_has_its_own_budget_and_flush_reports_the_rest(limited):
    logger, out, _, limit = limited
    for _ in range(5):
        logger.warning("%s [%s] %s", "FAIL", "c", "connection refused")
        logger.warning("%s [%s] %s", "REQTMOUT", "c", "timed out 1 requests")
        logger.warning("plain message %d", 7)
    assert len(out) == 6
    limit.flush()
    assert (
        sorted(line.split(":")[0] for line in out[6:])
        == ["suppressed 3 similar messages in the last 0 s"] * 3
    )
    limit.flush()
    assert len(out) == 9  # nothing pending any more


def test_kafka_logger_gets_one_filter_however_often_it_is_asked_for():
    name = "tsi.test.kafka_logger"
    assert kafka_logger(name) is kafka_logger(name)
    assert sum(isinstance(f, RateLimitFilter) for f in kafka_logger(name).filters) == 1


def test_error_callbacks_are_logged_and_an_existing_one_still_called(limited):
    logger, out, _, _ = limited
    seen: list[KafkaError] = []
    config = with_rate_limited_logs({"error_cb": seen.append, "acks": "all"}, logger)
    assert config["acks"] == "all" and config["logger"] is logger
    error = KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down")
    config["error_cb"](error)
    assert seen == [error]
    assert out == ["ERROR [_ALL_BROKERS_DOWN] 1/1 brokers are down"]


OUTAGE = """
import sys, time
from confluent_kafka import Producer
from flows.service.connectors.kafka_config import with_rate_limited_logs
config = {"bootstrap.servers": "127.0.0.1:" + sys.argv[2]}
if sys.argv[1] == "limited":
    config = with_rate_limited_logs(config)
producer = Producer(config)
producer.produce("t", b"x")  # wants a connection all along
end = time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:
    producer.poll(0.1)
"""


def test_a_broker_outage_writes_a_handful_of_lines_not_a_flood():
    """The same producer against a closed port for 5 s, with and without the filter."""
    port = free_port()  # nothing listens: every connection attempt is refused
    runs = {
        mode: subprocess.Popen(
            [sys.executable, "-c", OUTAGE, mode, str(port), "5"],
            cwd=ROOT,
            stderr=subprocess.PIPE,
            text=True,
        )
        for mode in ("plain", "limited")
    }
    stderr = {mode: proc.communicate(timeout=60)[1] for mode, proc in runs.items()}
    assert all(proc.returncode == 0 for proc in runs.values()), stderr
    plain, limited = (stderr[m].splitlines() for m in ("plain", "limited"))
    refused = [line for line in plain if "Connection refused" in line]
    assert len(refused) >= 10, plain  # librdkafka alone: several lines a second (~4)
    assert 1 <= len(limited) <= 6 and 2 * len(limited) < len(refused), limited
    assert sum("Connection refused" in line for line in limited) == 3  # the burst
