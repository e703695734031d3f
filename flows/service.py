"""The streaming service: configuration, the Kafka dataflow, and running it.

``python -m bytewax.run flows.main:flow`` and ``tsi run`` start the same flow. Settings
come from options (``tsi run``) or environment variables (``flows.main``):

| variable | meaning | default |
|---|---|---|
| ``TSI_REGISTRY`` | experiments registry (TOML) | required |
| ``KAFKA_BOOTSTRAP_SERVERS`` | brokers, comma-separated | ``127.0.0.1:9092`` |
| ``TSI_KAFKA_CONFIG`` | TOML with ``[kafka]``, ``[kafka.consumer]``, ``[kafka.producer]`` | none |
| ``TSI_TOPIC_REQUESTS`` … ``TSI_TOPIC_DLQ``, ``TSI_TOPIC_EVENTS`` | topic names | ``tsi.*`` |
| ``TSI_STOP_AT_END`` | ``1``: stop at the end of the input topics (replays, tests) | ``0`` |
| ``TSI_METRICS_PORT`` | serve Prometheus metrics on this port (see ``flows.metrics``) | off |
"""

from __future__ import annotations

import gc
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from bytewax.dataflow import Dataflow
from bytewax.recovery import RecoveryConfig, init_db_dir
from bytewax.run import cli_main

from flows.dataflow import build_flow
from flows.metrics import serve_metrics
from flows.registry import Registry
from flows.wiring import Topics, kafka_wiring


class ConfigError(ValueError):
    """A setting of the service is missing or invalid."""


@dataclass(frozen=True)
class Service:
    """Everything the Kafka dataflow needs."""

    registry: Registry
    brokers: list[str]
    topics: Topics = field(default_factory=Topics)
    consumer_config: dict[str, Any] = field(default_factory=dict)
    producer_config: dict[str, Any] = field(default_factory=dict)

    def flow(self, tail: bool = True, recovery: bool = True) -> Dataflow:
        """The Kafka dataflow; ``recovery=False`` skips the per-key snapshots."""
        wiring = kafka_wiring(
            self.brokers, self.topics, self.consumer_config, self.producer_config, tail=tail
        )
        return build_flow(self.registry, wiring, snapshots=recovery)


def client_config(path: str | Path | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(consumer, producer) librdkafka settings from a TOML file, passed through untouched.

    ``[kafka]`` applies to both; ``[kafka.consumer]`` and ``[kafka.producer]`` to one.
    """
    if path is None:
        return {}, {}
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read Kafka config {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"Kafka config {path} is not valid TOML: {exc}") from None
    table = data.get("kafka", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [kafka] must be a table")
    common = {k: v for k, v in table.items() if not isinstance(v, dict)}
    sides = []
    for side in ("consumer", "producer"):
        extra = table.get(side, {})
        if not isinstance(extra, dict):
            raise ConfigError(f"{path}: [kafka.{side}] must be a table")
        sides.append({**common, **extra})
    for settings in sides:
        for key, value in settings.items():
            if not isinstance(value, str | int | float | bool):
                raise ConfigError(f"{path}: Kafka setting {key!r} must be a scalar, got {value!r}")
    return sides[0], sides[1]


def service_from_env(env: Mapping[str, str] = os.environ) -> Service:
    """The service described by environment variables (see the module docstring)."""
    registry_path = env.get("TSI_REGISTRY")
    if not registry_path:
        raise ConfigError("set TSI_REGISTRY to the experiments registry (a TOML file)")
    consumer, producer = client_config(env.get("TSI_KAFKA_CONFIG"))
    topics = Topics(
        requests=env.get("TSI_TOPIC_REQUESTS", Topics.requests),
        feedback=env.get("TSI_TOPIC_FEEDBACK", Topics.feedback),
        selections=env.get("TSI_TOPIC_SELECTIONS", Topics.selections),
        dead_letters=env.get("TSI_TOPIC_DLQ", Topics.dead_letters),
        events=env.get("TSI_TOPIC_EVENTS") or None,
    )
    brokers = env.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092").split(",")
    return Service(Registry.load(registry_path), brokers, topics, consumer, producer)


def metrics_port_from_env(env: Mapping[str, str] = os.environ) -> int | None:
    """The port of ``TSI_METRICS_PORT``, or None when it is unset or empty (no metrics)."""
    value = env.get("TSI_METRICS_PORT", "").strip()
    if not value:
        return None
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise ConfigError(f"TSI_METRICS_PORT must be a port number, got {value!r}")
    return int(value)


def settle_heap() -> None:
    """Exempt everything alive at start-up (modules, registry, flow) from cyclic GC scans.

    Full collections walk every tracked object; the imported libraries are most of them at
    start. Freezing them shortens every later full collection (a latency tail of the
    service) and costs nothing: they live as long as the process anyway.
    """
    gc.collect()
    gc.freeze()


def run(
    flow: Dataflow,
    workers: int = 1,
    process_id: int | None = None,
    addresses: list[str] | None = None,
    recovery_dir: str | Path | None = None,
    snapshot_every: float = 10.0,
    backup_every: float = 0.0,
    metrics_port: int | None = None,
) -> None:
    """Run the flow in this process (one process of a cluster when ``addresses`` is given).

    With ``recovery_dir`` (created and initialised when empty) state and input offsets are
    snapshotted every ``snapshot_every`` seconds; a restart resumes from the last one.
    With ``metrics_port``, Prometheus metrics are served on it (``/metrics``).
    """
    recovery = None
    if recovery_dir is not None:
        directory = Path(recovery_dir)
        if not directory.exists() or not any(directory.iterdir()):
            directory.mkdir(parents=True, exist_ok=True)
            init_db_dir(directory, max(1, len(addresses or [None])))
        recovery = RecoveryConfig(str(directory), timedelta(seconds=backup_every))
    if metrics_port is not None:
        serve_metrics(metrics_port)
    settle_heap()
    cli_main(
        flow,
        workers_per_process=workers,
        process_id=process_id,
        addresses=addresses,
        epoch_interval=timedelta(seconds=snapshot_every),
        recovery_config=recovery,
    )
