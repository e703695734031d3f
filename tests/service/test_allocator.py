"""Freed memory goes back to the system: the trimming thread of every service process."""

import ctypes
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.service.runtime.allocator import malloc_trim, map_large_blocks, start_trimming

ROOT = Path(__file__).resolve().parents[2]


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


GROWING_TABLE = """
import ctypes, sys
from pathlib import Path
from flows.service.runtime.allocator import map_large_blocks

def resident():
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) * 1024

if sys.argv[1] == "fixed":
    assert map_large_blocks()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = libc.realloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.realloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.free(libc.malloc(16 << 20))  # a large buffer freed: glibc's threshold rises
start = resident()
tables, size = [libc.malloc(1 << 18) for _ in range(64)], 1 << 18
kept = []  # what else the process allocates between two growths, and keeps
while size < 2 << 20:  # 64 tables grow by an eighth at a time, in turn, to ~2 MiB each
    size += size // 8
    for i, table in enumerate(tables):
        tables[i] = libc.realloc(table, size)
        ctypes.memset(tables[i], 1, size)
        kept.append(libc.malloc(4096))
print(resident() - start, 64 * size)
"""


def test_large_blocks_mapped_on_their_own_grow_without_leaving_copies_behind(tmp_path):
    """Tables growing in turn after a large buffer was freed: with glibc's threshold
    risen they grow inside the heap and the copies they leave stay resident; mapped on
    their own (``map_large_blocks``) the process holds about the tables' own bytes."""
    script = tmp_path / "grow.py"
    script.write_text(GROWING_TABLE)
    held = {}
    for mode in ("fixed", "risen"):
        done = subprocess.run(
            [sys.executable, str(script), mode],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert done.returncode == 0, done.stderr
        held[mode], tables = map(int, done.stdout.split())
    assert held["fixed"] < 1.1 * tables and held["risen"] > 1.25 * tables


def test_a_threshold_glibc_refuses_is_named():
    for bad in (0, -1, 64 * 2**20, 1.5):
        with pytest.raises(ValueError, match=f"got {bad!r}"):
            map_large_blocks(bad)
