"""The experiments registry (TOML): what each experiment's bandit instances look like.

```toml
[experiments.checkout]
arms = ["control", "green", "blue"]
competition = { kind = "switching", rate = 0.001 }   # fixed | switching | contextual | markov
gamma = 1.5              # optional, default sqrt(W) of the class
feedback_ttl = 3600      # seconds a selection waits for its feedback
per_unit = true          # one bandit per unit (user), or one shared by the experiment
seed = 42                # seeds the hashed draws
early_feedback_limit = 1000   # feedback waiting for its request, per instance
```

>>> r = Registry.from_toml('[experiments.home]\\narms = ["a", "b"]')
>>> r["home"].instance_key(None), r["home"].feedback_ttl
('home', 3600.0)
"""

from __future__ import annotations

import dataclasses
import functools
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tsi_core import Bandit, Contextual, Fixed, Markov, Switching, Ticket
from tsi_core.bandit import configure

DEFAULT_TTL = 3600.0
UNIT_SEPARATOR = "\x1f"  # cannot appear in a valid experiment name


class RegistryError(ValueError):
    """The registry file or one of its experiments is invalid."""


@dataclass(frozen=True)
class Experiment:
    name: str
    arms: tuple[str, ...]
    competition: Any
    gamma: float | None = None
    feedback_ttl: float = DEFAULT_TTL
    per_unit: bool = False
    seed: int = 0
    early_feedback_limit: int = 1000

    def instance_key(self, unit: str | None) -> str:
        """The instance a request or feedback belongs to (raises KeyError if unit is missing)."""
        if not self.per_unit:
            return self.name
        if unit is None:
            raise KeyError(
                f"experiment {self.name!r} keeps one bandit per unit: 'unit' is required"
            )
        return f"{self.name}{UNIT_SEPARATOR}{unit}"

    def new_bandit(self, key: str) -> Bandit:
        return Bandit(len(self.arms), self.competition, self.gamma, instance_id=key)

    def unpack_bandit(self, blob: bytes, key: str, pending: tuple[Ticket, ...] = ()) -> Bandit:
        """The live bandit of an instance kept as ``Bandit.pack()`` bytes."""
        return Bandit.unpack(blob, self._template, key, pending)

    @functools.cached_property
    def _template(self) -> Bandit:
        return self.new_bandit(self.name)

    @property
    def n_contexts(self) -> int:
        return getattr(self.competition, "n_contexts", 1)


COMPETITIONS = {"fixed": Fixed, "switching": Switching, "contextual": Contextual, "markov": Markov}


def _competition(spec: Any, where: str) -> Any:
    """A competition class from its registry spec: a name or ``{kind = ..., options}``."""
    if spec is None:
        return Fixed()
    if isinstance(spec, str):
        spec = {"kind": spec}
    if not isinstance(spec, dict):
        raise RegistryError(f"{where}: competition must be a table or a name, got {spec!r}")
    kind = spec.get("kind")
    cls = COMPETITIONS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise RegistryError(
            f"{where}: unknown competition kind {kind!r} (fixed, switching, contextual or markov)"
        )
    options = {k: v for k, v in spec.items() if k != "kind"}
    allowed = [f.name for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")]
    unexpected = sorted(set(options) - set(allowed))
    if unexpected:
        takes = f"takes {', '.join(allowed)}" if allowed else "takes no options"
        raise RegistryError(f"{where}: competition {kind!r} {takes}; unexpected {unexpected}")
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.init and f.default is dataclasses.MISSING and f.name not in options
    ]
    if missing:
        raise RegistryError(f"{where}: competition {kind!r} needs {', '.join(missing)}")
    try:
        return cls(**options)
    except (TypeError, ValueError) as exc:
        raise RegistryError(f"{where}: {exc}") from None


def _experiment(name: str, table: Any) -> Experiment:
    where = f"experiment {name!r}"
    if not isinstance(table, dict):
        raise RegistryError(f"{where} must be a table")
    known = {
        "arms",
        "competition",
        "gamma",
        "feedback_ttl",
        "per_unit",
        "seed",
        "early_feedback_limit",
    }
    unknown = sorted(set(table) - known)
    if unknown:
        raise RegistryError(f"{where}: unknown setting(s) {unknown}")
    if not name or len(name) > 256 or UNIT_SEPARATOR in name:
        raise RegistryError(f"{where}: invalid experiment name")
    arms = table.get("arms")
    if (
        not isinstance(arms, list)
        or not arms
        or not all(isinstance(a, str) and a for a in arms)
        or len(set(arms)) != len(arms)
    ):
        raise RegistryError(f"{where}: arms must be a non-empty list of distinct names")
    ttl = table.get("feedback_ttl", DEFAULT_TTL)
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl < math.inf:
        raise RegistryError(f"{where}: feedback_ttl must be a positive number of seconds")
    per_unit = table.get("per_unit", False)
    if not isinstance(per_unit, bool):
        raise RegistryError(f"{where}: per_unit must be true or false")
    limit = table.get("early_feedback_limit", 1000)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise RegistryError(f"{where}: early_feedback_limit must be an integer >= 0")
    competition = _competition(table.get("competition"), where)
    gamma, seed = table.get("gamma"), table.get("seed", 0)
    try:
        configure(len(arms), competition, gamma, seed)
    except ValueError as exc:
        raise RegistryError(f"{where}: {exc}") from None
    return Experiment(
        name,
        tuple(arms),
        competition,
        None if gamma is None else float(gamma),
        float(ttl),
        per_unit,
        seed,
        limit,
    )


class Registry:
    """Experiments by name."""

    def __init__(self, experiments: dict[str, Experiment]) -> None:
        self.experiments = experiments

    def __getitem__(self, name: str) -> Experiment:
        return self.experiments[name]

    def get(self, name: str) -> Experiment | None:
        return self.experiments.get(name)

    @classmethod
    def from_dict(cls, data: Any) -> Registry:
        tables = data.get("experiments") if isinstance(data, dict) else None
        if not isinstance(tables, dict) or not tables:
            raise RegistryError("the registry needs at least one [experiments.NAME] table")
        return cls({name: _experiment(name, table) for name, table in tables.items()})

    @classmethod
    def from_toml(cls, text: str) -> Registry:
        try:
            return cls.from_dict(tomllib.loads(text))
        except tomllib.TOMLDecodeError as exc:
            raise RegistryError(f"not valid TOML: {exc}") from None

    @classmethod
    def load(cls, path: str | Path) -> Registry:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise RegistryError(f"cannot read registry {path}: {exc.strerror}") from None
        return cls.from_toml(text)
