"""Where a client finds the service: the brokers, the Kafka settings file and the topics
that ``tsi run`` is given (the same declarations, the same variables and flags), how long
it waits to connect, and how long a decision waits for its answer.

>>> settings = ClientSettings.from_env({"TSI_TOPIC_EVENTS": "ev", "TSI_DECIDE_TIMEOUT": "0.5"})
>>> settings.topics.events, settings.timeout, settings.brokers
('ev', 0.5, '127.0.0.1:9092')
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flows.service.connectors.topics import Topics
from flows.service.runtime.kafka_options import (
    CLIENT_OPTIONS,
    CONNECT_TIMEOUT,
    TOPIC_OPTIONS,
    client_config,
    topics_from_env,
)
from flows.service.runtime.options import Option, seconds

DECIDE_TIMEOUT = Option(
    "TSI_DECIDE_TIMEOUT",
    "--decide-timeout",
    "Seconds a decision waits for its answer before it times out (the gateway answers 504, "
    "the Python client raises DecisionTimeoutError): above the service's p99 with room for the "
    "network.",
    seconds(0.0, above=True),
    "1",
)

#: Every option of a client: ``tsi serve`` takes them, ``ClientSettings.from_env`` reads them.
OPTIONS: tuple[Option, ...] = (
    *CLIENT_OPTIONS,
    *TOPIC_OPTIONS.values(),
    CONNECT_TIMEOUT,
    DECIDE_TIMEOUT,
)


@dataclass(frozen=True)
class ClientSettings:
    """Brokers (comma-joined), librdkafka settings of each side, topics and time-outs."""

    brokers: str = ",".join(CLIENT_OPTIONS[0].read({}))
    topics: Topics = field(default_factory=Topics)
    consumer: dict[str, Any] = field(default_factory=dict)
    producer: dict[str, Any] = field(default_factory=dict)
    connect_timeout: float = CONNECT_TIMEOUT.read({})
    timeout: float = DECIDE_TIMEOUT.read({})

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> ClientSettings:
        """The settings the variables (or ``tsi serve``'s flags) give (``ConfigError``)."""
        brokers, config = (each.read(env) for each in CLIENT_OPTIONS)
        consumer, producer = client_config(config)
        return cls(
            brokers=",".join(brokers),
            topics=topics_from_env(env),
            consumer=consumer,
            producer=producer,
            connect_timeout=CONNECT_TIMEOUT.read(env),
            timeout=DECIDE_TIMEOUT.read(env),
        )
