"""``python -m bytewax.run flows.service.main:flow``: the Kafka service, configured by environment.

The same flow as ``tsi run``, from the same ``Settings`` (the ``TSI_*`` variables of
``flows.service.runtime.settings``), for Bytewax-native deployments; the start-up checks are
``tsi run``'s. The flow is built when Bytewax asks for it, not at import.
"""

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from flows.service.observe.metrics import MetricsPortError
from flows.service.runtime.dir_lock import hold_directory
from flows.service.runtime.process import Service, start_process
from flows.service.runtime.recovery import stored_shards
from flows.service.runtime.settings import ConfigError, Settings
from flows.service.shards.changelog import ForeignChangelogError


def _recovery_dir() -> str | bool:
    """The recovery directory ``bytewax.run`` was started with (-r or its env var), or
    False."""
    given = _option("-r", "--recovery-directory")
    return given or os.environ.get("BYTEWAX_RECOVERY_DIRECTORY") or False


def _option(short: str, long: str) -> str | None:
    """The value of ``bytewax.run``'s option ``short``/``long`` in this process's
    arguments, or None."""
    args = sys.argv[1:]
    for i, arg in enumerate(args):
        if arg in (short, long) and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(f"{long}="):
            return arg.partition("=")[2]
    return None


def _process_id() -> int:
    """This process's id as ``bytewax.run`` reads it (-i, its env var, or the pod's
    ordinal in a StatefulSet), 0 when alone."""
    given = _option("-i", "--process-id") or os.environ.get("BYTEWAX_PROCESS_ID")
    if given is None and "BYTEWAX_POD_NAME" in os.environ:
        prefix = os.environ.get("BYTEWAX_STATEFULSET_NAME", "") + "-"
        given = os.environ["BYTEWAX_POD_NAME"].removeprefix(prefix)
    try:
        return int(given) if given is not None else 0
    except ValueError:
        return 0  # bytewax.run refuses it itself


def _shards(settings: Settings, recovery: str | None) -> int:
    """The flow's shard count as ``tsi run`` resolves it (``startup.ready_changelog``):
    with a recovery directory and a changelog, the changelog topic created when missing
    and checked when not; ``SystemExit`` saying what is wrong."""
    from flows.service.connectors.kafka_admin import BrokerUnavailableError, TopicError
    from flows.service.runtime.settings import client_config
    from flows.service.runtime.shard_count import flow_shards
    from flows.service.runtime.startup import ready_changelog

    if not recovery:
        return flow_shards(settings.shards, None, None)
    try:
        if settings.topics.changelog is None:
            return flow_shards(settings.shards, stored_shards(recovery), None)
        consumer, _ = client_config(settings.kafka_config)
        return ready_changelog(dataclasses.replace(settings, recovery_dir=Path(recovery)), consumer)
    except (ConfigError, TopicError, BrokerUnavailableError) as exc:
        raise SystemExit(f"tsi: {exc}") from None


def _check_stored_inputs(recovery: Path, settings: Settings) -> None:
    """``tsi run``'s refusal of a directory holding other input topics' positions."""
    from flows.service.connectors.kafka_admin import service_topics
    from flows.service.runtime.startup import StartupError, check_stored_inputs

    try:
        check_stored_inputs(recovery, service_topics(settings.topics)[0])
    except StartupError as exc:
        raise SystemExit(f"tsi: {exc}") from None


def __getattr__(name: str) -> Any:
    if name == "flow":
        settings = Settings.from_env()
        if settings.members > 1:  # tsi run reads the internal topic's partitions first
            raise SystemExit("tsi: members (TSI_MEMBERS > 1) are started with `tsi run`")
        recovery, process = _recovery_dir(), _process_id()
        if recovery:
            _check_stored_inputs(Path(recovery), settings)
        service = Service.from_settings(settings, shards=_shards(settings, recovery))
        try:
            flow = service.flow(
                tail=not settings.stop_at_end,
                recovery=recovery,
                process=process,
                cluster=settings.addresses is not None or "BYTEWAX_ADDRESSES" in os.environ,
            )
            if recovery:
                hold_directory(recovery, process)  # one writer per directory and process
            start_process(
                settings.metrics_port,
                settings.ready_after(1.0),
                service.reload_registry,
                settings.malloc_trim,
                metrics_host=settings.metrics_host,
            )
        except (MetricsPortError, ConfigError, ForeignChangelogError) as exc:
            raise SystemExit(f"tsi: {exc}") from None
        return flow
    raise AttributeError(name)
