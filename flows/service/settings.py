"""The service's settings: one object, read from ``tsi run``'s options or from the
environment alike (each option has the environment variable below).

| variable | meaning | default |
|---|---|---|
| ``TSI_REGISTRY`` | experiments registry (TOML) | required |
| ``KAFKA_BOOTSTRAP_SERVERS`` | brokers, comma-separated | ``127.0.0.1:9092`` |
| ``TSI_KAFKA_CONFIG`` | TOML with ``[kafka]``, ``[kafka.consumer]``, ``[kafka.producer]`` | none |
| ``TSI_TOPIC_REQUESTS`` … ``_DLQ``, ``_EVENTS``, ``_INTERNAL`` | topic names | ``tsi.*`` |
| ``TSI_RECOVERY_DIR`` / ``TSI_NO_RECOVERY`` | recovery directory, or running without one | |
| ``TSI_STOP_AT_END`` | ``1``: stop at the end of the input topics (replays, tests) | ``0`` |
| ``TSI_METRICS_PORT`` | serve metrics, ``/ready`` and ``/healthz`` on this port | off |
| ``TSI_METRICS_HOST`` | the address they are served on (``127.0.0.1``: local only) | ``0.0.0.0`` |
| ``TSI_READY_TIMEOUT`` | seconds without progress before ``/ready`` fails | 60 |
| ``TSI_GROUP_ID`` | consumer group the finished epochs' offsets are committed to | ``tsi`` |
| ``TSI_SKIP_OFFSETS`` | ``TOPIC:PARTITION:OFFSET,...`` messages to skip (as dead letters) | none |
| ``TSI_TS_WINDOW`` | seconds an event's ``ts`` may differ from the wall clock | 10 years |
| ``TSI_MALLOC_TRIM`` | seconds between hand-backs of freed memory (0: never) | 10 |

>>> Settings.from_env({"TSI_REGISTRY": "r.toml", "TSI_GROUP_ID": "g"}).group_id
'g'
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flows.service.allocator import TRIM_EVERY
from flows.service.connectors.kafka import Topics
from flows.service.connectors.kafka_config import KafkaSettingsError, load_client_settings
from flows.service.dataflow import Guards, parse_skips
from flows.service.events import DEFAULT_DEAD_LETTER_RAW, DEFAULT_TS_WINDOW, raw_limit_for
from flows.service.metrics import DEFAULT_HOST as DEFAULT_METRICS_HOST

DEFAULT_BROKERS = "127.0.0.1:9092"
DEFAULT_GROUP = "tsi"


class ConfigError(ValueError):
    """A setting of the service is missing or invalid."""


@dataclass(frozen=True)
class Settings:
    """What the service is told to do (``tsi run``'s options, or the environment)."""

    registry: Path
    brokers: list[str] = field(default_factory=lambda: DEFAULT_BROKERS.split(","))
    kafka_config: Path | None = None
    topics: Topics = field(default_factory=Topics)
    recovery_dir: Path | None = None
    no_recovery: bool = False
    processes: int = 1
    connect_timeout: float = 10.0
    group_id: str | None = DEFAULT_GROUP
    skip_offsets: list[str] = field(default_factory=list)
    ts_window: float | None = None
    stop_at_end: bool = False
    metrics_port: int | None = None
    ready_timeout: float | None = None
    fresh: bool = False  # accept an empty recovery store although the group made progress
    malloc_trim: float = TRIM_EVERY  # seconds between hand-backs of freed memory (allocator)
    rebuild: bool = False  # rebuild the state from the inputs' start into an empty store
    metrics_host: str = DEFAULT_METRICS_HOST  # the address metrics and probes are served on

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Settings:
        """The settings the ``TSI_*`` variables describe (``ConfigError`` naming a bad one)."""
        registry = env.get("TSI_REGISTRY")
        if not registry:
            raise ConfigError("set TSI_REGISTRY to the experiments registry (a TOML file)")
        topics = Topics(
            requests=env.get("TSI_TOPIC_REQUESTS", Topics.requests),
            feedback=env.get("TSI_TOPIC_FEEDBACK", Topics.feedback),
            selections=env.get("TSI_TOPIC_SELECTIONS", Topics.selections),
            dead_letters=env.get("TSI_TOPIC_DLQ", Topics.dead_letters),
            events=env.get("TSI_TOPIC_EVENTS") or None,
            internal=env.get("TSI_TOPIC_INTERNAL", Topics.internal) or None,
        )
        return cls(
            Path(registry),
            env.get("KAFKA_BOOTSTRAP_SERVERS", DEFAULT_BROKERS).split(","),
            Path(env["TSI_KAFKA_CONFIG"]) if env.get("TSI_KAFKA_CONFIG") else None,
            topics,
            Path(env["TSI_RECOVERY_DIR"]) if env.get("TSI_RECOVERY_DIR") else None,
            env.get("TSI_NO_RECOVERY", "0") == "1",
            group_id=env.get("TSI_GROUP_ID", DEFAULT_GROUP) or None,
            skip_offsets=env.get("TSI_SKIP_OFFSETS", "").split(","),
            ts_window=_number(env, "TSI_TS_WINDOW"),
            stop_at_end=env.get("TSI_STOP_AT_END", "0") == "1",
            metrics_port=_port(env.get("TSI_METRICS_PORT", "")),
            ready_timeout=_number(env, "TSI_READY_TIMEOUT"),
            malloc_trim=_seconds(env, "TSI_MALLOC_TRIM", TRIM_EVERY),
            rebuild=env.get("TSI_REBUILD", "0") == "1",
            metrics_host=env.get("TSI_METRICS_HOST", "").strip() or DEFAULT_METRICS_HOST,
        )

    def guards(self, dead_letter_raw: int | None = None) -> Guards:
        """The flow's ``Guards`` (``ConfigError`` naming a bad skip or window)."""
        specs = [part.strip() for item in self.skip_offsets for part in item.split(",")]
        try:
            skips = parse_skips([s for s in specs if s])
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        window = DEFAULT_TS_WINDOW if self.ts_window is None else self.ts_window
        if not window > 0:
            raise ConfigError(f"the ts window must be a positive number of seconds, got {window}")
        raw = DEFAULT_DEAD_LETTER_RAW if dead_letter_raw is None else dead_letter_raw
        return Guards(window, raw, skips)

    def ready_after(self, snapshot_every: float) -> float:
        """Seconds without progress before ``/ready`` fails: well above an epoch."""
        if self.ready_timeout is not None:
            return self.ready_timeout
        return max(60.0, 3 * snapshot_every)


def _number(env: Mapping[str, str], name: str) -> float | None:
    value = env.get(name, "").strip()
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {value!r}") from None


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    """A number of seconds, 0 or more (``default`` when unset)."""
    value = _number(env, name)
    if value is None:
        return default
    if not value >= 0:
        raise ConfigError(f"{name} must be 0 or more seconds, got {value}")
    return value


def _port(value: str) -> int | None:
    """A port number, or None when unset or empty (no metrics)."""
    value = value.strip()
    if not value:
        return None
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise ConfigError(f"TSI_METRICS_PORT must be a port number, got {value!r}")
    return int(value)


def client_config(path: str | Path | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(consumer, producer) librdkafka settings from a TOML file (see ``kafka_config``).

    ``[kafka]`` applies to both; ``[kafka.consumer]`` and ``[kafka.producer]`` to one (they
    win over ``[kafka]``). Dotted keys may be quoted or not; every setting is checked by
    librdkafka (unknown name, bad value, wrong side: one-line `ConfigError`).
    """
    if path is None:
        return {}, {}
    try:
        return load_client_settings(path)
    except KafkaSettingsError as exc:
        raise ConfigError(str(exc)) from None


def dead_letter_bound(dlq_max_bytes: int, producer: Mapping[str, Any]) -> int:
    """Original bytes a dead letter may carry: under both the DLQ topic's limit and the
    producer's ``message.max.bytes`` (librdkafka's default 1000000), 64 KiB at most."""
    limit = min(dlq_max_bytes, int(producer.get("message.max.bytes", 1_000_000)))
    return min(DEFAULT_DEAD_LETTER_RAW, raw_limit_for(limit))
