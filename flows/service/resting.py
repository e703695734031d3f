"""An instance as it rests in a shard's snapshot: an entry, small for the common idle case.

An idle instance (no ticket, no waiting feedback or kept answer) is its packed bandit
(``Bandit.pack``, ~130 bytes for 10 arms) and the definition it was packed under; any
other instance is its full ``Instance.to_dict()``. A restart reads entries without
building instances: an idle one becomes an instance on its next event, so restarting a
shard of many idle users costs little more than reading its bytes.

>>> from flows.service.registry import Registry
>>> exp = Registry.from_toml('[experiments.e]\\narms = ["a", "b"]')["e"]
>>> from flows.service.instance import Instance
>>> inst = Instance(exp, "e"); inst.rest()
>>> entry = entry_of(inst)
>>> entry.kind, revive(entry, exp).bandit.n_rounds
('packed', 0)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flows.service.instance import Instance
from flows.service.registry import Experiment
from tsi_core import Bandit


@dataclass(frozen=True, slots=True)
class Entry:
    """One instance's saved state: ``kind`` ``packed`` (``data`` = (arms, template state,
    packed bytes)) or ``state`` (``data`` = ``Instance.to_dict()``)."""

    key: str
    experiment: str
    kind: str
    data: Any

    def __reduce__(self) -> tuple[type, tuple[str, str, str, Any]]:
        # a frozen slots dataclass unpickles through dataclasses' __setstate__, which looks
        # up its fields for every entry: a restart of 10^6 entries pays it 10^6 times
        return Entry, (self.key, self.experiment, self.kind, self.data)


def entry_of(instance: Instance) -> Entry:
    """The entry of an instance, which is put to rest first (``Instance.rest``)."""
    if instance._packed is None:
        _ = instance.bandit  # created if it never was
        instance.rest()
    packed = instance._packed
    if packed is not None and instance._entries is None:
        data = (*instance.experiment.packing, packed)
        return Entry(instance.key, instance.experiment.name, "packed", data)
    return Entry(instance.key, instance.experiment.name, "state", instance.to_dict())


def revive(entry: Entry, experiment: Experiment) -> Instance:
    """The instance an entry saved, following ``experiment`` if its definition changed."""
    if entry.kind == "state":
        return Instance.from_dict(experiment, entry.data)
    arms, template, packed = entry.data
    if (arms, template) == experiment.packing:  # the common case: nothing to unpack
        instance = Instance(experiment, entry.key)
        instance._packed = packed
        return instance
    bandit = Bandit.unpack(packed, Bandit.from_dict(template), entry.key)
    instance = Instance(experiment, entry.key, bandit)
    instance.follow(experiment, old_arms=arms)
    instance.rest()
    return instance


def state_of(entry: Entry) -> dict[str, Any]:
    """The entry as ``Instance.to_dict()`` (what ``tsi inspect`` reads)."""
    if entry.kind == "state":
        return entry.data
    arms, template, packed = entry.data
    bandit = Bandit.unpack(packed, Bandit.from_dict(template), entry.key)
    return {
        "experiment": entry.experiment,
        "key": entry.key,
        "arms": list(arms),
        "bandit": bandit.to_dict(),
        "open": [],
        "settled": [],
        "expired": [],
        "early": [],
    }
