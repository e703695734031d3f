"""Where shards keep their instances for a restart: one append-only log per shard.

Bytewax asks each touched shard for a snapshot at every epoch close. Writing all of a
shard's instances each time would cost bytes in proportion to everything it holds, so
a shard appends only the entries its epoch changed (``ShardLog.append``) and hands
Bytewax a small marker: the log's generation and its length after the append. A restart
reads the log up to the committed marker and cuts off what lies beyond it (epochs Bytewax
did not commit), so the state matches the input offsets Bytewax resumes from.

A new generation starts with the shard's whole live state (``ShardLog.compact``): when a
shard starts without a marker (its seed, or nothing) or finds its log damaged, and at a
snapshot when the log has grown well past its live state. Between snapshots a shard
appends the instances it puts to rest (``ShardLog.write``); only a later marker covers
them. Compaction waits ``min_epochs`` snapshots after the last one
and keeps the previous generation, so the marker Bytewax has committed (which lags the
newest by the backup interval) always names a file that exists.

A record is ``<u32 length><u32 crc32><pickle of a list of resting.Entry>``. Logs are
pickles: keep the store as private as the recovery directory. Writes are not fsynced:
a killed process loses nothing (the page cache survives it); a power cut may lose the
last epochs, as Bytewax's own partitions may.

>>> import tempfile; from flows.service.instances.resting import Entry
>>> log = ShardLog(Path(tempfile.mkdtemp()), "shard-001")
>>> entries, problem = log.resume(None)
>>> marker = log.compact([Entry("e", "e", "state", {})])
>>> marker == {"gen": 1, "end": log.end}, ShardLog(log.directory, "shard-001").resume(marker)[0]
(True, {'e': Entry(key='e', experiment='e', kind='state', data={})})
"""

from __future__ import annotations

import io
import os
import pickle
import re
import struct
import zlib
from pathlib import Path
from typing import Any

from flows.service.instances.resting import Entry

#: Where the service's modules lived before they moved into rooms (2026-11-29): a log, a
#: seed or a snapshot written before names a class (``resting.Entry``) by its old path.
MOVED = {
    "flows.service.events": "flows.service.wire.events",
    "flows.service.fields": "flows.service.wire.fields",
    "flows.service.keys": "flows.service.wire.keys",
    "flows.service._parse": "flows.service.wire._parse",
    "flows.service._records": "flows.service.wire._records",
    "flows.service.instance": "flows.service.instances.instance",
    "flows.service._answer_book": "flows.service.instances._answer_book",
    "flows.service._draw": "flows.service.instances._draw",
    "flows.service.resting": "flows.service.instances.resting",
    "flows.service._packed_table": "flows.service.instances._packed_table",
    "flows.service.registry": "flows.service.instances.registry",
    "flows.service.shard_store": "flows.service.shards.shard_store",
    "flows.service.shard_log": "flows.service.shards.shard_log",
    "flows.service.logic": "flows.service.shards.logic",
    "flows.service._event_loop": "flows.service.shards._event_loop",
    "flows.service.deadlines": "flows.service.shards.deadlines",
    "flows.service._deadline_queue": "flows.service.instances._deadline_queue",
    "flows.service.shards._deadline_queue": "flows.service.instances._deadline_queue",
    "flows.service.stream_clock": "flows.service.observe.stream_clock",
    "flows.service.shards.stream_clock": "flows.service.observe.stream_clock",
    "flows.service.metrics": "flows.service.observe.metrics",
    "flows.service.process": "flows.service.runtime.process",
    "flows.service.startup": "flows.service.runtime.startup",
    "flows.service.settings": "flows.service.runtime.settings",
    "flows.service.options": "flows.service.runtime.options",
    "flows.service.recovery": "flows.service.runtime.recovery",
    "flows.service.dir_lock": "flows.service.runtime.dir_lock",
    "flows.service.stopping": "flows.service.connectors.stopping",
    "flows.service.runtime.stopping": "flows.service.connectors.stopping",
    "flows.service.runtime.members": "flows.service.connectors.members",
    "flows.service.allocator": "flows.service.runtime.allocator",
    "flows.service.gc_freezer": "flows.service.runtime.gc_freezer",
}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return super().find_class(MOVED.get(module, module), name)


def loads(payload: bytes) -> Any:
    """``pickle.loads``, reading a class by the path it had when it was written
    (``MOVED``).

    >>> old = pickle.dumps(Entry("k", "e", "packed", None), protocol=0).replace(
    ...     b"flows.service.instances.resting", b"flows.service.resting")
    >>> loads(old)
    Entry(key='k', experiment='e', kind='packed', data=None)
    """
    return _Unpickler(io.BytesIO(payload)).load()


HEADER = struct.Struct("<II")
MIN_COMPACT_BYTES = 1 << 20  # below this a log is never rewritten
GROWTH = 3  # rewrite when what was appended exceeds GROWTH times the live state
MIN_EPOCHS = 16  # snapshots between two compactions (the older generation lives that long)
LOG_FILE = re.compile(r"(?P<shard>.+)\.(?P<gen>\d+)\.log")


class ShardLog:
    """The log of one shard: where it resumes from, what it appends, when it compacts."""

    def __init__(self, directory: Path, shard: str, min_epochs: int = MIN_EPOCHS) -> None:
        self.directory = Path(directory)
        self.shard = shard
        self.min_epochs = min_epochs
        self.gen = 0  # 0: no log yet
        self.end = 0
        self.fresh = True  # the next snapshot writes a new generation (a whole base)
        self.base = 0  # bytes of the live state written at the generation's start
        self.epochs = 0  # snapshots since the generation started

    def path(self, gen: int) -> Path:
        return self.directory / f"{self.shard}.{gen}.log"

    @property
    def seed(self) -> Path:
        """A base written outside the flow (an upgrade, an import): where a shard without
        a committed marker starts from."""
        return self.directory / f"{self.shard}.seed"

    def resume(self, marker: dict | None) -> tuple[dict[str, Entry], str | None]:
        """The entries as of ``marker`` (None: the seed, if any) and the problem found, if
        any (a damaged or missing log: what could be read is returned). Generations other
        than the marker's are removed, and the log is cut at the marker."""
        self.directory.mkdir(parents=True, exist_ok=True)
        keep = None if marker is None else int(marker["gen"])
        for gen in self._generations():
            if gen != keep:
                self.path(gen).unlink()
        if marker is None:
            if not self.seed.exists():
                return {}, None
            entries, _, problem = read_records(self.seed, None)
            return entries, problem
        self.gen, self.end = keep, int(marker["end"])
        path = self.path(self.gen)
        if not path.exists():
            return {}, f"{path.name} is missing"
        entries, read, problem = read_records(path, self.end)
        if read == self.end:
            os.truncate(path, self.end)
            self.fresh, self.base = False, self.end  # the base is unknown: assume all of it
        return entries, problem

    def _generations(self) -> list[int]:
        found = []
        for path in self.directory.glob(f"{glob_escape(self.shard)}.*.log"):
            match = LOG_FILE.fullmatch(path.name)
            if match and match["shard"] == self.shard:
                found.append(int(match["gen"]))
        return sorted(found)

    @property
    def wants_compaction(self) -> bool:
        """Whether the next snapshot should start a new generation."""
        if self.fresh:
            return True
        grown = self.end - self.base
        return self.epochs >= self.min_epochs and grown > max(MIN_COMPACT_BYTES, GROWTH * self.base)

    @property
    def marker(self) -> dict[str, int]:
        """Where the log is now: what a snapshot hands Bytewax."""
        return {"gen": self.gen, "end": self.end}

    def append(self, records: bytes) -> dict[str, int]:
        """Add what an epoch changed (``encode`` records); the marker to hand Bytewax."""
        self.write(records)
        self.epochs += 1
        return self.marker

    def write(self, records: bytes) -> None:
        """Add ``encode`` records within an epoch (instances put to rest before it
        closes): a restart reads them only if a later marker covers them, and a later
        entry of the same key replaces them. The caller encodes them, so that the same
        bytes can go to the shard's changelog too (``shard_store``)."""
        with open(self.path(self.gen), "ab") as file:
            file.write(records)
        self.end += len(records)

    def compact(self, entries: list[Entry]) -> dict[str, int]:
        """Start a new generation holding ``entries`` (the whole live state); generations
        before the current one are removed."""
        record = encode(entries)
        new = self.gen + 1
        with open(self.path(new), "wb") as file:
            file.write(record)
        for gen in self._generations():
            if gen < self.gen:
                self.path(gen).unlink()
        self.gen, self.end, self.base, self.epochs = new, len(record), len(record), 0
        self.fresh = False
        return self.marker


def shards_in(directory: Path) -> set[str]:
    """The shards that have a log or a seed in ``directory`` (none if it is missing).

    >>> import tempfile; where = Path(tempfile.mkdtemp())
    >>> _ = write_seed(where, "s1", []); _ = ShardLog(where, "s2").compact([])
    >>> sorted(shards_in(where))
    ['s1', 's2']
    """
    names = set()
    for path in directory.iterdir() if directory.is_dir() else ():
        match = LOG_FILE.fullmatch(path.name)
        if match:
            names.add(match["shard"])
        elif path.suffix == ".seed":
            names.add(path.stem)
    return names


def write_seed(directory: Path, shard: str, entries: list[Entry]) -> Path:
    """Write the base a shard starts from while Bytewax has no marker of it (an upgrade
    from per-instance snapshots, an import); written whole, then renamed into place."""
    seed = ShardLog(directory, shard).seed
    seed.parent.mkdir(parents=True, exist_ok=True)
    partial = seed.with_suffix(".partial")
    partial.write_bytes(encode(entries))
    partial.replace(seed)
    return seed


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


def encode(items: list[Any]) -> bytes:
    """One record: ``items`` (entries, or anything pickle writes), with its length and CRC."""
    payload = pickle.dumps(items, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def decode(record: bytes) -> Any:
    """What one ``encode`` record holds; ``ValueError`` for a damaged one.

    >>> decode(encode([1, 2]))
    [1, 2]
    """
    if len(record) < HEADER.size:
        raise ValueError(f"a record of {len(record)} bytes is shorter than its header")
    size, crc = HEADER.unpack_from(record)
    payload = record[HEADER.size :]
    if len(payload) != size or zlib.crc32(payload) != crc:
        raise ValueError("the record is damaged (its length or CRC does not match)")
    try:
        return loads(payload)
    except Exception as exc:  # a record that passed its CRC but does not load
        raise ValueError(f"the record does not load ({exc})") from None


def read_records(path: Path, end: int | None) -> tuple[dict[str, Entry], int, str | None]:
    """The entries of ``path``'s records up to byte ``end`` (None: all), later ones
    replacing earlier ones of the same key; the bytes read; the problem that stopped the
    reading early, if any."""
    entries: dict[str, Entry] = {}
    payloads, at, problem = read_payloads(path, end)
    for payload in payloads:
        for entry in payload:
            entries[entry.key] = entry
    return entries, at, problem


def read_payloads(path: Path, end: int | None = None) -> tuple[list[Any], int, str | None]:
    """What ``encode`` wrote in ``path``, record by record, up to byte ``end`` (None: all);
    the bytes read; the problem that stopped the reading early, if any."""
    out: list[Any] = []
    data = path.read_bytes() if end is None else _read_head(path, end)
    limit = len(data) if end is None else end
    at = 0
    while at < limit:
        if at + HEADER.size > len(data):
            return out, at, f"{path.name} ends at byte {len(data)}, inside a record at {at}"
        size, crc = HEADER.unpack_from(data, at)
        payload = data[at + HEADER.size : at + HEADER.size + size]
        if len(payload) < size or zlib.crc32(payload) != crc:
            return out, at, f"{path.name}: the record at byte {at} is damaged"
        try:
            out.append(loads(payload))
        except Exception as exc:  # a record that passed its CRC but does not load
            return out, at, f"{path.name}: the record at byte {at} does not load ({exc})"
        at += HEADER.size + size
    return out, at, None


def _read_head(path: Path, end: int) -> bytes:
    with open(path, "rb") as file:
        return file.read(end)
