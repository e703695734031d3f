"""The ``tsi`` command line: one module per command on ``flows.cli.base``.

``main`` is the console script: a command's own mistakes are one line and exit status 2
(``flows.cli.base.fail``); anything else it did not expect (a damaged file, a bug) is one
line too, ``tsi COMMAND: what went wrong``, and exit status 1. ``TSI_TRACEBACK=1`` shows
the whole traceback instead.

>>> sorted(c.callback.__name__ for c in app.registered_commands)[:3]
['demo', 'evaluate', 'inspect_command']
"""

import os
import sys

from flows.cli import (  # noqa: F401
    demo,
    evaluate,
    experiments,
    inspect,
    keys,
    replay,
    run,
    serve,
    simulate,
    state,
    topics,
)
from flows.cli.base import app

__all__ = ["app", "main"]


def main() -> None:
    """Run ``tsi`` with this process's arguments."""
    try:
        app()
    except Exception as exc:
        if os.environ.get("TSI_TRACEBACK") == "1":
            raise
        words = sys.argv[1:3]
        command = " ".join(words if words[:1] in (["state"], ["topics"], ["keys"]) else words[:1])
        text = " ".join(str(exc).split()) or type(exc).__name__
        print(
            f"tsi {command}: {text} ({type(exc).__name__}; TSI_TRACEBACK=1 shows where)",
            file=sys.stderr,
        )
        sys.exit(1)
