"""``tsi run``: the streaming service on Kafka (docs/guides/operating.md)."""

from __future__ import annotations

import time
from collections.abc import Mapping

import typer

from flows.cli.base import app, fail
from flows.cli.options import with_options
from flows.service.connectors.stopping import Stop
from flows.service.observe.metrics import MetricsPortError
from flows.service.runtime.dir_lock import hold_directory, is_empty
from flows.service.runtime.process import Service
from flows.service.runtime.process import run as run_flow
from flows.service.runtime.settings import ConfigError, Settings, options
from flows.service.runtime.startup import (
    BrokersAwayError,
    ServiceLog,
    StartupError,
    describe_start,
    prepare,
)
from flows.service.shards.changelog import ForeignChangelogError

RESTART = 3  # the exit status asking a supervisor to start the service again


@app.command("run")
@with_options(*options())
def run_service(env: Mapping[str, str]) -> None:
    """Serve decisions from Kafka: requests and feedback in, selections and dead letters out.

    Everything is checked first (registry, Kafka settings, brokers, every topic read or
    written, the recovery directory); a problem is one line and exit status 2. Every
    option is also an environment variable (shown with it); an option given wins.
    """
    try:
        settings = Settings.from_env(env)
    except ConfigError as exc:
        fail("run", str(exc))
    serve(settings)


def serve(settings: Settings) -> None:
    """Check, then serve until the input ends or the process stops; a problem at start is
    one line and exit status 2, a crash one line and exit status 1 (the story in the log)."""
    service_log = ServiceLog(settings.log_file)
    try:
        service_log.start()
        if settings.recovery_dir is not None:  # one writer per directory and process id
            hold_directory(settings.recovery_dir, settings.process_id or 0)
        service = prepared(settings, service_log)
        service_log.say(describe_start(settings, service_log.path))
        flow = service.flow(
            tail=not settings.stop_at_end,
            recovery=settings.recovery_dir or False,
            fresh=settings.fresh,
            process=settings.process_id or 0,
            rebuild=settings.rebuild,
            cluster=settings.addresses is not None,
        )
    except (ConfigError, StartupError, ForeignChangelogError) as exc:
        service_log.say(f"tsi run: {exc}")
        raise typer.Exit(2) from None
    if settings.experiments_topic:  # changes arrive while it serves
        from flows.experiments.follow import follow_topic

        app = settings.application
        follow_topic(service.registry, settings.brokers, app, service.consumer_config)
    try:
        run_flow(
            flow,
            settings.workers,
            settings.process_id,
            settings.addresses,
            settings.recovery_dir,
            settings.snapshot_every,
            settings.backup_every,
            metrics_port=settings.metrics_port,
            metrics_host=settings.metrics_host,
            ready_timeout=settings.ready_after(settings.snapshot_every),
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


#: Seconds between two starts of a restart that waits for the brokers.
BROKERS_AWAY_PAUSE_S = 5.0


def prepared(settings: Settings, service_log: ServiceLog) -> Service:
    """``prepare``, asked again while the brokers are away when the recovery directory
    holds state (a restart during a broker outage waits for it rather than ending, which
    a supervisor would restart again and again); a first start ends in one line."""
    said = False
    while True:
        try:
            return prepare(settings)
        except BrokersAwayError as exc:
            directory = settings.recovery_dir
            if directory is None or is_empty(directory):
                raise
            if not said:
                service_log.say(f"tsi run: {exc}; the state is kept: waiting for the brokers")
                said = True
            time.sleep(BROKERS_AWAY_PAUSE_S)
