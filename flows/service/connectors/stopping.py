"""Ending the service cleanly: a stop asked for (a signal, or input partitions added at
run time) ends every input source at its next read, so Bytewax finishes and commits the
current epoch and the flow returns; nothing is lost and nothing is read twice.

``on_signals`` makes SIGINT (Ctrl-C) and SIGTERM ask for that stop. If the flow has not
ended ``grace`` seconds later (a broker that does not acknowledge the epoch's outputs),
or at a second signal, the process exits at once: the epoch in progress is abandoned and
a restart resumes from the last committed one, as after a crash.

>>> Stop.reset(); Stop.asked()
False
>>> Stop.ask("SIGTERM received"); Stop.ask("a later reason is ignored"); Stop.reason
'SIGTERM received'
>>> Stop.reset()
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType

log = logging.getLogger("tsi")

#: Seconds a clean stop may take before the epoch in progress is abandoned.
GRACE = 20.0


class Stop:
    """The process's stop request: why (``reason``) and whether to ask the supervisor for
    a restart (``restart``: the input's partitions changed)."""

    reason: str | None = None
    restart: bool = False

    @classmethod
    def ask(cls, reason: str, restart: bool = False) -> None:
        """Ask the flow to end cleanly (the first reason stands)."""
        if cls.reason is None:
            cls.reason, cls.restart = reason, restart

    @classmethod
    def asked(cls) -> bool:
        """Whether a stop was asked for: the sources end at their next read."""
        return cls.reason is not None

    @classmethod
    def reset(cls) -> None:
        """Forget the request (a new flow in this process)."""
        cls.reason, cls.restart = None, False


def on_signals(grace: float = GRACE, say: Callable[[str], None] = print) -> None:
    """SIGINT and SIGTERM end the flow cleanly (``Stop``); a second one, or ``grace``
    seconds without an end, exit at once with status 0, the epoch in progress abandoned.
    ``say`` prints the one line an operator sees for the forced exit."""

    def handle(signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if Stop.asked():
            _abandon(f"{name} again", say)
        Stop.ask(f"{name} received")
        log.warning("%s received: ending the current epoch, then stopping", name)
        timer = threading.Timer(grace, _abandon, (f"no clean end within {grace:g} s", say))
        timer.daemon = True
        timer.start()

    if threading.current_thread() is not threading.main_thread():
        return  # signals reach the main thread only (a flow run inside tests)
    signal.signal(signal.SIGINT, handle)
    signal.signal(signal.SIGTERM, handle)


def _abandon(why: str, say: Callable[[str], None]) -> None:
    message = (
        f"tsi run: stopped ({why}): the epoch in progress was abandoned; a restart resumes "
        "from the last committed one"
    )
    log.warning(message)
    say(message)
    for handler in logging.getLogger().handlers + log.handlers:
        handler.flush()
    sys.stdout.flush()
    os._exit(0)
