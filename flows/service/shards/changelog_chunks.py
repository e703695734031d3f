"""A changelog record over the topic's message limit: split into chunks, joined back.

An instance's record (``shard_log.encode``) longer than the limit goes to the changelog
as consecutive records: its first chunks under derived keys ``<key>\\x00<i>`` (``i`` from
0: stable per key and index, so that compaction keeps the newest chunk of each index),
then the record that completes it under the key itself: a header (``MAGIC``, the chunk
count, the whole length and its crc32) and the last chunk. A record of ``encode`` never
starts with ``MAGIC`` (its first four bytes would be a length no message can hold), and
an instance key holds no NUL byte. All the chunks of one version precede its completing
record, in the same epoch, hence before its marker; ``ChunkedMirror`` tombstones the
chunk keys a key's previous version used and its new one does not (a shrinking record, a
deleted key), so that no stale chunk outlives compaction. ``Assembler`` reads records back
in order and joins a completed record; a missing or corrupt chunk is an error naming the
key (``join``).

>>> records = split("k", b"abcdefghijkl" * 4, limit=36)
>>> [(key, len(value)) for key, value in records]
[('k\\x000', 12), ('k\\x001', 12), ('k\\x002', 12), ('k', 36)]
>>> reader = Assembler()
>>> [reader.read(key, value) for key, value in records][-1]
('k', b'abcdefghijklabcdefghijklabcdefghijklabcdefghijkl')
"""

from __future__ import annotations

import struct
import zlib
from typing import Protocol

__all__ = ["CHUNK", "MAGIC", "Assembler", "ChunkedMirror", "base_key", "chunk_key", "join", "split"]

#: How a completing record begins: a length no Kafka message can hold, then a tag.
MAGIC = b"\xff\xff\xff\xffTSIc"
#: The completing record's header: ``MAGIC``, chunk count, whole length, crc32 of the whole.
HEADER = struct.Struct("<8sIQI")
SEPARATOR = "\x00"
#: What ``Assembler.read`` returns for a chunk: the key's record is not complete yet.
CHUNK = object()


def chunk_key(key: str, index: int) -> str:
    """The key of chunk ``index`` of ``key``'s record.

    >>> chunk_key("e\\x1fu1", 2)
    'e\\x1fu1\\x002'
    """
    return f"{key}{SEPARATOR}{index}"


def base_key(key: str) -> str:
    """The instance key a changelog key belongs to (itself, or a chunk's key's).

    >>> base_key("k\\x003"), base_key("k")
    ('k', 'k')
    """
    base, _, index = key.rpartition(SEPARATOR)
    return base if base and index.isdigit() else key


def split(key: str, value: bytes, limit: int) -> list[tuple[str, bytes]]:
    """The records that carry ``value`` under ``key``, none longer than ``limit`` bytes:
    ``value`` itself, or its chunks and then the completing record.

    >>> split("k", b"small", limit=100)
    [('k', b'small')]
    >>> [key for key, _ in split("k", bytes(100), limit=60)]
    ['k\\x000', 'k\\x001', 'k']
    """
    if limit <= HEADER.size:
        raise ValueError(f"a chunk limit of {limit} bytes leaves no room past the header")
    if SEPARATOR in key:
        raise ValueError(f"key {key!r} holds a NUL byte: its chunks' keys would be ambiguous")
    if len(value) <= limit and not value.startswith(MAGIC):
        return [(key, value)]
    size = limit - HEADER.size
    pieces = [value[at : at + size] for at in range(0, len(value), size)] or [b""]
    header = HEADER.pack(MAGIC, len(pieces), len(value), zlib.crc32(value))
    chunks = [(chunk_key(key, i), piece) for i, piece in enumerate(pieces[:-1])]
    return [*chunks, (key, header + pieces[-1])]


def join(key: str, last: bytes, chunks: dict[int, bytes]) -> bytes:
    """The whole record ``key``'s completing record ``last`` ends, from ``chunks`` (by
    index); ``ValueError`` naming ``key`` when one is missing or the whole is corrupt.

    >>> (_, first), (_, last) = split("k", b"0123456789" * 5, limit=49)
    >>> join("k", last, {0: first})
    b'01234567890123456789012345678901234567890123456789'
    >>> join("k", last, {})
    Traceback (most recent call last):
    ...
    ValueError: record 'k': chunk 0 of 2 is missing
    """
    if len(last) < HEADER.size:
        raise ValueError(f"record {key!r}: a completing record shorter than its header")
    _, count, length, crc = HEADER.unpack_from(last)
    missing = [i for i in range(count - 1) if i not in chunks]
    if missing:
        raise ValueError(f"record {key!r}: chunk {missing[0]} of {count} is missing")
    whole = b"".join(chunks[i] for i in range(count - 1)) + last[HEADER.size :]
    if len(whole) != length or zlib.crc32(whole) != crc:
        raise ValueError(
            f"record {key!r}: its {count} chunks join to {len(whole)} bytes that do not "
            f"match the {length} bytes and checksum it was written with"
        )
    return whole


class Assembler:
    """A changelog's records read in order: each chunk kept by key and index until the
    record that completes it."""

    def __init__(self) -> None:
        self.chunks: dict[str, dict[int, bytes]] = {}

    def read(self, key: str, value: bytes | None) -> tuple[str, bytes | object | None]:
        """``(instance key, its whole record)`` for a record read (None: a tombstone;
        ``CHUNK``: a chunk, the record is not complete); ``ValueError`` for a completing
        record whose chunks are missing or corrupt.

        >>> reader = Assembler()
        >>> reader.read("k\\x000", b"x") == ("k", CHUNK), reader.read("j", None)
        (True, ('j', None))
        """
        base = base_key(key)
        if base != key:
            index = int(key[len(base) + 1 :])
            if value is None:
                self.chunks.get(base, {}).pop(index, None)
            else:
                self.chunks.setdefault(base, {})[index] = value
            return base, CHUNK
        if value is not None and value.startswith(MAGIC):
            return key, join(key, value, self.chunks.get(key, {}))
        return key, value


class Mirror(Protocol):
    """What ``ChunkedMirror`` writes through (``changelog.Mirror``)."""

    def append(self, key: str, value: bytes | None) -> None: ...

    def extend(self, records: list[tuple[str, bytes]]) -> None: ...

    def mark(self, marker: object) -> None: ...

    def acknowledged(self) -> int | None: ...


class ChunkedMirror:
    """A shard's mirror whose records are at most ``limit`` bytes (``split``);
    ``counts`` holds the chunks (beside the completing record) of each key whose last
    record this process wrote in chunks, shared by the shard's mirrors, so that a record
    written again tombstones the chunk keys it no longer uses."""

    def __init__(self, mirror: Mirror, limit: int, counts: dict[str, int]) -> None:
        self.mirror = mirror
        self.limit = limit
        self.counts = counts

    def append(self, key: str, value: bytes | None) -> None:
        """Send ``key``'s record (None: a tombstone, of its chunks' keys too)."""
        records: list[tuple[str, bytes | None]] = (
            [(key, None)] if value is None else list(split(key, value, self.limit))
        )
        used = len(records) - 1
        for index in range(used, self.counts.pop(key, 0)):
            self.mirror.append(chunk_key(key, index), None)
        for each, record in records:
            self.mirror.append(each, record)
        if used:
            self.counts[key] = used

    def extend(self, records: list[tuple[str, bytes]]) -> None:
        """Send many keys' records (none a tombstone), in order: those that go whole, and
        replace no chunks, through the mirror's ``extend`` at once; the others as
        ``append`` sends them."""
        whole: list[tuple[str, bytes]] = []
        limit, counts = self.limit, self.counts
        for key, value in records:
            if len(value) <= limit and key not in counts and not value.startswith(MAGIC):
                whole.append((key, value))
                continue
            if whole:
                self.mirror.extend(whole)
                whole = []
            self.append(key, value)
        if whole:
            self.mirror.extend(whole)

    def mark(self, marker: object) -> None:
        self.mirror.mark(marker)

    def acknowledged(self) -> int | None:
        return self.mirror.acknowledged()
