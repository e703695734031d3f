"""A running ``tsi run`` on the real broker for the client's and the gateway's tests."""

from __future__ import annotations

import urllib.error
import urllib.request

import orjson

from flows.client import ClientSettings
from flows.service.connectors.topics import Topics
from flows.testing.kafka_broker import create_topic, free_port, unique_topic
from tests.service.test_first_hour import metric, scrape
from tests.service.test_operating import service_topics, start
from tests.waiting import wait_for

REGISTRY = """
[experiments.shop]
arms = ["a", "b", "c"]
feedback_ttl = 600

[experiments.basket]
arms = ["x", "y"]
per_unit = true
aggregate = "sum"
feedback_ttl = 600

[experiments.banner]
arms = ["wide", "narrow"]
contexts = { device = ["ios", "web"] }
feedback_ttl = 600

[experiments.promo]
arms = ["off", "on"]
force_arm = "on"

[experiments.floor]
arms = ["good", "bad"]
min_share = 0.3
feedback_ttl = 600
"""


class Service:
    """``tsi run`` on its own topics (the combined events topic), with its metrics."""

    def __init__(self, bootstrap: str, tmp_path) -> None:
        self.bootstrap = bootstrap
        self.names = service_topics(bootstrap, partitions=3)
        registry = tmp_path / "registry.toml"
        registry.write_text(REGISTRY)
        self.registry = registry
        self.metrics_port = free_port()
        self.options = [
            *("--brokers", bootstrap, "--events-topic", self.names["ev"]),
            *("--selections-topic", self.names["sel"], "--dlq-topic", self.names["dlq"]),
        ]
        self.proc = start(
            "--registry", registry, *self.options, "--snapshot-every", "0.5",
            "--recovery-dir", tmp_path / "rec", "--metrics-port", self.metrics_port,
            log_file=tmp_path / "run.log",
        )  # fmt: skip
        wait_for(lambda: scrape(self.metrics_port, "/ready")[0] == 200, self.proc, what="ready")

    def settings(self, events: str | None = None, **given) -> ClientSettings:
        """A client's settings for this service (or for ``events``, another input topic)."""
        topics = Topics(
            events=events or self.names["ev"],
            selections=self.names["sel"],
            dead_letters=self.names["dlq"],
        )
        return ClientSettings(brokers=self.bootstrap, topics=topics, **given)

    def unserved(self) -> str:
        """An events topic no service reads."""
        return create_topic(self.bootstrap, unique_topic("nobody"), 1)

    def metric(self, prefix: str) -> float:
        return metric(scrape(self.metrics_port)[1], prefix)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def post(port: int, path: str, body: object, timeout: float = 30) -> tuple[int, dict]:
    """(status, JSON body) of a POST to the gateway on ``port``."""
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data, {"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, orjson.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, orjson.loads(exc.read())


def get(port: int, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, orjson.loads(answer.read())
    except urllib.error.URLError:
        return 0, {}
