"""Handing freed memory back to the system: glibc's ``malloc_trim``, every few seconds.

The service allocates in bursts (a Kafka batch, instances built, then put to rest) and
glibc keeps what is freed inside its heaps for reuse; only the top of a heap goes back
by itself. Trimming takes a large share off the resident memory an instance costs at
10^6 instances (bench/RESULTS.md, "resting between epochs, state in C tables": freed
memory goes back to the system). ``start_trimming`` calls
``malloc_trim(0)`` from a daemon thread every ``interval`` seconds (ctypes releases the
GIL for the call); where the C library has no ``malloc_trim`` (musl, macOS) it does
nothing.

>>> start_trimming(0) is None   # 0: off
True
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
from collections.abc import Callable

#: Seconds between two trims (``TSI_MALLOC_TRIM``, ``tsi run --malloc-trim``; 0: never).
TRIM_EVERY = 10.0

log = logging.getLogger(__name__)


def malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


class Trimmer(threading.Thread):
    """The daemon thread that trims every ``interval`` seconds until ``stop()``."""

    def __init__(self, trim: Callable[[int], int], interval: float) -> None:
        super().__init__(name="tsi-malloc-trim", daemon=True)
        self.trim, self.interval = trim, interval
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            self.trim(0)

    def stop(self) -> None:
        self.stopped.set()


def start_trimming(interval: float = TRIM_EVERY) -> Trimmer | None:
    """Trim the heap every ``interval`` seconds from a daemon thread (None: not started,
    for ``interval`` 0 or without ``malloc_trim``)."""
    if not interval > 0:
        return None
    trim = malloc_trim()
    if trim is None:
        log.info("no malloc_trim in this C library: freed memory is not handed back")
        return None
    trimmer = Trimmer(trim, interval)
    trimmer.start()
    return trimmer
