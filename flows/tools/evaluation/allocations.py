"""The traffic allocation of each experiment of a registry file (issue 41's keys
``min_share``, ``holdout = {arm, share}``, ``burn_in``, ``force_arm``), as
``tsi_core.Allocation`` with arms by index: what an evaluated configuration serves with.

The service's registry does not read these keys yet; until it does, this module takes them
out of each experiment's table, reads them as the registry will (by arm name, checked
against the arms) and gives the rest to ``Registry``. When the registry reads them
(``Experiment.allocation``), this module goes.

>>> registry, allocations = registry_from_toml(
...     '[experiments.e]\\narms = ["a", "b"]\\nholdout = { arm = "b", share = 0.1 }'
... )
>>> allocations["e"].holdout_arm, allocations["e"].holdout_share, list(registry.experiments)
(1, 0.1, ['e'])
>>> try:
...     registry_from_toml('[experiments.e]\\narms = ["a"]\\nforce_arm = "c"')
... except RegistryError as exc:
...     print(exc)
experiment 'e': force_arm 'c' is not one of the arms ['a']
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from flows.service.instances.registry import Registry, RegistryError
from tsi_core import Allocation

#: the registry keys of an experiment's allocation
ALLOCATION_KEYS = ("min_share", "holdout", "burn_in", "force_arm")


def load_registry(path: str | Path) -> tuple[Registry, dict[str, Allocation]]:
    """The registry in ``path`` and each experiment's allocation (``RegistryError``
    naming the problem)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise RegistryError(f"cannot read registry {path}: {exc.strerror}") from None
    return registry_from_toml(text)


def registry_from_toml(text: str) -> tuple[Registry, dict[str, Allocation]]:
    """The registry of a TOML document and each experiment's allocation."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RegistryError(f"not valid TOML: {exc}") from None
    tables = data.get("experiments")
    settings: dict[str, dict[str, Any]] = {}
    if isinstance(tables, dict):
        for name, table in tables.items():
            if isinstance(table, dict):
                settings[name] = {k: table.pop(k) for k in ALLOCATION_KEYS if k in table}
    registry = Registry.from_dict(data)
    allocations = {
        name: _allocation(name, registry[name].arms, settings.get(name, {}))
        for name in registry.experiments
    }
    return registry, allocations


def _allocation(name: str, arms: tuple[str, ...], table: dict[str, Any]) -> Allocation:
    """The allocation of experiment ``name``'s settings (arm names to indices), checked."""
    try:
        holdout = table.get("holdout")
        if holdout is not None and (
            not isinstance(holdout, dict) or set(holdout) != {"arm", "share"}
        ):
            raise ValueError(f"holdout must be a table {{arm = NAME, share = S}}, got {holdout!r}")
        allocation = Allocation(
            min_share=table.get("min_share", 0.0),
            holdout_arm=None if holdout is None else _index("holdout arm", holdout["arm"], arms),
            holdout_share=0.0 if holdout is None else holdout["share"],
            burn_in=table.get("burn_in", 0),
            force_arm=_index("force_arm", table.get("force_arm"), arms),
        )
        return allocation.check(len(arms))
    except ValueError as exc:
        raise RegistryError(f"experiment {name!r}: {exc}") from None


def _index(setting: str, arm: Any, arms: tuple[str, ...]) -> int | None:
    if arm is None:
        return None
    if arm not in arms:
        raise ValueError(f"{setting} {arm!r} is not one of the arms {list(arms)}")
    return arms.index(arm)
