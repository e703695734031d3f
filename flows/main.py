"""``python -m bytewax.run flows.main:flow``: the Kafka service, configured by environment.

See ``flows.service`` for the variables (``TSI_REGISTRY``, ``KAFKA_BOOTSTRAP_SERVERS``, ...).
The flow is built when Bytewax asks for it, not at import.
"""

import os
from typing import Any

from flows.service import service_from_env


def __getattr__(name: str) -> Any:
    if name == "flow":
        return service_from_env().flow(tail=os.environ.get("TSI_STOP_AT_END", "0") != "1")
    raise AttributeError(name)
