"""An instance as it rests in a shard's snapshot: an entry, small for the common idle case.

An idle instance (no ticket, no waiting feedback or kept answer) is its packed bandit
(``Bandit.pack``, ~130 bytes for 10 arms) and the definition it was packed under; any
other instance is its full ``Instance.to_dict()``. A restart reads entries without
building instances: an idle one becomes an instance on its next event, so restarting a
shard of many idle users costs little more than reading its bytes.

>>> from flows.service.registry import Registry
>>> exp = Registry.from_toml('[experiments.e]\\narms = ["a", "b"]')["e"]
>>> from flows.service.instance import Instance, Open, compact_to_entries, entries_to_dict
>>> inst = Instance(exp, "e"); inst.rest()
>>> entry = entry_of(inst)
>>> entry.kind, revive(entry, exp).bandit.n_rounds
('packed', 0)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain
from typing import Any

from flows.service import _packed_table
from flows.service.instance import Instance, Open, compact_to_entries, entries_to_dict
from flows.service.registry import Experiment, split_key
from tsi_core import Bandit


@dataclass(frozen=True, slots=True)
class Entry:
    """One instance's saved state: ``kind`` ``packed`` (``data`` = (arms, template state,
    packed bytes)), ``packed+`` (the same and ``Instance.compact_entries()``) or ``state``
    (``data`` = ``Instance.to_dict()``)."""

    key: str
    experiment: str
    kind: str
    data: Any

    def __reduce__(self) -> tuple[type, tuple[str, str, str, Any]]:
        # a frozen slots dataclass unpickles through dataclasses' __setstate__, which looks
        # up its fields for every entry: a restart of 10^6 entries pays it 10^6 times
        return Entry, (self.key, self.experiment, self.kind, self.data)


def entry_of(instance: Instance) -> Entry:
    """The entry of an instance, which is put to rest first (``Instance.rest``): its
    packed bandit alone (``packed``), with its tickets and kept answers as plain tuples
    (``packed+``: ``Instance.compact_entries``), else ``Instance.to_dict()`` (``state``:
    a busy shared instance, or feedback waiting for its request)."""
    if instance._packed is None:
        _ = instance.bandit  # created if it never was
        instance.rest()
    packed, name = instance._packed, instance.experiment.name
    if packed is None:  # live with several tickets: they are saved with the entries
        packed = instance.bandit.pack(keep_pending=True)
    if packed is not None:
        data = (*instance.experiment.packing, packed)
        if instance._entries is None:
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
    entries = compact_to_entries(kept)
    same = (arms, template) == experiment.packing
    if same and len(entries) <= 1:  # the common case: nothing to unpack
        instance = Instance(experiment, entry.key)
        instance._packed = packed  # one open ticket is handed back when it is unpacked
    else:
        pending = tuple(e.ticket for e in entries if type(e) is Open)
        instance = Instance(experiment, entry.key)
        instance._bandit = (
            experiment.unpack_bandit(packed, entry.key, pending)
            if same
            else Bandit.unpack(packed, Bandit.from_dict(template), entry.key, pending)
        )
    for saved in entries:
        instance._put(saved)
    if not same:
        instance.follow(experiment, old_arms=arms)
    if instance._bandit is not None:
        instance.rest()
    return instance


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
    pending = [e.ticket for e in entries if type(e) is Open]
    bandit = Bandit.unpack(packed, Bandit.from_dict(template), entry.key, pending)
    return {
        "experiment": entry.experiment,
        "key": entry.key,
        "arms": list(arms),
        "bandit": bandit.to_dict(),
        **entries_to_dict(entries),
    }


class Resting:
    """The saved instances a shard holds without building them: an idle one as its packed
    bytes alone (its experiment's packing is kept once per experiment), any other (one
    whose experiment left the registry, one that could not be built) as its ``Entry``.

    An idle per-user instance then costs its key and packed bandit in one C table
    (``flows.service._packed_table``: ~180 B for 10 arms, against ~280 B in a dict of
    bytes), instead of an ``Instance`` around them.

    >>> from flows.service.registry import Registry
    >>> exp = Registry.from_toml('[experiments.e]\\narms = ["a", "b"]')["e"]
    >>> resting = Resting()
    >>> inst = Instance(exp, "e"); inst.rest(); _ = entry_of(inst)
    >>> resting.put_instance(inst), "e" in resting, resting.pop("e").kind
    (True, True, 'packed')
    """

    def __init__(self) -> None:
        self._packed = _packed_table.PackedTable()  # idle instances: key -> packed bandit
        self._held: dict[str, Entry] = {}  # any other: key -> its entry
        self._packings: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {}
        # per experiment, its packing and the last (arms, template) objects found equal to
        # it: the entries of one record share them, so a restart compares once per record
        self._matched: dict[str, tuple[Any, Any, Any]] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._held or key in self._packed

    def __iter__(self) -> Iterator[str]:
        return chain(self._held, self._packed)

    def __len__(self) -> int:
        return len(self._held) + len(self._packed)

    def put(self, entry: Entry, experiment: Experiment | None) -> None:
        """Hold an entry, as bytes if it is packed under ``experiment``'s definition."""
        if experiment is not None and entry.kind == "packed":
            arms, template, packed = entry.data
            packing = experiment.packing
            known, last_arms, last_template = self._matched.get(experiment.name, (None,) * 3)
            same = known is packing and arms is last_arms and template is last_template
            if same or (arms, template) == packing:
                self._matched[experiment.name] = (packing, arms, template)
                self._put_bytes(entry.key, experiment, packed)
                return
        self._packed.pop(entry.key)
        self._held[entry.key] = entry

    def put_instance(self, instance: Instance) -> bool:
        """Hold an idle instance at rest (no entries, nothing to hand out, packed) as its
        bytes; False (nothing done) for any other."""
        idle = instance._entries is None and not instance._notices and instance._bandit is None
        if not idle or instance._packed is None:
            return False
        self._put_bytes(instance.key, instance.experiment, instance._packed)
        return True

    def pop(self, key: str) -> Entry | None:
        """The entry of ``key`` (no longer held), or None."""
        packed = self._packed.pop(key)
        return self._held.pop(key, None) if packed is None else self._entry(key, packed)

    def entries(self) -> list[Entry]:
        packed = [self._entry(key, held) for key, held in self._packed.items()]
        return packed + list(self._held.values())

    def _put_bytes(self, key: str, experiment: Experiment, packed: bytes) -> None:
        name, packing = experiment.name, experiment.packing
        known = self._packings.get(name)
        if known is not None and known is not packing and known != packing:
            self._freeze(name)  # bytes packed under the old definition become entries
        self._packings[name] = packing
        self._held.pop(key, None)
        self._packed[key] = packed

    def _freeze(self, name: str) -> None:
        for key, packed in self._packed.items():
            if split_key(key)[0] == name:
                self._held[key] = self._entry(key, packed)
                self._packed.pop(key)

    def _entry(self, key: str, held: Entry | bytes) -> Entry:
        if type(held) is not bytes:
            return held
        name = split_key(key)[0]
        return Entry(key, name, "packed", (*self._packings[name], held))
