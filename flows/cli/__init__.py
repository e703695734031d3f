"""The ``tsi`` command line: one module per command on ``flows.cli.base``.

>>> sorted(c.callback.__name__ for c in app.registered_commands)[:3]
['demo', 'evaluate', 'inspect_command']
"""

from flows.cli import demo, evaluate, inspect, replay, run, simulate, state, topics  # noqa: F401
from flows.cli.base import app

__all__ = ["app"]
