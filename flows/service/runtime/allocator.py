"""Handing freed memory back to the system: glibc's ``malloc_trim``, every few seconds,
and large blocks mapped on their own (``map_large_blocks``).

The service allocates in bursts (a Kafka batch, instances built, then put to rest) and
glibc keeps what is freed inside its heaps for reuse; only the top of a heap goes back
by itself. Trimming takes a large share off the resident memory an instance costs at
10^6 instances (bench/RESULTS.md, "resting between epochs, state in C tables": freed
memory goes back to the system). ``start_trimming`` calls
``malloc_trim(0)`` from a daemon thread every ``interval`` seconds (ctypes releases the
GIL for the call); where the C library has no ``malloc_trim`` (musl, macOS) it does
nothing.

glibc maps a block of ``M_MMAP_THRESHOLD`` bytes or more on its own (its pages go back
the moment it is freed, and ``realloc`` moves it without a copy), but it raises that
threshold each time such a block is freed, up to ``MMAP_THRESHOLD_MAX``: a process that
once freed a large buffer then grows its resting tables (``instances._packed_table``)
inside the heap, each growth a copy that leaves the old block's pages resident until the
next trim.
``map_large_blocks`` fixes the threshold at glibc's starting value: during a flood of new
users the shards' tables grow without those copies (bench/RESULTS.md, "the live
instances of a flood, bounded per flow").

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
#: Bytes from which a block is mapped on its own: glibc's starting threshold, kept fixed.
MMAP_THRESHOLD = 128 * 1024
#: The largest threshold glibc takes (``HEAP_MAX_SIZE / 2`` on 64-bit).
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)

log = logging.getLogger(__name__)


def map_large_blocks(threshold: int = MMAP_THRESHOLD) -> bool:
    """Map every block of ``threshold`` bytes or more on its own from now on, the
    threshold kept fixed (see the module's docstring); False where the C library has no
    ``mallopt`` (musl, macOS). A threshold glibc would refuse is a ``ValueError``.

    >>> map_large_blocks(0)
    Traceback (most recent call last):
    ...
    ValueError: the mmap threshold is 1 to 33554432 bytes, got 0
    """
    if not isinstance(threshold, int) or not 0 < threshold <= MMAP_THRESHOLD_MAX:
        raise ValueError(
            f"the mmap threshold is 1 to {MMAP_THRESHOLD_MAX} bytes, got {threshold!r}"
        )
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt(_M_MMAP_THRESHOLD, threshold) == 1


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
