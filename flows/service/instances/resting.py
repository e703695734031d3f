"""An instance as it rests in a shard's snapshot: an entry, small for the common idle case.

An idle instance (no ticket, no waiting feedback or kept answer) is its packed bandit
(``Bandit.pack`` in ``tsi_core._packing``'s layout: at 10 arms 138 to about 250 bytes for
the default learner, 128 for the others) and the definition it was packed under; any
other instance is its full ``Instance.to_dict()``. A restart reads
entries without building instances: an idle one becomes an instance on its next event,
so restarting a shard of many idle users costs little more than reading its bytes.

>>> from flows.service.instances.registry import Registry
>>> exp = Registry.from_toml('[experiments.e]\\narms = ["a", "b"]')["e"]
>>> from flows.service.instances.instance import Instance, Open, compact_to_entries, entries_to_dict
>>> inst = Instance(exp, "e"); inst.rest()
>>> entry = entry_of(inst)
>>> entry.kind, revive(entry, exp).bandit.n_rounds
('packed', 0)
"""

from __future__ import annotations

import marshal
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain
from typing import Any

from flows.service.instances import _packed_table
from flows.service.instances._answer_book import AnswerBook
from flows.service.instances.instance import (
    ANSWER_CODES,
    Instance,
    Open,
    compact_to_entries,
    entries_to_dict,
)
from flows.service.instances.registry import Experiment
from flows.service.wire.keys import split_key
from tsi_core import Bandit

#: Entries an instance may rest with. A busy shared instance keeps thousands of answers
#: for retries: resting, every request would scan them (``Instance._kept``) and every
#: rest write them all; it stays live, as it did before any instance rested with more
#: than one entry. A user of a per-user experiment keeps a few.
MAX_RESTING_ENTRIES = 64


@dataclass(slots=True)
class Entry:
    """One instance's saved state: ``kind`` ``packed`` (``data`` = (arms, template state,
    packed bytes)), ``packed+`` (the same and ``Instance.compact_entries()``) or ``state``
    (``data`` = ``Instance.to_dict()``). Treated as a value, never changed once built; not
    frozen, which would make it several times slower to build (one each time an instance
    rests or is revived; bench/RESULTS.md, "Figures behind the code": records built in C)."""

    key: str
    experiment: str
    kind: str
    data: Any

    def __reduce__(self) -> tuple[type, tuple[str, str, str, Any]]:
        # unpickled by one call of the class: a slots dataclass's own pickling sets its
        # fields one by one, and a restart of 10^6 entries pays it 10^6 times
        return Entry, (self.key, self.experiment, self.kind, self.data)


def entry_of(instance: Instance) -> Entry:
    """The entry of an instance, which is put to rest first (``Instance.rest``): its
    packed bandit alone (``packed``), with its tickets and kept answers as plain tuples
    (``packed+``: ``Instance.compact_entries``), else ``Instance.to_dict()`` (``state``:
    a busy shared instance, or feedback waiting for its request)."""
    if instance.packed is None:
        _ = instance.bandit  # created if it never was
        instance.rest()
    packed, name = instance.packed, instance.experiment.name
    if packed is None:  # live with several tickets: they are saved with the entries
        packed = instance.bandit.pack(keep_pending=True)
    if packed is not None:
        data = (*instance.experiment.packing, packed)
        if instance.holds_nothing():
            return Entry(instance.key, name, "packed", data)
        kept = instance.compact_entries()
        if kept is not None:
            return Entry(instance.key, name, "packed+", (*data, kept))
    return Entry(instance.key, name, "state", instance.to_dict())


def revive(entry: Entry, experiment: Experiment) -> Instance:
    """The instance an entry saved, following ``experiment`` if its definition changed."""
    if entry.kind == "state":
        return Instance.from_dict(experiment, entry.data)
    arms, template, packed, kept = _packed_parts(entry)
    same = (arms, template) == experiment.packing
    if same and 1 < len(kept) <= MAX_RESTING_ENTRIES and _answers_only(kept):
        instance = Instance.at_rest(experiment, entry.key, packed)  # a user who came back:
        instance.keep_compact(kept)  # its answers are built only if something reads them
        return instance
    entries = compact_to_entries(kept)
    if same and len(entries) <= 1:  # the common case: nothing to unpack
        instance = Instance.at_rest(experiment, entry.key, packed)  # one open ticket is
    else:  # handed back when it is unpacked
        pending = tuple(e.ticket for e in entries if isinstance(e, Open))
        bandit = (
            experiment.unpack_bandit(packed, entry.key, pending)
            if same
            else Bandit.unpack(packed, Bandit.from_dict(template), entry.key, pending)
        )
        instance = Instance(experiment, entry.key, bandit)
    for saved in entries:
        instance.put(saved)
    if not same:
        instance.follow(experiment, old_arms=arms)
    instance.rest()
    return instance


def _answers_only(kept: tuple[tuple, ...]) -> bool:
    """Whether the compact entries ``kept`` are all answers kept for retries."""
    return all(item[0] in ANSWER_CODES for item in kept)


def _packed_parts(entry: Entry) -> tuple[Any, Any, bytes, tuple]:
    """(arms, template, packed bytes, compact entries) of a ``packed`` or ``packed+`` entry."""
    if entry.kind == "packed+":
        return entry.data
    arms, template, packed = entry.data
    return arms, template, packed, ()


def state_of(entry: Entry) -> dict[str, Any]:
    """The entry as ``Instance.to_dict()`` (what ``tsi inspect`` reads)."""
    if entry.kind == "state":
        return entry.data
    arms, template, packed, kept = _packed_parts(entry)
    entries = compact_to_entries(kept)
    pending = [e.ticket for e in entries if isinstance(e, Open)]
    bandit = Bandit.unpack(packed, Bandit.from_dict(template), entry.key, pending)
    return {
        "experiment": entry.experiment,
        "key": entry.key,
        "arms": list(arms),
        "bandit": bandit.to_dict(),
        **entries_to_dict(entries),
    }


def open_tickets(entry: Entry) -> int:
    """The open tickets a ``packed+`` entry holds (0 for any other: not built, not counted)."""
    return sum(1 for item in entry.data[3] if item[0] == "o") if entry.kind == "packed+" else 0


class Resting:
    """The saved instances a shard holds without building them, in C tables
    (``flows.service.instances._packed_table``): an idle one as its packed bandit, one waiting on
    tickets or kept answers as its packed bandit and their plain tuples, by the earliest
    of their deadlines (``due``); any other (one whose experiment left the registry, one that
    could not be built) as its ``Entry``. Each record names the definition it was packed
    under (an index into the shard's list of them, a varint: one byte for the first 128),
    so a registry change reaches a resting instance when it is next built (``revive``
    follows it).

    An idle instance costs a fraction of what it would as a dict of bytes or as an
    ``Instance``, and one waiting on its ticket a fraction of what it would live
    (bench/RESULTS.md, "Figures behind the code": resting tables and entries).

    >>> from flows.service.instances.registry import Registry
    >>> exp = Registry.from_toml('[experiments.e]\\narms = ["a", "b"]')["e"]
    >>> resting = Resting()
    >>> inst = Instance(exp, "e"); inst.rest(); _ = entry_of(inst)
    >>> resting.put_instance(inst), "e" in resting, resting.pop("e").kind
    (True, True, 'packed')
    """

    def __init__(self) -> None:
        self._idle = _packed_table.PackedTable()  # key -> packing index, packed bandit
        self._waiting = _packed_table.PackedTable(timed=True)  # and its entry, by deadline
        self._held: dict[str, Entry] = {}  # any other: key -> its entry
        self._packings: list[tuple[Any, Any]] = []  # (arms, template) by index
        # per experiment, the objects last found equal to a packing and its index's bytes:
        # an experiment's packing, or the (arms, template) shared by the entries of a record
        self._known: dict[str, tuple[Any, Any, bytes]] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._idle or key in self._waiting or key in self._held

    def __iter__(self) -> Iterator[str]:
        return chain(self._held, self._idle, self._waiting)

    def __len__(self) -> int:
        return len(self._held) + len(self._idle) + len(self._waiting)

    def put(self, entry: Entry) -> None:
        """Hold an entry as it is (an archived instance, one that could not be built)."""
        self._discard(entry.key)
        self._held[entry.key] = entry

    def take(self, entry: Entry) -> bool:
        """Hold a ``packed`` entry, or a ``packed+`` one of a single entry or of kept
        answers alone, in the tables; False (nothing done) for any other (built at once:
        a registry change that retires an arm of its open tickets writes their dead
        letters then)."""
        if entry.kind == "packed":
            arms, template, packed = entry.data
            self._discard(entry.key)
            self._idle[entry.key] = self._index(entry.experiment, arms, template) + packed
            return True
        kept = entry.data[3] if entry.kind == "packed+" else ()
        if not kept or len(kept) > MAX_RESTING_ENTRIES:
            return False
        if len(kept) > 1 and not _answers_only(kept):
            return False
        arms, template, packed, kept = entry.data
        index = self._index(entry.experiment, arms, template)
        self._discard(entry.key)
        return self._wait(entry.key, index, packed, kept)

    def put_instance(self, instance: Instance) -> bool:
        """Hold an instance at rest (packed, nothing to hand out) that is idle or waits on
        its entries (none of them feedback waiting for its request); False (nothing done)
        for any other. An instance holding several entries is packed only once none of
        them is an open ticket (``Instance.rest``): a user who came back within the retry
        window rests with the answers kept for it, in a fraction of the bytes they take as
        live objects (bench/RESULTS.md, "Figures behind the code": resting tables and
        entries)."""
        if not instance.is_at_rest() or instance.n_held() > MAX_RESTING_ENTRIES:
            return False
        experiment = instance.experiment
        index = self._index(experiment.name, *experiment.packing)
        if instance.holds_nothing():  # a live instance is never held here too
            self._idle[instance.key] = index + instance.packed
            return True
        kept = instance.compact_entries()
        return kept is not None and self._wait(instance.key, index, instance.packed, kept)

    def _wait(self, key: str, index: bytes, packed: bytes, kept: tuple) -> bool:
        """Hold a record waiting on its entries ``kept``, by the earliest of their
        deadlines."""
        try:
            value = index + marshal.dumps((packed, kept))
        except ValueError:  # a value marshal cannot write: the instance stays as it is
            return False
        self._waiting.put(key, value, min(item[4] for item in kept))
        return True

    def drop_answer(self, entry: Entry, now: float, packing: tuple[Any, Any]) -> Entry | None:
        """The entry that a waiting instance's ``entry`` (popped) becomes when its time has
        come, without building it: the record without its kept answers due by ``now``
        (the record of its packed bandit alone if none is left), which is what building
        it, expiring them (no output) and putting it to rest again leave. Only for a
        record of ``packing`` (the experiment in force: another would have to follow it
        first) that holds kept answers alone, one at least due; None for any other (the
        caller builds it).

        >>> from flows.service.instances.instance import Settled
        >>> from flows.service.instances.registry import Registry
        >>> exp = Registry.from_toml('[experiments.e]\\narms = ["a", "b"]')["e"]
        >>> inst, resting = Instance(exp, "e"), Resting()
        >>> inst.put(Settled("r1", inst.bandit.select(u=0.5), None, 9.0))
        >>> inst.rest(); resting.put_instance(inst)
        True
        >>> entry = resting.pop("e")
        >>> resting.drop_answer(entry, 8.0, exp.packing) is None  # not due yet: kept
        True
        >>> resting.drop_answer(entry, 9.0, exp.packing).kind
        'packed'
        """
        if entry.kind != "packed+":
            return None
        arms, template, packed, kept = entry.data
        if not _answers_only(kept) or (arms, template) != packing:
            return None
        book = AnswerBook.of(kept)  # its expiry is the one rule: what a live book drops
        if book is None or not book.expire(now):  # answers a book cannot hold, or none due
            return None
        left = tuple(book)
        if not left:
            return Entry(entry.key, entry.experiment, "packed", (arms, template, packed))
        return Entry(entry.key, entry.experiment, "packed+", (arms, template, packed, left))

    def pop(self, key: str) -> Entry | None:
        """The entry of ``key`` (no longer held), or None."""
        value = self._idle.pop(key)
        if value is not None:
            return self._entry(key, value, waiting=False)
        value = self._waiting.pop(key)
        if value is not None:
            return self._entry(key, value, waiting=True)
        return self._held.pop(key, None)

    def due(self, now: float) -> list[tuple[float, str]]:
        """(deadline, key) of the waiting instances whose deadline has come, earliest
        first; they stay held until popped."""
        return self._waiting.due(now)

    def next_deadline(self) -> float | None:
        """The earliest deadline of a waiting instance (or of one since built), or None."""
        return self._waiting.next_deadline()

    def waiting(self) -> list[str]:
        """The keys of the instances waiting on an entry."""
        return list(self._waiting)

    def entries(self) -> list[Entry]:
        idle = [self._entry(key, value, False) for key, value in self._idle.items()]
        waiting = [self._entry(key, value, True) for key, value in self._waiting.items()]
        return idle + waiting + list(self._held.values())

    def _discard(self, key: str) -> None:
        self._idle.pop(key)
        self._waiting.pop(key)
        self._held.pop(key, None)

    def _index(self, name: str, arms: Any, template: Any) -> bytes:
        """The bytes naming (arms, template) in this shard's list of packings."""
        known = self._known.get(name)
        if known is not None and known[0] is arms and known[1] is template:
            return known[2]
        packing = (arms, template)
        if packing not in self._packings:
            self._packings.append(packing)
        index = _packed_table.varint(self._packings.index(packing))
        self._known[name] = (arms, template, index)
        return index

    def _entry(self, key: str, value: bytes, waiting: bool) -> Entry:
        index, size = _packed_table.read_varint(value)
        arms, template = self._packings[index]
        name = split_key(key)[0]
        if not waiting:
            return Entry(key, name, "packed", (arms, template, value[size:]))
        packed, kept = marshal.loads(value[size:])
        return Entry(key, name, "packed+", (arms, template, packed, kept))
