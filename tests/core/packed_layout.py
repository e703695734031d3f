"""The packed layout (``tsi_core._packing``) written with ``struct``: the tests' oracle, and
the way tests build bytes of every release (columns, compact arms) with chosen values.

>>> from tsi_core import Bandit
>>> b = Bandit(3)
>>> b.pack() == layout_of(b), columns_of(b._row)[:48] == b.pack()[:47] + b"\\x00"
(True, True)
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

HEAD = struct.Struct("<dddqqq")  # ψ, V/D², D's mantissa, D's exponent, updates, rounds
COMPACT_ARMS = 1  # the layout tag of the Tsallis learner: the rounds counter's top byte


def varint(n: int) -> bytes:
    """``n`` in 7 bits a byte, low first, the shortest form."""
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes([*out, n])


def head(row: Any, tag: int = 0) -> bytes:
    """The 48 bytes of the head of ``row``, the layout ``tag`` in the rounds' top byte."""
    return HEAD.pack(row[0], row[1], row[2], int(row[3]), int(row[4]), int(row[5]) | tag << 56)


def columns_of(row: Any) -> bytes:
    """Layout 0: the head and every other column as float64 (any number of them: rows of
    earlier releases are a prefix of today's)."""
    return head(row) + np.asarray(row[6:], dtype="<f8").tobytes()


def compact_of(row: Any, n_arms: int) -> bytes:
    """Layout 1: the columns before the arms' block, then each arm's count as a varint and
    its mean square only after a count above 0 (the number of arms with a gap left out)."""
    row = np.asarray(row, dtype=float)
    before = row[6 : len(row) - 2 * n_arms - 1]
    squares, counts = row[len(row) - 2 * n_arms :].reshape(2, n_arms)
    arms = b"".join(
        varint(int(c)) + (struct.pack("<d", s) if c > 0 else b"")
        for s, c in zip(squares, counts, strict=True)
    )
    return head(row, COMPACT_ARMS) + before.astype("<f8").tobytes() + arms


def layout_of(bandit: Any) -> bytes:
    """The bytes ``bandit.pack()`` must be: compact arms for the Tsallis learner (a kernel
    with arm statistics), columns for every other."""
    kernel = bandit._table.kernel
    if kernel.n_arm_stats:
        return compact_of(bandit._row, kernel.n_arm_stats)
    return columns_of(bandit._row)
