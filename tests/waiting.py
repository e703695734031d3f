"""Waiting in tests: poll a condition until it holds, within a bounded deadline.

A loaded host is slow, not wrong: a test waits for exactly what it needs (answers read
back, offsets committed, readiness) instead of sleeping a fixed period, and fails naming
what it waited for when the deadline passes or the process it watches stops.
"""

import subprocess
import time
from collections.abc import Callable


def wait_for(
    condition: Callable[[], object],
    proc: subprocess.Popen | None = None,
    seconds: float = 90,
    what: str = "the service",
    alive: Callable[[], object] | None = None,
) -> None:
    """Poll ``condition`` until it is true; fail after ``seconds`` naming ``what``, or as soon
    as ``proc`` stops (its stderr shown) or ``alive`` raises.

    >>> wait_for(lambda: True, what="nothing")
    >>> wait_for(lambda: False, seconds=0, what="never")
    Traceback (most recent call last):
    AssertionError: timed out after 0 s waiting for never
    """
    deadline = time.monotonic() + seconds
    while not condition():
        if proc is not None and proc.poll() is not None:
            stderr = proc.stderr.read()[-3000:] if proc.stderr else ""
            raise AssertionError(f"{what}: the process stopped: {stderr}")
        if alive is not None:
            alive()
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {seconds:g} s waiting for {what}")
        time.sleep(0.5)
