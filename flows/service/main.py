"""``python -m bytewax.run flows.service.main:flow``: the Kafka service, configured by environment.

The same flow as ``tsi run``, from the same ``Settings`` (the ``TSI_*`` variables of
``flows.service.settings``), for Bytewax-native deployments; the start-up checks are
``tsi run``'s. The flow is built when Bytewax asks for it, not at import.
"""

import os
import sys
from typing import Any

from flows.service.metrics import MetricsPortError
from flows.service.process import Service, start_process
from flows.service.settings import Settings


def _recovery_dir() -> str | bool:
    """The recovery directory ``bytewax.run`` was started with (-r or its env var), or
    False."""
    args = sys.argv[1:]
    for i, arg in enumerate(args):
        if arg in ("-r", "--recovery-directory") and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--recovery-directory="):
            return arg.partition("=")[2]
    return os.environ.get("BYTEWAX_RECOVERY_DIRECTORY") or False


def __getattr__(name: str) -> Any:
    if name == "flow":
        settings = Settings.from_env()
        service = Service.from_settings(settings)
        flow = service.flow(tail=not settings.stop_at_end, recovery=_recovery_dir())
        try:
            start_process(
                settings.metrics_port,
                settings.ready_after(1.0),
                service.reload_registry,
                settings.malloc_trim,
            )
        except MetricsPortError as exc:
            raise SystemExit(f"tsi: {exc}") from None
        return flow
    raise AttributeError(name)
