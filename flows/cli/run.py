"""``tsi run``: the streaming service on Kafka (see README "Operating it")."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import typer

from flows.cli.base import (
    BROKERS,
    DLQ_TOPIC,
    EVENTS_TOPIC,
    FEEDBACK_TOPIC,
    INTERNAL_TOPIC,
    KAFKA_CONFIG,
    REQUESTS_TOPIC,
    SELECTIONS_TOPIC,
    app,
    fail,
)
from flows.service.allocator import TRIM_EVERY
from flows.service.connectors.kafka import Topics
from flows.service.dir_lock import hold_directory
from flows.service.metrics import MetricsPortError
from flows.service.process import run as run_flow
from flows.service.settings import DEFAULT_GROUP, DEFAULT_METRICS_HOST, ConfigError, Settings
from flows.service.shard_log import MIN_EPOCHS
from flows.service.startup import ServiceLog, StartupError, describe_start, prepare
from flows.service.stopping import Stop

REGISTRY_OPTION = typer.Option(
    ..., envvar="TSI_REGISTRY", help="Experiments registry (TOML); SIGHUP reloads it."
)
RECOVERY_DIR_OPTION = typer.Option(
    None, envvar="TSI_RECOVERY_DIR", help="Recovery directory (state survives restarts)."
)
NO_RECOVERY_OPTION = typer.Option(
    False,
    "--no-recovery",
    envvar="TSI_NO_RECOVERY",
    help="Run without a recovery directory: state starts empty at every start and the "
    "input resumes from the consumer group's committed offsets (else the topics' end).",
)
SNAPSHOT_EVERY_OPTION = typer.Option(
    10.0, min=0.01, envvar="TSI_SNAPSHOT_EVERY", help="Seconds between snapshots."
)
KEPT_EPOCHS = MIN_EPOCHS - 2  # a commit may lag this many snapshots behind the newest
BACKUP_EVERY_OPTION = typer.Option(
    0.0,
    min=0.0,
    help="Seconds old snapshots are kept after a newer one is committed "
    "(raise it when the recovery directory is copied to durable storage).",
)
WORKERS_OPTION = typer.Option(
    1, min=1, envvar="TSI_WORKERS", help="Worker threads in this process."
)
PROCESS_ID_OPTION = typer.Option(
    None, min=0, envvar="TSI_PROCESS_ID", help="This process's index in a cluster."
)
ADDRESSES_OPTION = typer.Option(
    None, envvar="TSI_ADDRESSES", help="Cluster addresses 'host:port;host:port'."
)
CONNECT_TIMEOUT_OPTION = typer.Option(
    10.0, min=0.1, help="Seconds to wait for a broker to answer at start."
)
STOP_AT_END_OPTION = typer.Option(
    False,
    envvar="TSI_STOP_AT_END",
    help="Stop at the end of the input topics instead of waiting for more.",
)
METRICS_PORT_OPTION = typer.Option(
    None,
    min=1,
    max=65535,
    envvar="TSI_METRICS_PORT",
    help="Serve Prometheus metrics (/metrics), readiness (/ready) and liveness "
    "(/healthz) on this port; off by default.",
)
METRICS_HOST_OPTION = typer.Option(
    DEFAULT_METRICS_HOST,
    envvar="TSI_METRICS_HOST",
    help="Address the metrics and probes are served on: 0.0.0.0 (default) is every IPv4 "
    "interface, as container and Kubernetes probes need; 127.0.0.1 keeps them on this host.",
)
READY_TIMEOUT_OPTION = typer.Option(
    None,
    min=1.0,
    envvar="TSI_READY_TIMEOUT",
    help="/ready fails after this many seconds without a finished epoch or a broker "
    "reached (default: 60, or 3 snapshot intervals if longer).",
)
GROUP_ID_OPTION = typer.Option(
    DEFAULT_GROUP,
    envvar="TSI_GROUP_ID",
    help="Consumer group the offsets of finished epochs are committed to (lag for "
    "standard tools; recovery uses the recovery directory).",
)
SKIP_OFFSET_OPTION = typer.Option(
    [],
    envvar="TSI_SKIP_OFFSETS",
    help="TOPIC:PARTITION:OFFSET of a message to skip: it becomes a 'skipped' dead "
    "letter (with its bytes) and changes nothing. Repeat, or comma-separate.",
)
TS_WINDOW_OPTION = typer.Option(
    None,
    envvar="TSI_TS_WINDOW",
    help="Seconds an event's ts may differ from the wall clock (default 10 years).",
)
FRESH_OPTION = typer.Option(
    False,
    "--fresh",
    envvar="TSI_FRESH",
    help="Accept an empty recovery directory although the consumer group made progress: "
    "state starts empty and the input resumes from the group's offsets (without it, tsi "
    "run refuses to start over silently).",
)
REBUILD_OPTION = typer.Option(
    False,
    "--rebuild",
    envvar="TSI_REBUILD",
    help="The way out of a damaged recovery directory: start from an empty one (move the "
    "damaged one aside) and rebuild every bandit's state by reading the inputs from their "
    "start, as far as the broker still holds them; answers already sent are sent again, "
    "identical.",
)
MALLOC_TRIM_OPTION = typer.Option(
    TRIM_EVERY,
    "--malloc-trim",
    envvar="TSI_MALLOC_TRIM",
    min=0.0,
    help="Seconds between hand-backs of freed memory to the system (glibc malloc_trim; 0: never).",
)
LOG_FILE_OPTION = typer.Option(
    None,
    envvar="TSI_LOG_FILE",
    help="Write logs here (default: tsi-run.log when stderr is a terminal, else stderr).",
)


RESTART = 3  # the exit status asking a supervisor to start the service again


@app.command("run")
def run_service(
    registry: Path = REGISTRY_OPTION,
    brokers: str = BROKERS,
    kafka_config: Path | None = KAFKA_CONFIG,
    requests_topic: str = REQUESTS_TOPIC,
    feedback_topic: str = FEEDBACK_TOPIC,
    events_topic: str | None = EVENTS_TOPIC,
    selections_topic: str = SELECTIONS_TOPIC,
    dlq_topic: str = DLQ_TOPIC,
    internal_topic: str = INTERNAL_TOPIC,
    recovery_dir: Path | None = RECOVERY_DIR_OPTION,
    no_recovery: bool = NO_RECOVERY_OPTION,
    snapshot_every: float = SNAPSHOT_EVERY_OPTION,
    backup_every: float = BACKUP_EVERY_OPTION,
    workers: int = WORKERS_OPTION,
    process_id: int | None = PROCESS_ID_OPTION,
    addresses: str | None = ADDRESSES_OPTION,
    connect_timeout: float = CONNECT_TIMEOUT_OPTION,
    stop_at_end: bool = STOP_AT_END_OPTION,
    metrics_port: int | None = METRICS_PORT_OPTION,
    metrics_host: str = METRICS_HOST_OPTION,
    ready_timeout: float | None = READY_TIMEOUT_OPTION,
    group_id: str = GROUP_ID_OPTION,
    skip_offset: list[str] = SKIP_OFFSET_OPTION,
    ts_window: float | None = TS_WINDOW_OPTION,
    fresh: bool = FRESH_OPTION,
    rebuild: bool = REBUILD_OPTION,
    malloc_trim: float = MALLOC_TRIM_OPTION,
    log_file: Path | None = LOG_FILE_OPTION,
) -> None:
    """Serve decisions from Kafka: requests and feedback in, selections and dead letters out.

    Everything is checked first (registry, Kafka settings, brokers, every topic read or
    written, the recovery directory); a problem is one line and exit status 2.
    """
    _check_options(process_id, addresses, snapshot_every, backup_every)
    cluster = None if addresses is None else addresses.split(";")
    names = (requests_topic, feedback_topic, selections_topic, dlq_topic, events_topic)
    settings = Settings(
        registry,
        brokers.split(","),
        kafka_config,
        Topics(*names, internal_topic or None),
        recovery_dir,
        no_recovery,
        len(cluster or [None]),
        connect_timeout,
        group_id or None,
        skip_offset,
        ts_window,
        stop_at_end,
        metrics_port,
        ready_timeout,
        fresh,
        malloc_trim,
        rebuild=rebuild,
        metrics_host=metrics_host,
    )
    serve(settings, Cluster(workers, process_id, cluster), snapshot_every, backup_every, log_file)


def _check_options(
    process_id: int | None, addresses: str | None, snapshot_every: float, backup_every: float
) -> None:
    """Refuse options that contradict each other (one line, exit status 2)."""
    if (process_id is None) != (addresses is None):
        fail("run", "--process-id and --addresses go together")
    if backup_every > KEPT_EPOCHS * snapshot_every:
        fail(
            "run",
            f"--backup-every must stay within {KEPT_EPOCHS} snapshots ({KEPT_EPOCHS} x "
            f"--snapshot-every = {KEPT_EPOCHS * snapshot_every:g} s): the shards' logs keep "
            "the generation before the newest only that long",
        )


@dataclass(frozen=True)
class Cluster:
    """This process's place in a Bytewax cluster."""

    workers: int
    process_id: int | None
    addresses: list[str] | None


def serve(
    settings: Settings,
    cluster: Cluster,
    snapshot_every: float,
    backup_every: float,
    log_file: Path | None,
) -> None:
    """Check, then serve until the input ends or the process stops; a problem at start is
    one line and exit status 2, a crash one line and exit status 1 (the story in the log)."""
    service_log = ServiceLog(log_file)
    try:
        service_log.start()
        if settings.recovery_dir is not None:  # one writer per directory and process id
            hold_directory(settings.recovery_dir, cluster.process_id or 0)
        service = prepare(settings)
    except ConfigError as exc:
        service_log.say(f"tsi run: {exc}")
        raise typer.Exit(2) from None
    except StartupError as exc:
        service_log.say(f"tsi run: {exc}")
        raise typer.Exit(2) from None
    service_log.say(describe_start(settings, service_log.path))
    try:
        run_flow(
            service.flow(
                tail=not settings.stop_at_end,
                recovery=settings.recovery_dir or False,
                fresh=settings.fresh,
                process=cluster.process_id or 0,
            ),
            cluster.workers,
            cluster.process_id,
            cluster.addresses,
            settings.recovery_dir,
            snapshot_every,
            backup_every,
            metrics_port=settings.metrics_port,
            metrics_host=settings.metrics_host,
            ready_timeout=settings.ready_after(snapshot_every),
            on_reload=service.reload_registry,
            trim_every=settings.malloc_trim,
            say=service_log.say,
        )
    except MetricsPortError as exc:
        service_log.say(f"tsi run: {exc}")
        raise typer.Exit(2) from None
    except Exception as exc:
        service_log.stopped(exc)
        raise typer.Exit(1) from None
    if Stop.restart:  # a clean end that asks to be started again
        service_log.say(f"tsi run: {Stop.reason}")
        raise typer.Exit(RESTART)
    if Stop.asked():
        service_log.say(f"tsi run: stopped ({Stop.reason}): the last epoch is committed")
