"""``python -m bytewax.run flows.main:flow``: the Kafka service, configured by environment.

See ``flows.service`` for the variables (``TSI_REGISTRY``, ``KAFKA_BOOTSTRAP_SERVERS``, ...).
The flow is built when Bytewax asks for it, not at import. SIGHUP reloads the registry
(applied when the next epoch closes).
"""

import os
import signal
import sys
from typing import Any

from flows.metrics import MetricsPortError, serve_metrics
from flows.service import metrics_port_from_env, service_from_env, settle_heap


def _recovery_requested() -> bool:
    """Whether ``bytewax.run`` was started with a recovery directory (-r or its env var)."""
    args = sys.argv[1:]
    flags = ("-r", "--recovery-directory")
    given = any(a in flags or a.startswith("--recovery-directory=") for a in args)
    return given or bool(os.environ.get("BYTEWAX_RECOVERY_DIRECTORY"))


def __getattr__(name: str) -> Any:
    if name == "flow":
        tail = os.environ.get("TSI_STOP_AT_END", "0") != "1"
        service = service_from_env()
        flow = service.flow(tail=tail, recovery=_recovery_requested())
        signal.signal(signal.SIGHUP, lambda *_: service.reload_registry())
        port = metrics_port_from_env()
        if port is not None:
            timeout = float(os.environ.get("TSI_READY_TIMEOUT") or 60.0)
            try:
                serve_metrics(port, ready_timeout=timeout)
            except MetricsPortError as exc:
                raise SystemExit(f"tsi: {exc}") from None
        settle_heap()
        return flow
    raise AttributeError(name)
