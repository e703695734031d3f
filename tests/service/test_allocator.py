"""Freed memory goes back to the system: the trimming thread of every service process."""

import ctypes
import time
from pathlib import Path

from flows.service.runtime.allocator import malloc_trim, start_trimming


def resident() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_the_trimming_thread_hands_back_pages_freed_inside_the_heap():
    """Blocks freed between live ones stay in the process (only the heap's top goes back
    by itself) until a trim: the thread's first trim gives most of them back."""
    assert malloc_trim() is not None, "glibc's malloc_trim is expected on this platform"
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(6000) for _ in range(40_000)]  # ~240 MB, below the mmap threshold
    for block in blocks:
        ctypes.memset(block, 1, 6000)
    full = resident()
    kept = blocks[3::4]  # one block in four stays: the heap cannot shrink from its top
    for i, block in enumerate(blocks):
        if i % 4 != 3:
            libc.free(block)
    freed = resident()
    assert freed > full - 60 * 2**20, "glibc gave the holes back without a trim"
    trimmer = start_trimming(0.05)
    try:
        deadline = time.monotonic() + 10.0
        while resident() > full - 120 * 2**20 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert trimmer is not None and trimmer.daemon and trimmer.is_alive()
        assert resident() < full - 120 * 2**20  # most of the ~180 MB of holes went back
    finally:
        if trimmer is not None:
            trimmer.stop()
            trimmer.join(5.0)
        for block in kept:
            libc.free(block)
    assert not trimmer.is_alive()


def test_no_interval_no_thread():
    assert start_trimming(0) is None and start_trimming(-1.0) is None
