"""The experiments registry (TOML): what each experiment's bandit instances look like.

```toml
[experiments.checkout]
arms = ["control", "green", "blue"]
competition = { kind = "switching", rate = 0.001 }   # fixed | switching | contextual | markov
per_unit = true          # one bandit per unit (user), or one shared by the experiment
holdout = { arm = "control", share = 0.1 }   # optional: a share of requests held out
```

Every key, its meaning, an example and the schema of its value are declared once in
``registry_keys.KEYS`` (``example_table`` writes a table of them all).

Guardrails (``flows.guardrails.spec``) are a serving setting too. The serving settings
(``serving``: the six before contexts, and feedback_ttl, retry_window,
early_feedback_limit, seed) change how the bandit is served, not what it learned: a
live edit applies them at once. Arms, competition (``contexts`` makes one), gamma and
variant define its state: an edit migrates it.

Arms are matched by name when the registry changes under learned state (see
``Experiment.arm_map`` and docs/guides/operating.md, "Changing an experiment"). Anything
else, at the top level or in an experiment's table, is refused, naming it (a misspelt
``[experiment.NAME]`` would otherwise drop that experiment).

>>> r = Registry.from_toml('[experiments.home]\\narms = ["a", "b"]')
>>> r["home"].instance_key(None), r["home"].feedback_ttl
('home', 3600.0)
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import math
import pickle
import re
import threading
import tomllib
import weakref
from collections.abc import Collection
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from flows.guardrails.spec import Guardrail, read_guardrails
from flows.service.instances import serving
from flows.service.instances.registry_keys import KEYS
from flows.service.instances.serving import NamedContexts
from flows.service.wire._parse import lane_reads
from flows.service.wire.keys import UNIT_SEPARATOR, instance_key
from tsi_core import Allocation, Bandit, Ticket
from tsi_core.bandit import configure
from tsi_core.competition import competition_from_spec
from tsi_core.variant import DEFAULT_VARIANT

DEFAULT_TTL = 3600.0


class RegistryError(ValueError):
    """The registry file or one of its experiments is invalid."""


def unit_required(experiment: str) -> str:
    """Why a request or feedback without a unit is refused by a per-unit experiment.

    >>> unit_required("shop")
    "experiment 'shop' keeps one bandit per unit: 'unit' is required"
    """
    return f"experiment {experiment!r} keeps one bandit per unit: 'unit' is required"


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
    new_arm_share: float | None = None
    renamed_arms: tuple[tuple[str, str], ...] = ()  # (old name, new name)
    retry_after: float | None = None  # the ``retry_window`` setting; None: feedback_ttl
    variant: str = DEFAULT_VARIANT  # a preset of ``tsi_core.variant``
    default_loss: float | None = None  # the loss of a window closed without feedback
    aggregate: str = "first"  # how a window's feedback is combined (``serving.AGGREGATES``)
    min_share: float = 0.0
    holdout: tuple[str, float] | None = None  # (arm, share)
    burn_in: int = 0
    force_arm: str | None = None
    contexts: NamedContexts | None = None
    guardrails: tuple[Guardrail, ...] = ()

    def __getstate__(self) -> dict[str, Any]:
        """The definition alone, without the caches (the template bandit, its packing and
        fresh state), which are rebuilt where it is unpickled: events carry their
        experiment from one Bytewax process to another, and a bandit does not pickle."""
        return {field.name: getattr(self, field.name) for field in fields(self)}

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its definition, unpickled as the receiving process's experiment of
        that definition (``experiment_of``): the shards there see the object their own
        registry holds, as for the events they read themselves. The state goes as bytes
        pickled once, read only where the definition is new: an item crossing processes
        carries its experiment, and unpickling the state each time would be paid per event
        (bench/RESULTS.md, "a cluster's crossing events")."""
        return (experiment_of, self._wire)

    @functools.cached_property
    def _wire(self) -> tuple[bytes, bytes]:
        """(digest of the definition, the pickled state)."""
        digest = hashlib.blake2b(self.definition.encode(), digest_size=16).digest()
        return digest, pickle.dumps(self.__getstate__(), protocol=pickle.HIGHEST_PROTOCOL)

    @functools.cached_property
    def definition(self) -> str:
        """The definition as text, equal for equal definitions in any process (floats
        written exactly, the competition by its ``to_dict``).

        >>> a = Registry.from_toml('[experiments.e]\\narms = ["x", "y"]')["e"]
        >>> b = Registry.from_toml('[experiments.e]\\narms = ["x", "y"]')["e"]
        >>> a is b, a.definition == b.definition
        (False, True)
        """
        state = self.__getstate__()
        competition = state["competition"]
        state["competition"] = None if competition is None else competition.to_dict()
        return repr(sorted(state.items()))

    @property
    def retry_window(self) -> float:
        """Seconds an answer is kept after its feedback (or its expiry), for retries."""
        return self.feedback_ttl if self.retry_after is None else self.retry_after

    def arm_map(self, old_arms: tuple[str, ...]) -> list[int | None]:
        """For each arm, its index among ``old_arms`` (by name, following ``renamed_arms``),
        or None for an arm that is new.

        >>> e = Experiment("e", ("b", "c", "z"), None, renamed_arms=(("x", "z"),))
        >>> e.arm_map(("a", "b", "x"))
        [1, None, 2]
        """
        before = {new: old for old, new in self.renamed_arms}
        where = {name: i for i, name in enumerate(old_arms)}
        return [where.get(before.get(arm, arm)) for arm in self.arms]

    def same_state_as(self, old_arms: tuple[str, ...], bandit: Bandit) -> bool:
        """Whether a bandit built for ``old_arms`` is already one of this experiment."""
        template = self.template
        return (
            old_arms == self.arms
            and bandit.gamma == template.gamma
            and bandit.variant == template.variant
            and bandit.competition.to_dict() == template.competition.to_dict()
        )

    def instance_key(self, unit: str | None) -> str:
        """The instance a request or feedback belongs to (raises KeyError if unit is missing)."""
        if not self.per_unit:
            return self.name
        if unit is None:
            raise KeyError(unit_required(self.name))
        return instance_key(self.name, unit)

    def new_bandit(self, key: str) -> Bandit:
        """A fresh bandit of this experiment for instance ``key``: a fresh state unpacked,
        several times cheaper than building one (its configuration checked once, here;
        bench/RESULTS.md, "instances revived in C")."""
        return Bandit.unpack(self._fresh_state, self.template, key)

    def _build(self, key: str) -> Bandit:
        return Bandit(
            len(self.arms),
            self.competition,
            self.gamma,
            instance_id=key,
            variant=self.variant,
            allocation=self.allocation,
        )

    @functools.cached_property
    def allocation(self) -> Allocation:
        """The traffic allocation of the serving settings, arms by index.

        >>> r = Registry.from_toml('[experiments.e]\\narms = ["a", "b"]\\nforce_arm = "b"')
        >>> r["e"].allocation.force_arm
        1
        """
        index, held = self.arms.index, self.holdout
        return Allocation(
            min_share=self.min_share,
            holdout_arm=None if held is None else index(held[0]),
            holdout_share=0.0 if held is None else held[1],
            burn_in=self.burn_in,
            force_arm=None if self.force_arm is None else index(self.force_arm),
        )

    @functools.cached_property
    def _fresh_state(self) -> bytes:
        return self.template.pack()  # the template is never played

    def unpack_bandit(self, blob: bytes, key: str, pending: tuple[Ticket, ...] = ()) -> Bandit:
        """The live bandit of an instance kept as ``Bandit.pack()`` bytes."""
        return Bandit.unpack(blob, self.template, key, pending)

    @functools.cached_property
    def packing(self) -> tuple[tuple[str, ...], dict[str, Any]]:
        """What ``Bandit.pack()`` bytes of this experiment mean: its arms and its bandit
        configuration (one object per definition, which pickle writes once per record)."""
        return self.arms, self.template.to_dict()

    @functools.cached_property
    def template(self) -> Bandit:
        """A bandit of this definition, never played: its configuration is what the
        experiment's packed bandits are unpacked with and what migration reads."""
        return self._build(self.name)

    @property
    def n_contexts(self) -> int:
        return getattr(self.competition, "n_contexts", 1)


#: The experiments unpickled events resolve to, by the digest of their definition: those
#: of the registry each flow of this process reads (``LiveRegistry``), and those that
#: arrived unpickled while something still holds them.
_KNOWN: weakref.WeakValueDictionary[bytes, Experiment] = weakref.WeakValueDictionary()


def experiment_of(digest: bytes, state: bytes) -> Experiment:
    """The experiment whose definition has ``digest`` in this process; one unpickled from
    ``state`` if none is known (kept for the next event that brings it). An event that
    crosses from one Bytewax process to another arrives with the very object the
    receiving shard's instances hold: without it, each such event is a registry change
    to follow, and takes the slow path.

    >>> live = LiveRegistry(Registry.from_toml('[experiments.e]\\narms = ["x", "y"]'))
    >>> import pickle
    >>> pickle.loads(pickle.dumps(live.current["e"])) is live.current["e"]
    True
    """
    known = _KNOWN.get(digest)
    if known is None:
        known = object.__new__(Experiment)
        known.__dict__.update(pickle.loads(state))
        _KNOWN[digest] = known
    return known


def _know(registry: Registry) -> None:
    """Make ``registry``'s experiments the ones unpickled events resolve to."""
    for experiment in registry.experiments.values():
        _KNOWN[experiment._wire[0]] = experiment


def _competition(spec: Any, where: str) -> Any:
    try:
        return competition_from_spec(spec)
    except ValueError as exc:
        raise RegistryError(f"{where}: {exc}") from None


#: The keys an experiment's table may hold (``registry_keys``: each declared once).
KNOWN_SETTINGS = frozenset(key.name for key in KEYS)


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _shown(key: str) -> str:
    """A TOML key as written in the file: bare, or quoted (one line whatever it holds)."""
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key)


def _guess(key: str, known: Collection[str]) -> str | None:
    """The known name ``key`` most likely misspells, if any."""
    close = difflib.get_close_matches(key.lower(), sorted(known), n=1)
    return close[0] if close else None


def _check_top_level(data: dict[str, Any]) -> None:
    """Refuse any top-level table or key but ``[experiments]``, naming each one."""
    named = []
    for key in sorted(set(data) - {"experiments"}):
        if isinstance(data[key], dict):
            guess = _guess(key, ["experiments"])
            hint = f" (did you mean [{guess}]?)" if guess else ""
            named.append(f"table [{_shown(key)}]{hint}")
        else:
            hint = " (an experiment's setting)" if key in KNOWN_SETTINGS else ""
            named.append(f"key {_shown(key)}{hint}")
    if named:
        raise RegistryError(
            f"unknown {', '.join(named)}: the registry holds [experiments.NAME] tables only"
        )


def _experiment(name: str, table: Any) -> Experiment:
    """One ``[experiments.NAME]`` table, checked (``RegistryError`` naming the problem)."""
    where = f"experiment {name!r}"
    if not isinstance(table, dict):
        raise RegistryError(f"{where} must be a table of settings ([experiments.NAME])")
    unknown = []
    for key in sorted(set(table) - KNOWN_SETTINGS):
        guess = _guess(key, KNOWN_SETTINGS)
        unknown.append(_shown(key) + (f" (did you mean {guess}?)" if guess else ""))
    if unknown:
        plural = "s" if len(unknown) > 1 else ""
        raise RegistryError(f"{where}: unknown setting{plural} {', '.join(unknown)}")
    if not name or len(name) > 256 or UNIT_SEPARATOR in name:
        raise RegistryError(f"{where}: invalid experiment name")
    arms = _arms(table.get("arms"), where)
    try:
        contexts = NamedContexts.read(table.get("contexts"))
        serving_settings = _serving(table, arms)
    except ValueError as exc:
        raise RegistryError(f"{where}: {exc}") from None
    competition = _competition(table.get("competition", _named(contexts)), where)
    if contexts is not None and competition.to_dict() != _named(contexts):
        raise RegistryError(
            f"{where}: contexts make the competition {_named(contexts)}, "
            f"competition says {competition.to_dict()}"
        )
    gamma, seed = table.get("gamma"), table.get("seed", 0)
    variant = table.get("variant", DEFAULT_VARIANT)
    try:
        configure(
            len(arms), competition, gamma, seed, variant
        )  # a preset's name: TOML has no other
    except ValueError as exc:
        raise RegistryError(f"{where}: {exc}") from None
    experiment = Experiment(
        name,
        arms,
        competition,
        None if gamma is None else float(gamma),
        _ttl(table.get("feedback_ttl", DEFAULT_TTL), where),
        _flag(table.get("per_unit", False), "per_unit", where),
        seed,
        _limit(table.get("early_feedback_limit", 1000), where),
        _share(table.get("new_arm_share"), where),
        _renamed(table.get("renamed_arms", {}), arms, where),
        _retry_window(table.get("retry_window"), where),
        variant,
        **serving_settings,
        contexts=contexts,
    )
    try:
        experiment.allocation.check(len(arms))
    except ValueError as exc:
        raise RegistryError(f"{where}: {exc}") from None
    return experiment


def _named(contexts: NamedContexts | None) -> dict[str, Any] | None:
    """The competition spec of named contexts: the contextual class over their product."""
    if contexts is None:
        return None
    return {"kind": "contextual", "n_contexts": contexts.n_contexts}


def _serving(table: dict[str, Any], arms: tuple[str, ...]) -> dict[str, Any]:
    """The serving settings of an experiment's table (``serving``: ``ValueError`` naming
    the bad one)."""
    held = serving.holdout(table.get("holdout"), arms)
    return {
        "default_loss": serving.default_loss(table.get("default_loss")),
        "aggregate": serving.aggregate(table.get("aggregate", "first")),
        "min_share": serving.min_share(table.get("min_share", 0.0), len(arms)),
        "holdout": held,
        "burn_in": serving.burn_in(table.get("burn_in", 0)),
        "force_arm": serving.force_arm(table.get("force_arm"), arms),
        "guardrails": read_guardrails(table.get("guardrails"), held),
    }


def _arms(arms: Any, where: str) -> tuple[str, ...]:
    if (
        not isinstance(arms, list)
        or not arms
        or not all(isinstance(a, str) and a for a in arms)
        or len(set(arms)) != len(arms)
    ):
        raise RegistryError(f"{where}: arms must be a non-empty list of distinct names")
    return tuple(arms)


def _ttl(ttl: Any, where: str) -> float:
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl < math.inf:
        raise RegistryError(f"{where}: feedback_ttl must be a positive number of seconds")
    return float(ttl)


def _retry_window(window: Any, where: str) -> float | None:
    if window is None:
        return None
    if (
        isinstance(window, bool)
        or not isinstance(window, int | float)
        or not 0 <= window < math.inf
    ):
        raise RegistryError(f"{where}: retry_window must be a number of seconds >= 0")
    return float(window)


def _flag(value: Any, name: str, where: str) -> bool:
    if not isinstance(value, bool):
        raise RegistryError(f"{where}: {name} must be true or false")
    return value


def _limit(limit: Any, where: str) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise RegistryError(f"{where}: early_feedback_limit must be an integer >= 0")
    return limit


def _share(share: Any, where: str) -> float | None:
    if share is None:
        return None
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share < 1:
        raise RegistryError(f"{where}: new_arm_share must be a number in (0, 1), got {share!r}")
    return float(share)


def _renamed(renamed: Any, arms: tuple[str, ...], where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(renamed, dict) or not all(
        isinstance(old, str) and isinstance(new, str) and new in arms and old not in arms
        for old, new in renamed.items()
    ):
        raise RegistryError(
            f"{where}: renamed_arms maps old arm names (no longer in arms) to names in arms, "
            f"got {renamed!r}"
        )
    return tuple(sorted(renamed.items()))


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
        """The registry of a parsed TOML document (``RegistryError`` naming the problem)."""
        if isinstance(data, dict):
            _check_top_level(data)
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


def changes(old: Registry, new: Registry) -> str:
    """What replacing ``old`` by ``new`` changes: experiments added, removed and edited
    (another definition), or "no change".

    >>> old = Registry.from_toml('[experiments.a]\\narms = ["x"]\\n[experiments.b]\\narms = ["x"]')
    >>> new = Registry.from_toml('[experiments.a]\\narms = ["y"]\\n[experiments.c]\\narms = ["x"]')
    >>> changes(old, new)
    "added 'c'; removed 'b'; edited 'a'"
    >>> changes(old, old)
    'no change'
    """
    before, after = old.experiments, new.experiments
    kept = before.keys() & after.keys()
    named = {
        "added": after.keys() - before.keys(),
        "removed": before.keys() - after.keys(),
        "edited": {n for n in kept if before[n].definition != after[n].definition},
    }
    said = [
        f"{what} {', '.join(map(repr, sorted(names)))}" for what, names in named.items() if names
    ]
    return "; ".join(said) or "no change"


def renumbered_contexts(old: Registry, new: Registry) -> str | None:
    """The problem with an edit of an experiment's named contexts that would keep what was
    learned under other combinations (``NamedContexts.renumbers``), or None.

    >>> text = '[experiments.a]\\narms = ["x", "y"]\\ncontexts = {d = [%s]}'
    >>> old = Registry.from_toml(text % '"i", "w"')
    >>> new = Registry.from_toml(text % '"w", "i"')
    >>> renumbered_contexts(old, old) is None
    True
    >>> renumbered_contexts(old, new)[:60]
    "experiment 'a': this edit of contexts renumbers its combinat"
    """
    for name in sorted(old.experiments.keys() & new.experiments.keys()):
        before, after = old.experiments[name].contexts, new.experiments[name].contexts
        if after is not None and after.renumbers(before):
            return (
                f"experiment {name!r}: this edit of contexts renumbers its combinations, so "
                "what each learned would serve other ones; only values appended to the first "
                "attribute keep them (start a new experiment for this change)"
            )
    return None


#: Guards a ``LiveRegistry``'s pending registry, which another thread may offer
#: (``LiveRegistry.offer``) while the flow applies it (module level: a registry pickles).
_PENDING = threading.Lock()

lane_reads(Registry, Experiment)  # the parser's compiled lane reads these, and no subclass


class LiveRegistry:
    """The registry a running flow reads: ``current``, replaced whole by ``reload`` or
    ``offer``.

    ``reload`` reads the file again and keeps the new registry pending; ``apply`` makes it
    current (the service calls it when an epoch closes, so every event of an epoch sees one
    registry). A file that does not load is reported and changes nothing.

    >>> live = LiveRegistry(Registry.from_toml('[experiments.a]\\narms = ["x"]'))
    >>> live.current.get("a").arms
    ('x',)
    """

    def __init__(self, registry: Registry, path: str | Path | None = None) -> None:
        self.current = registry
        self.path = path
        self._pending: Registry | None = None
        _know(registry)

    def reload(self) -> str:
        """Read the file again; the new registry waits for ``apply``. Returns what happened,
        in one line: the problem, or what changes against the current registry."""
        if self.path is None:
            return "registry reload ignored: the registry was not read from a file"
        try:
            pending = Registry.load(self.path)
        except RegistryError as exc:
            return f"registry reload refused, the running registry stays: {exc}"
        problem = renumbered_contexts(self.current, pending)
        if problem is not None:
            return f"registry reload refused, the running registry stays: {problem}"
        with _PENDING:
            self._pending = pending
        return (
            f"registry {self.path} reloaded, applied when the current epoch closes: "
            f"{changes(self.current, pending)}"
        )

    def offer(self, registry: Registry, source: str) -> str | None:
        """Make ``registry`` (read from ``source``) pending, as ``reload`` does with the
        file; the line saying what happened, or None when it changes nothing.

        >>> live = LiveRegistry(Registry.from_toml('[experiments.a]\\narms = ["x"]'))
        >>> live.offer(Registry({}), "topic t")
        "topic t: applied when the current epoch closes: removed 'a'"
        >>> live.apply(), live.offer(Registry({}), "topic t")
        (True, None)
        """
        with _PENDING:
            said = changes(self._pending or self.current, registry)
            if said == "no change":
                return None
            problem = renumbered_contexts(self.current, registry)
            if problem is not None:
                return f"{source}: refused, the running registry stays: {problem}"
            self._pending = registry
        return f"{source}: applied when the current epoch closes: {said}"

    def apply(self) -> bool:
        """Make a reloaded registry current; True if there was one."""
        with _PENDING:
            pending, self._pending = self._pending, None
        if pending is None:
            return False
        self.current = pending
        _know(pending)
        return True
