"""A shard's log mirrored to a changelog: what is written, how it is read back.

Each shard's log (``shard_log``) is the cache of a changelog that outlives the disk (Kafka
Streams' pattern): every entry the shard writes to its log is appended to the changelog
too, keyed by instance (``Mirror.append``: the same record bytes, one entry each), and
each epoch's close ends with a ``Marker`` (``Mirror.mark``, under ``MARKER_KEY``, which no
instance key can be) once the epoch's entries are in; the close returns only when the
changelog has acknowledged them (``Mirror.acknowledged``), so Bytewax never commits an
epoch whose state the changelog lacks.

Read back (``replay``), the changelog up to its last marker is the shard's state; what
follows it belongs to an epoch never committed and is dropped, and ``repair`` writes
the committed value (or a tombstone) of those keys again, then a marker, so that a
compacted changelog can never promote them: the topic's ``min.compaction.lag.ms`` keeps the
cleaner from letting a record written after the last marker replace the committed one
before a restart has repaired it. The changelog itself (Kafka: compacted,
partition = shard index) is I/O at the edge: the store sees the two protocols below;
``MemoryChangelog`` keeps one in memory for tests.

>>> from flows.service.instances.resting import Entry
>>> changelog = MemoryChangelog()
>>> mirror = changelog.mirror("shard-000-of-001")
>>> mirror.append("e", encode([Entry("e", "e", "state", {})]))
>>> mirror.mark(Marker(1, {("t", 0): 7})); mirror.acknowledged()  # the marker's offset
1
>>> mirror.append("e", None)  # an epoch that never closed
>>> changelog.deliver()
>>> found = replay(changelog.read("shard-000-of-001"))
>>> list(found.entries), found.marker.seq, found.tail
(['e'], 1, ['e'])
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from flows.service.instances.resting import Entry
from flows.service.shards.changelog_chunks import CHUNK, Assembler, ChunkedMirror, base_key
from flows.service.shards.shard_log import decode, encode
from flows.service.wire.keys import shard_layout

log = logging.getLogger(__name__)

__all__ = [
    "MARKER_KEY",
    "Changelog",
    "ChangelogError",
    "ForeignChangelogError",
    "Marker",
    "MemoryChangelog",
    "Mirror",
    "Mirrored",
    "Replayed",
    "Start",
    "check_application",
    "encode",
    "repair",
    "replay",
    "shard_index",
    "start",
]

#: The key of a shard's markers: an instance key never starts with a NUL byte (an
#: experiment's name is printable).
MARKER_KEY = "\x00marker"

Record = tuple[int, str, bytes | None]  # (offset, key, value); None: a tombstone


@dataclass(frozen=True)
class Marker:
    """The end of a committed epoch in a shard's changelog: its sequence (monotone per
    shard), what the shard's state includes of its input (per input partition, (topic,
    partition), the highest input offset applied) and the lineage of the local log that
    wrote it (a new one each time a shard starts from something else than its own log)."""

    seq: int
    seen: dict[tuple[str, int], int] = field(default_factory=dict)
    lineage: str = ""
    application: str = ""  # the application that wrote it ('': a store from before ids)


class ChangelogError(Exception):
    """A changelog that cannot be read (the broker, or a record that does not decode)."""


class ForeignChangelogError(ChangelogError):
    """A changelog holding another application's markers: its state is not this one's."""


def check_application(records: Iterable[Record], application: str, where: str) -> None:
    """Refuse (``ForeignChangelogError``, naming both) ``records`` whose markers another
    application wrote; markers without an application (older stores) are accepted.

    >>> mine = encode([Marker(1, application="shop")])
    >>> check_application([(0, MARKER_KEY, mine)], "shop", "t[0]")
    >>> try:
    ...     check_application([(0, MARKER_KEY, mine)], "blog", "t[0]")
    ... except ForeignChangelogError as exc:
    ...     print(str(exc).split(":")[0])
    changelog t[0] holds the state of application 'shop', not of 'blog'
    """
    for _, key, value in records:
        if key != MARKER_KEY:
            continue
        marker = _decoded(key, value)
        other = getattr(marker, "application", "")
        if other and other != application:
            raise ForeignChangelogError(
                f"changelog {where} holds the state of application {other!r}, not of "
                f"{application!r}: give this service its own --changelog-topic (the "
                f"default, {{app}}.changelog, is named from --group-id), or run it as "
                f"--group-id {other}"
            )


class Mirror(Protocol):
    """One shard's side of its changelog: what its store writes through."""

    def append(self, key: str, value: bytes | None) -> None:
        """Send one instance's record (None: a tombstone); need not wait."""

    def extend(self, records: list[tuple[str, bytes]]) -> None:
        """Send many instances' records (none a tombstone), in order: ``append`` each."""

    def mark(self, marker: Marker) -> None:
        """Send the marker that ends an epoch, after its records."""

    def acknowledged(self) -> int | None:
        """Return once everything sent is written for good, with the offset of the last
        marker sent (None: none since the last call); raise if any of it was not."""


class Changelog(Protocol):
    """Where the shards' changelogs live: a mirror per shard, and a shard's read back.
    ``application``: whose changelog it is (its markers carry it); ``name``: where it is,
    as messages name it."""

    application: str
    name: str

    def mirror(self, shard: str) -> Mirror:
        """The mirror shard ``shard`` writes through."""

    def read(self, shard: str, after: int = -1) -> list[Record]:
        """The records of ``shard``'s changelog at offsets above ``after``, in order ([]
        for none); ``ChangelogError`` when it cannot be read."""

    def settle(self, mirrors: list[Any]) -> list[int | None]:
        """Wait once until everything ``mirrors`` (its own) sent is written for good: each
        one's last marker's offset (None: none since the last call); raise if any of it
        was not (an epoch's close of many shards: ``logic.close_shards``)."""


def shard_index(shard: str) -> int:
    """The changelog partition of a shard: its index (``keys.shard_name``).

    >>> shard_index("shard-007-of-032"), shard_index("shard-1000-of-1024")
    (7, 1000)
    """
    layout = shard_layout(shard)
    if layout is None:
        raise ValueError(f"{shard!r} is not a shard name (shard-NNN-of-MMM)")
    return layout[0]


@dataclass
class Replayed:
    """A changelog read back: the entries as of its last marker, that marker (None: no
    epoch was ever marked), and the keys written after it (``tail``), in order."""

    entries: dict[str, Entry]
    marker: Marker | None
    tail: list[str]


def replay(records: Iterable[Record], base: dict[str, Entry] | None = None) -> Replayed:
    """The state a changelog's ``records`` hold as of their last marker (applied over
    ``base``: the state before them, if any), a record in chunks joined
    (``changelog_chunks``). ``ChangelogError`` for a record that does not decode, or a
    committed one whose chunks are missing or corrupt (naming its key)."""
    committed: dict[str, Entry | _Broken] = dict(base or {})
    pending: dict[str, Entry | _Broken | None] = {}
    loose: dict[str, None] = {}  # keys with chunks since the last marker
    chunks = Assembler()
    marker = None
    for _, key, value in records:
        if key == MARKER_KEY:
            marker = _decoded(key, value)
            if not isinstance(marker, Marker):
                raise ChangelogError(f"the marker record holds {type(marker).__name__}")
            for each, entry in pending.items():
                if entry is None:
                    committed.pop(each, None)
                else:
                    committed[each] = entry
            pending.clear()
            loose.clear()
        else:
            pending.update(_joined(chunks, key, value, loose))
    for entry in committed.values():
        if isinstance(entry, _Broken):
            raise ChangelogError(entry.problem)
    tail = list(dict.fromkeys([*pending, *loose]))
    return Replayed(cast("dict[str, Entry]", committed), marker, tail)


@dataclass
class _Broken:
    """A record whose chunks do not join: an error only if it is committed and stays so."""

    problem: str


def _joined(
    chunks: Assembler, key: str, value: bytes | None, loose: dict[str, None]
) -> dict[str, Entry | _Broken | None]:
    """What record ``key`` makes pending: its entry, a tombstone, nothing for a chunk
    (its key noted in ``loose``), or ``_Broken``: a record superseded later (compaction
    keeps only each key's newest chunks) may no longer join."""
    try:
        base, whole = chunks.read(key, value)
    except ValueError as exc:
        return {key: _Broken(str(exc))}
    if whole is CHUNK:
        loose[base] = None
        return {}
    return {base: None if whole is None else _decoded(base, whole)}


def _decoded(key: str, value: bytes | None) -> object:
    if value is None:
        raise ChangelogError(f"record {key!r} is a tombstone where a marker belongs")
    try:
        items = decode(value)
    except ValueError as exc:
        raise ChangelogError(f"record {key!r}: {exc}") from None
    if len(items) != 1:
        raise ChangelogError(f"record {key!r} holds {len(items)} items, not one")
    return items[0]


def repair(
    mirror: Mirror, tail: Iterable[str], entries: dict[str, Entry], marker: Marker
) -> int | None:
    """Write again the committed value (``entries``), or a tombstone, of each key of
    ``tail`` (written after the last marker, in an epoch never committed), then
    ``marker``; the marker's offset once the changelog has acknowledged them."""
    for key in tail:
        entry = entries.get(key)
        mirror.append(key, None if entry is None else encode([entry]))
    mirror.mark(marker)
    return mirror.acknowledged()


@dataclass
class Mirrored:
    """Where a shard's changelog stands (kept in the shard's Bytewax state): the last
    marker's sequence, offset (None: none acknowledged yet) and lineage, the input the
    shard's state includes (``Marker.seen``), and the application that writes it."""

    seq: int
    offset: int | None
    lineage: str
    seen: dict[tuple[str, int], int] = field(default_factory=dict)
    application: str = ""

    def marker(self) -> Marker:
        """The next marker: the sequence after this one's."""
        return Marker(self.seq + 1, dict(self.seen), self.lineage, self.application)


@dataclass
class Start:
    """A shard's start-up decision (``start``): the entries it starts from, where its
    changelog stands, the input already in its state when it was rebuilt from the
    changelog (``guard``: per input partition, events at or below that offset are
    dropped), and what went wrong (``problem``: a ``state_lost``), if anything."""

    entries: dict[str, Entry]
    mirrored: Mirrored
    guard: dict[tuple[str, int], int] = field(default_factory=dict)
    rebuilt: bool = False
    problem: str | None = None


def _lineage() -> str:
    return uuid.uuid4().hex


def start(
    changelog: Changelog,
    shard: str,
    local: dict[str, Entry],
    damaged: str | None,
    mirrored: dict[str, Any] | None,
) -> Start:
    """Decide where shard ``shard`` starts: from its local log (``local``, read as of its
    Bytewax state; ``damaged`` says what was wrong with it, if anything) or from its
    changelog; and bring the changelog in line with that choice.

    - ``mirrored`` (the Bytewax state's ``Mirrored``, as a dict) and a sound local log:
      the local log, unless the changelog holds markers of another lineage after
      ``mirrored`` (another process served the shard since): then the changelog. Its own
      lineage's markers after ``mirrored`` (epochs Bytewax had not committed yet) bring
      the local entries up to the last one; what follows it is repaired. Either way the
      state includes the input up to its marker's ``seen`` (the guard), never less.
      A changelog that lacks the marker ``mirrored`` names (a new topic: renamed, deleted)
      is written the local entries again (as a seed is).
    - a sound local log holding entries and no ``mirrored`` (a seed, a store from before
      the changelog): the local entries, all written to the changelog (its other keys
      tombstoned).
    - otherwise (nothing local, or a damaged log): rebuilt from the changelog up to its
      last marker; nothing there either: a first start.

    Another application's markers refuse the start (``ForeignChangelogError``); a
    changelog that cannot be read leaves the local entries, with a ``problem``."""
    mirror = changelog.mirror(shard)
    held = None if mirrored is None else Mirrored(**mirrored)
    app = changelog.application
    try:
        if held is not None and damaged is None:
            held.application = app
            after = -1 if held.offset is None else held.offset - 1  # its own marker too
            records = _checked(changelog, shard, after)
            markers = [_decoded(k, v) for _, k, v in records if k == MARKER_KEY]
            if held.offset is not None and not markers:
                log.warning(
                    "%s: the changelog %s lacks this store's last marker (offset %d): the "
                    "store's %d instances are written to it again",
                    shard,
                    changelog.name,
                    held.offset,
                    len(local),
                )
                return _seeded(changelog, mirror, shard, local, held.seen)
            if all(getattr(m, "lineage", None) == held.lineage for m in markers):
                return _kept(mirror, held, local, _after_own(records, held), markers)
        elif held is None and damaged is None and local:
            return _seeded(changelog, mirror, shard, local)
        return _rebuilt(changelog, mirror, shard, local, damaged)
    except ForeignChangelogError:
        raise
    except ChangelogError as exc:
        problem = f"the shard's changelog cannot be read ({exc})"
        if damaged is not None:
            problem = f"the shard's log is damaged ({damaged}) and {problem}"
        kept = held or Mirrored(0, None, _lineage(), application=app)
        return Start(local, kept, problem=f"{problem}: {len(local)} instances read")


def _checked(changelog: Changelog, shard: str, after: int = -1) -> list[Record]:
    """``changelog.read``, refused when another application wrote it."""
    records = changelog.read(shard, after)
    where = f"{changelog.name}[{shard_index(shard)}]"
    check_application(records, changelog.application, where)
    return records


def _after_own(records: list[Record], held: Mirrored) -> list[Record]:
    """``records`` without the store's own last marker (at ``held.offset``)."""
    return [r for r in records if held.offset is None or r[0] > held.offset]


def _kept(
    mirror: Mirror,
    held: Mirrored,
    local: dict[str, Entry],
    records: list[Record],
    markers: list[Any],
) -> Start:
    """The local log, brought up to the changelog's last marker when its own lineage
    marked epochs after it (acknowledged, not yet committed by Bytewax, whose commit lags:
    the group's commits, where a lost directory resumes, may have passed them), what
    follows repaired; guarded by the input its state includes (``Marker.seen``), which
    may lie past the input positions Bytewax resumes from."""
    if not records:
        return Start(local, held, guard=dict(held.seen))
    found = replay(records, local)
    seen = held.seen if found.marker is None else found.marker.seen
    seq = max([held.seq] + [m.seq for m in markers])
    now = Mirrored(seq, None, held.lineage, dict(seen), held.application)
    now.offset = repair(mirror, found.tail, found.entries, now.marker())
    now.seq += 1
    return Start(found.entries, now, dict(seen), rebuilt=found.marker is not None)


def _seeded(
    changelog: Changelog,
    mirror: Mirror,
    shard: str,
    local: dict[str, Entry],
    seen: dict[tuple[str, int], int] | None = None,
) -> Start:
    """Local entries without a changelog position: all of them written to it (``seen``:
    the input they include, when known)."""
    records = _checked(changelog, shard)
    seq = max([0] + [m.seq for _, k, v in records if k == MARKER_KEY for m in [_decoded(k, v)]])
    gone = [base_key(k) for _, k, _ in records if k != MARKER_KEY]
    gone = [k for k in gone if k not in local]
    now = Mirrored(seq, None, _lineage(), dict(seen or {}), changelog.application)
    now.offset = repair(mirror, list(local) + list(dict.fromkeys(gone)), local, now.marker())
    now.seq += 1
    return Start(local, now, dict(now.seen))


def _rebuilt(
    changelog: Changelog,
    mirror: Mirror,
    shard: str,
    local: dict[str, Entry],
    damaged: str | None,
) -> Start:
    """The changelog's state as of its last marker (nothing local, or a damaged log)."""
    found = replay(_checked(changelog, shard))
    app = changelog.application
    if found.marker is None:  # never marked: a first start (what it holds is tombstoned)
        problem = None if damaged is None else f"the shard's log is damaged: {damaged}"
        now = Mirrored(0, None, _lineage(), application=app)
        if found.tail:
            now.offset = repair(mirror, found.tail, local, now.marker())
            now.seq += 1
        return Start(local, now, problem=problem)
    last = found.marker
    now = Mirrored(last.seq, None, _lineage(), dict(last.seen), app)
    now.offset = repair(mirror, found.tail, found.entries, now.marker())
    now.seq += 1
    return Start(found.entries, now, guard=dict(last.seen), rebuilt=True)


class MemoryChangelog:
    """Changelogs in memory (tests): a record is in once acknowledged; ``lose`` drops
    what was sent and not acknowledged (a process killed), ``compact`` does what Kafka's
    log cleaner may (only the last record of each key, in order), ``deliver`` what
    reaches the broker unacknowledged. With ``max_bytes``, a value longer is refused (a
    broker's message limit) and the mirrors split records to fit (``ChunkedMirror``)."""

    def __init__(
        self, application: str = "tsi", name: str = "memory", max_bytes: int | None = None
    ) -> None:
        self.application = application
        self.name = name
        self.logs: dict[str, list[Record]] = {}
        self.sent: dict[str, list[Record]] = {}
        self.max_bytes = max_bytes
        self.chunked: dict[str, dict[str, int]] = {}  # per shard: ``ChunkedMirror.counts``
        self.waits = 0  # the waits for acknowledgements (``settle``)

    def mirror(self, shard: str) -> Mirror:
        mirror = _MemoryMirror(self, shard)
        if self.max_bytes is None:
            return mirror
        return ChunkedMirror(mirror, self.max_bytes, self.chunked.setdefault(shard, {}))

    def read(self, shard: str, after: int = -1) -> list[Record]:
        return [record for record in self.logs.get(shard, []) if record[0] > after]

    def settle(self, mirrors: list[Any]) -> list[int | None]:
        """What ``mirrors`` sent written, in one wait (counted in ``waits``); each one's
        last marker's offset."""
        self.waits += 1
        return [mirror.acknowledged() for mirror in mirrors]

    def prefetch(self, afters: dict[str, int]) -> dict[str, list[Record]]:
        """Each shard's records above its offset (``KafkaChangelog.prefetch``)."""
        return {shard: self.read(shard, after) for shard, after in afters.items()}

    def lose(self) -> None:
        self.sent.clear()

    def deliver(self) -> None:
        """What was sent reaches the changelog, unacknowledged (a process killed after)."""
        for shard in list(self.sent):
            self._written(shard)

    def _written(self, shard: str) -> int | None:
        """Write what ``shard`` sent; the offset of its last marker, if any."""
        records = self.logs.setdefault(shard, [])
        marked = None
        for key, value in self.sent.pop(shard, []):
            offset = records[-1][0] + 1 if records else 0
            records.append((offset, key, value))
            marked = offset if key == MARKER_KEY else marked
        return marked

    def compact(self, upto: int | None = None) -> None:
        """Keep only the last record of each key among those at offsets up to ``upto``
        (None: all): Kafka's cleaner leaves records younger than the topic's
        ``min.compaction.lag.ms`` out of both sides."""
        for shard, records in self.logs.items():
            old = [r for r in records if upto is None or r[0] <= upto]
            last = {key: offset for offset, key, _ in old}
            self.logs[shard] = [r for r in old if last[r[1]] == r[0]] + records[len(old) :]


class _MemoryMirror:
    def __init__(self, changelog: MemoryChangelog, shard: str) -> None:
        self.changelog = changelog
        self.shard = shard

    def append(self, key: str, value: bytes | None) -> None:
        limit = self.changelog.max_bytes
        if value is not None and limit is not None and len(value) > limit:
            raise RuntimeError(f"record {key!r} of {len(value)} bytes: over {limit}")
        self.changelog.sent.setdefault(self.shard, []).append((key, value))

    def extend(self, records: list[tuple[str, bytes]]) -> None:
        for key, value in records:
            self.append(key, value)

    def mark(self, marker: Marker) -> None:
        self.append(MARKER_KEY, encode([marker]))

    def acknowledged(self) -> int | None:
        return self.changelog._written(self.shard)
