"""``tsi run``: the streaming service on Kafka (see README "Operating it")."""

from __future__ import annotations

from pathlib import Path

import typer

from flows.cli.base import app, fail
from flows.service.connectors.kafka import Topics
from flows.service.process import run as run_flow
from flows.service.settings import DEFAULT_BROKERS, DEFAULT_GROUP


@app.command("run")
def run_service(
    registry: Path = typer.Option(
        ..., envvar="TSI_REGISTRY", help="Experiments registry (TOML); SIGHUP reloads it."
    ),
    brokers: str = typer.Option(
        DEFAULT_BROKERS,
        envvar="KAFKA_BOOTSTRAP_SERVERS",
        help="Kafka bootstrap servers, comma-separated.",
    ),
    kafka_config: Path | None = typer.Option(
        None,
        envvar="TSI_KAFKA_CONFIG",
        help="TOML of librdkafka client settings (SASL, TLS, ...): [kafka] for both clients, "
        "[kafka.consumer] and [kafka.producer] for one; names as in librdkafka, quoted or "
        'not (security.protocol = "SASL_SSL"). Unknown names are refused; secrets are '
        "masked when the effective settings are logged.",
    ),
    requests_topic: str = typer.Option(
        Topics.requests, envvar="TSI_TOPIC_REQUESTS", help="Decision requests topic."
    ),
    feedback_topic: str = typer.Option(
        Topics.feedback, envvar="TSI_TOPIC_FEEDBACK", help="Feedback topic."
    ),
    events_topic: str | None = typer.Option(
        None,
        envvar="TSI_TOPIC_EVENTS",
        help="One topic for requests and feedback (field 'type'); replaces the two.",
    ),
    selections_topic: str = typer.Option(
        Topics.selections, envvar="TSI_TOPIC_SELECTIONS", help="Selections topic."
    ),
    dlq_topic: str = typer.Option(
        Topics.dead_letters, envvar="TSI_TOPIC_DLQ", help="Dead-letter topic."
    ),
    recovery_dir: Path | None = typer.Option(
        None, envvar="TSI_RECOVERY_DIR", help="Recovery directory (state survives restarts)."
    ),
    no_recovery: bool = typer.Option(
        False,
        "--no-recovery",
        envvar="TSI_NO_RECOVERY",
        help="Run without a recovery directory: state starts empty at every start and the "
        "input resumes from the consumer group's committed offsets (else the topics' end).",
    ),
    snapshot_every: float = typer.Option(
        10.0, min=0.01, envvar="TSI_SNAPSHOT_EVERY", help="Seconds between snapshots."
    ),
    backup_every: float = typer.Option(
        0.0,
        min=0.0,
        help="Seconds old snapshots are kept after a newer one is committed "
        "(raise it when the recovery directory is copied to durable storage).",
    ),
    workers: int = typer.Option(
        1, min=1, envvar="TSI_WORKERS", help="Worker threads in this process."
    ),
    process_id: int | None = typer.Option(
        None, min=0, envvar="TSI_PROCESS_ID", help="This process's index in a cluster."
    ),
    addresses: str | None = typer.Option(
        None, envvar="TSI_ADDRESSES", help="Cluster addresses 'host:port;host:port'."
    ),
    connect_timeout: float = typer.Option(
        10.0, min=0.1, help="Seconds to wait for a broker to answer at start."
    ),
    stop_at_end: bool = typer.Option(
        False,
        envvar="TSI_STOP_AT_END",
        help="Stop at the end of the input topics instead of waiting for more.",
    ),
    metrics_port: int | None = typer.Option(
        None,
        min=1,
        max=65535,
        envvar="TSI_METRICS_PORT",
        help="Serve Prometheus metrics (/metrics), readiness (/ready) and liveness "
        "(/healthz) on this port; off by default.",
    ),
    ready_timeout: float | None = typer.Option(
        None,
        min=1.0,
        envvar="TSI_READY_TIMEOUT",
        help="/ready fails after this many seconds without a finished epoch or a broker "
        "reached (default: 60, or 3 snapshot intervals if longer).",
    ),
    group_id: str = typer.Option(
        DEFAULT_GROUP,
        envvar="TSI_GROUP_ID",
        help="Consumer group the offsets of finished epochs are committed to (lag for "
        "standard tools; recovery uses the recovery directory).",
    ),
    skip_offset: list[str] = typer.Option(
        [],
        envvar="TSI_SKIP_OFFSETS",
        help="TOPIC:PARTITION:OFFSET of a message to skip: it becomes a 'skipped' dead "
        "letter (with its bytes) and changes nothing. Repeat, or comma-separate.",
    ),
    ts_window: float | None = typer.Option(
        None,
        envvar="TSI_TS_WINDOW",
        help="Seconds an event's ts may differ from the wall clock (default 10 years).",
    ),
    log_file: Path | None = typer.Option(
        None,
        envvar="TSI_LOG_FILE",
        help="Write logs here (default: tsi-run.log when stderr is a terminal, else stderr).",
    ),
) -> None:
    """Serve decisions from Kafka: requests and feedback in, selections and dead letters out.

    Everything is checked first (registry, Kafka settings, brokers, every topic read or
    written, the recovery directory); a problem is one line and exit status 2.
    """
    from flows.service.metrics import MetricsPortError
    from flows.service.settings import Settings
    from flows.service.startup import ServiceLog, StartupError, describe_start, prepare

    if (process_id is None) != (addresses is None):
        fail("run", "--process-id and --addresses go together")
    cluster = None if addresses is None else addresses.split(";")
    settings = Settings(
        registry,
        brokers.split(","),
        kafka_config,
        Topics(requests_topic, feedback_topic, selections_topic, dlq_topic, events_topic),
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
    )
    service_log = ServiceLog(log_file)
    try:
        service_log.start()
        service = prepare(settings)
    except StartupError as exc:
        service_log.say(f"tsi run: {exc}")
        raise typer.Exit(2) from None
    service_log.say(describe_start(settings, service_log.path))
    try:
        run_flow(
            service.flow(tail=not stop_at_end, recovery=recovery_dir is not None),
            workers,
            process_id,
            cluster,
            recovery_dir,
            snapshot_every,
            backup_every,
            metrics_port=metrics_port,
            ready_timeout=settings.ready_after(snapshot_every),
            on_reload=service.reload_registry,
        )
    except MetricsPortError as exc:
        service_log.say(f"tsi run: {exc}")
        raise typer.Exit(2) from None
    except Exception as exc:
        service_log.stopped(exc)
        raise typer.Exit(1) from None
