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
| ``TSI_GROUP_ID`` | consumer group the finished epochs' offsets are committed to | ``tsi`` |
| ``TSI_SKIP_OFFSETS`` | ``TOPIC:PARTITION:OFFSET,...`` messages to skip (as dead letters) | none |
| ``TSI_TS_WINDOW`` | seconds an event's ``ts`` may differ from the wall clock | 10 years |
"""

from __future__ import annotations

import gc
import logging
import os
import re
import signal
import sqlite3
from collections.abc import Mapping
from contextlib import closing
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from bytewax.dataflow import Dataflow
from bytewax.recovery import RecoveryConfig, init_db_dir
from bytewax.run import cli_main
from confluent_kafka import OFFSET_BEGINNING, OFFSET_STORED

from flows.dataflow import Guards, build_flow, parse_skips
from flows.events import DEFAULT_DEAD_LETTER_RAW, DEFAULT_TS_WINDOW, raw_limit_for
from flows.kafka_settings import KafkaSettingsError, load_client_settings
from flows.metrics import note_epoch_completed, serve_metrics
from flows.registry import LiveRegistry, Registry
from flows.wiring import Topics, kafka_wiring

log = logging.getLogger("tsi")
DEFAULT_BROKERS = "127.0.0.1:9092"


class ConfigError(ValueError):
    """A setting of the service is missing or invalid."""


DEFAULT_GROUP = "tsi"


@dataclass(frozen=True)
class Service:
    """Everything the Kafka dataflow needs.

    The registry is held as a ``LiveRegistry``: ``reload_registry`` (SIGHUP in ``run``)
    reads its file again, and the new one applies when the next epoch closes.
    """

    registry: Registry | LiveRegistry
    brokers: list[str]
    topics: Topics = field(default_factory=Topics)
    consumer_config: dict[str, Any] = field(default_factory=dict)
    producer_config: dict[str, Any] = field(default_factory=dict)
    group_id: str | None = DEFAULT_GROUP
    guards: Guards = field(default_factory=Guards)

    def __post_init__(self) -> None:
        if not isinstance(self.registry, LiveRegistry):
            object.__setattr__(self, "registry", LiveRegistry(self.registry))

    def flow(self, tail: bool = True, recovery: bool = True) -> Dataflow:
        """The Kafka dataflow. ``recovery=False`` skips the per-key snapshots and starts
        from the consumer group's committed offsets (the end where it has none)."""
        consumer = dict(self.consumer_config)
        start = OFFSET_BEGINNING  # a fresh recovery store reads the topics from the start
        if not recovery:
            consumer.setdefault("auto.offset.reset", "latest")
            start = OFFSET_STORED
        wiring = kafka_wiring(
            self.brokers,
            self.topics,
            consumer,
            self.producer_config,
            tail=tail,
            group_id=self.group_id,
            starting_offset=start,
            on_epoch=self._epoch_closed,
        )
        return build_flow(self.registry, wiring, snapshots=recovery, guards=self.guards)

    def _epoch_closed(self) -> None:
        note_epoch_completed()
        if self.registry.apply():
            log.warning("the reloaded registry is now in force")

    def reload_registry(self) -> None:
        """Read the registry file again (applied when the next epoch closes); logged."""
        log.warning(self.registry.reload())


def client_config(path: str | Path | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(consumer, producer) librdkafka settings from a TOML file (see `flows.kafka_settings`).

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


#: Bytewax 0.21.1's recovery partitions (``python -m bytewax.recovery DIR N``) and the
#: files sqlite keeps beside them while one is open (write-ahead log, shared memory).
PARTITION_FILE = re.compile(r"part-(\d+)\.sqlite3(-wal|-shm|-journal)?")


def check_recovery_dir(path: str | Path, processes: int = 1) -> list[Path]:
    """The recovery partitions in ``path``, or a one-line `ConfigError` saying what is wrong.

    An empty list: the directory is missing (it can be created) or empty, and `run`
    initialises it. Refused: ``path`` is not a directory or not writable; an entry that is
    not a Bytewax partition (``part-N.sqlite3``, with its ``-wal``/``-shm`` files); a
    partition sqlite cannot read (corrupt) or of another initialisation (a different
    partition count); with one process (``processes == 1``), a missing partition. A
    cluster may spread its partitions over the processes' directories, so then each
    directory may hold some of them.
    """
    directory = Path(path)
    if not directory.exists():
        _check_creatable(directory)
        return []
    if not directory.is_dir():
        raise ConfigError(f"recovery directory {directory} exists but is not a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ConfigError(f"recovery directory {directory} is not writable by this user")
    parts: dict[int, Path] = {}
    for entry in sorted(directory.iterdir()):
        match = PARTITION_FILE.fullmatch(entry.name)
        if match is None or not entry.is_file():
            raise ConfigError(
                f"recovery directory {directory} holds {entry.name!r}, which is not a Bytewax "
                "recovery partition (part-N.sqlite3); give the service a directory of its own"
            )
        if match.group(2) is None:
            parts[int(match.group(1))] = entry
    counts = {index: _partition_count(file, index) for index, file in parts.items()}
    if len(set(counts.values())) > 1:
        found = ", ".join(f"{parts[i].name} of {n}" for i, n in sorted(counts.items()))
        raise ConfigError(
            f"recovery directory {directory} mixes partitions of different initialisations "
            f"({found})"
        )
    count = next(iter(counts.values()), 0)
    missing = [f"part-{i}.sqlite3" for i in range(count) if i not in parts]
    if processes == 1 and missing:
        raise ConfigError(
            f"recovery directory {directory} lacks {', '.join(missing)} of its {count} "
            "partitions (restore them, or start afresh with an empty directory)"
        )
    return [parts[i] for i in sorted(parts)]


def _check_creatable(directory: Path) -> None:
    """Raise unless ``directory`` (missing) can be created: its nearest existing ancestor
    must be a writable directory."""
    ancestor = directory.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
        raise ConfigError(
            f"recovery directory {directory} cannot be created: {ancestor} is not a writable "
            "directory"
        )


def _partition_count(file: Path, index: int) -> int:
    """The partition count recorded in Bytewax partition ``file``.

    Opened read-write (never created) as Bytewax will: a read-only connection would leave
    its -wal and -shm files behind; this one removes them on close.
    """
    if not os.access(file, os.R_OK | os.W_OK):
        raise ConfigError(f"recovery partition {file} is not readable and writable by this user")
    try:
        with closing(sqlite3.connect(f"{file.absolute().as_uri()}?mode=rw", uri=True)) as db:
            rows = db.execute("SELECT part_index, part_count FROM parts").fetchall()
    except sqlite3.Error as exc:
        raise ConfigError(
            f"recovery partition {file} cannot be read by sqlite ({exc}): restore it from a "
            "backup, or start afresh with an empty directory"
        ) from None
    if len(rows) != 1 or rows[0][0] != index:
        raise ConfigError(
            f"recovery partition {file} does not record partition {index} (parts: {rows})"
        )
    return int(rows[0][1])


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
    brokers = env.get("KAFKA_BOOTSTRAP_SERVERS", DEFAULT_BROKERS).split(",")
    return Service(
        LiveRegistry(Registry.load(registry_path), registry_path),
        brokers,
        topics,
        consumer,
        producer,
        env.get("TSI_GROUP_ID", DEFAULT_GROUP) or None,
        guards_from(env.get("TSI_SKIP_OFFSETS", ""), env.get("TSI_TS_WINDOW")),
    )


def guards_from(
    skip: str | list[str], ts_window: str | float | None, dead_letter_raw: int | None = None
) -> Guards:
    """``Guards`` from option or environment values (``ConfigError`` naming a bad one)."""
    specs = [s.strip() for s in skip.split(",")] if isinstance(skip, str) else skip
    try:
        skips = parse_skips([s for s in specs if s])
        window = DEFAULT_TS_WINDOW if ts_window in (None, "") else float(ts_window)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if not window > 0:
        raise ConfigError(f"the ts window must be a positive number of seconds, got {window!r}")
    raw = DEFAULT_DEAD_LETTER_RAW if dead_letter_raw is None else dead_letter_raw
    return Guards(window, raw, skips)


def dead_letter_bound(dlq_max_bytes: int, producer: Mapping[str, Any]) -> int:
    """Original bytes a dead letter may carry: under both the DLQ topic's limit and the
    producer's ``message.max.bytes`` (librdkafka's default 1000000), 64 KiB at most."""
    limit = min(dlq_max_bytes, int(producer.get("message.max.bytes", 1_000_000)))
    return min(DEFAULT_DEAD_LETTER_RAW, raw_limit_for(limit))


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
    ready_timeout: float | None = None,
    on_reload: Any = None,
) -> None:
    """Run the flow in this process (one process of a cluster when ``addresses`` is given).

    With ``recovery_dir`` (created and initialised when empty) state and input offsets are
    snapshotted every ``snapshot_every`` seconds; a restart resumes from the last one.
    With ``metrics_port``, Prometheus metrics are served on it (``/metrics``, ``/ready``
    after ``ready_timeout`` s without progress, ``/healthz``). ``on_reload`` is called on
    SIGHUP (``Service.reload_registry``).
    """
    if on_reload is not None:
        signal.signal(signal.SIGHUP, lambda *_: on_reload())
    recovery = None
    if recovery_dir is not None:
        directory = Path(recovery_dir)
        if not directory.exists() or not any(directory.iterdir()):
            directory.mkdir(parents=True, exist_ok=True)
            init_db_dir(directory, max(1, len(addresses or [None])))
        recovery = RecoveryConfig(str(directory), timedelta(seconds=backup_every))
    if metrics_port is not None:
        timeout = ready_timeout if ready_timeout is not None else max(60.0, 3 * snapshot_every)
        serve_metrics(metrics_port, ready_timeout=timeout)
    settle_heap()
    cli_main(
        flow,
        workers_per_process=workers,
        process_id=process_id,
        addresses=addresses,
        epoch_interval=timedelta(seconds=snapshot_every),
        recovery_config=recovery,
    )
