"""An experiment as a versioned resource, and the operations on it (no I/O here).

A resource is a name, a spec (the keys of one ``[experiments.NAME]`` table, checked by
the registry's rules), a ``status`` (active, paused, stopped, archived), a ``version``
(+1 per change) and ``arm``: the arm a paused or stopped experiment serves to everyone,
through the registry's ``force_arm`` serving setting. Each operation returns the new
resource and an ``Audit`` record of what changed (None when nothing did).

>>> made, audit = apply(None, "home", {"arms": ["a", "b"]}, "ann")
>>> made.version, made.status, audit.action, audit.diff["spec.arms"]
(1, 'active', 'create', [None, ['a', 'b']])
>>> paused, audit = pause(made, "bob")
>>> paused.version, paused.served()["force_arm"], audit.diff["status"]
(2, 'a', ['active', 'paused'])
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import orjson

from flows.service.instances.registry import Registry, RegistryError

STATUSES = ("active", "paused", "stopped", "archived")
#: An experiment's name: a Kafka key and a URL path segment, so plain characters only.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
#: The longest spec, as JSON bytes.
MAX_SPEC_BYTES = 64 * 1024
#: The longest ``who``.
MAX_WHO = 256


class ExperimentError(ValueError):
    """An operation refused: the bad value or transition named; nothing changed."""


class NotFoundError(ExperimentError):
    """No experiment of that name."""


class ConflictError(ExperimentError):
    """``expected_version`` is not the current version (an HTTP 409)."""


@dataclass(frozen=True)
class Resource:
    """One experiment as stored: the key is ``name``, the value ``to_json()``."""

    name: str
    spec: dict[str, Any]
    status: str = "active"
    version: int = 1
    arm: str | None = None  # served to everyone while paused or stopped

    def fields(self) -> dict[str, Any]:
        """The resource as flat keys (``spec.KEY``, ``status``, ``arm`` when set), as
        diffs name them.

        >>> Resource("e", {"arms": ["a"]}).fields()
        {'spec.arms': ['a'], 'status': 'active'}
        """
        flat = {f"spec.{key}": value for key, value in self.spec.items()}
        arm = {} if self.arm is None else {"arm": self.arm}
        return {**flat, "status": self.status, **arm}

    def served(self) -> dict[str, Any] | None:
        """The registry table this experiment serves: None once archived; its ``arm``
        forced while paused or stopped.

        >>> Resource("e", {"arms": ["a", "b"]}, "stopped", 3, "b").served()
        {'arms': ['a', 'b'], 'force_arm': 'b'}
        """
        if self.status == "archived":
            return None
        return self.spec if self.arm is None else {**self.spec, "force_arm": self.arm}

    def to_json(self) -> dict[str, Any]:
        """The stored JSON object."""
        return {
            "name": self.name,
            "spec": self.spec,
            "status": self.status,
            "version": self.version,
            "arm": self.arm,
        }

    @classmethod
    def from_json(cls, data: Any) -> Resource:
        """A stored resource, checked (``ExperimentError`` naming what is wrong).

        >>> Resource.from_json({"name": "e", "spec": {"arms": ["a"]}, "version": 0})
        Traceback (most recent call last):
        ...
        flows.experiments.model.ExperimentError: version must be an integer >= 1, got 0
        """
        if not isinstance(data, dict):
            raise ExperimentError(f"a resource must be a JSON object, got {_short(data)}")
        unknown = sorted(set(data) - {"name", "spec", "status", "version", "arm"})
        if unknown:
            raise ExperimentError(f"unknown resource field {_short(unknown[0])}")
        version = data.get("version")
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ExperimentError(f"version must be an integer >= 1, got {_short(version)}")
        status = data.get("status", "active")
        if status not in STATUSES:
            raise ExperimentError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
        name = check_name(data.get("name"))
        resource = cls(name, check_spec(name, data.get("spec")), status, version, data.get("arm"))
        if (resource.arm is None) != (status in ("active", "archived")):
            raise ExperimentError(
                f"a {status} experiment {'has' if resource.arm else 'needs'} an arm"
            )
        _check_served(resource)
        return resource


@dataclass(frozen=True)
class Audit:
    """What one operation changed: ``diff`` maps each flat key (``Resource.fields``) that
    changed to ``[old, new]`` (None: absent)."""

    experiment: str
    version: int
    who: str
    when: str  # UTC, ISO 8601
    action: str
    diff: dict[str, list[Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "experiment": self.experiment,
            "version": self.version,
            "who": self.who,
            "when": self.when,
            "action": self.action,
            "diff": self.diff,
        }


def check_name(name: Any) -> str:
    """``name`` if it can name an experiment (``NAME``), else ``ExperimentError``.

    >>> check_name("a/b")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    flows.experiments.model.ExperimentError: bad experiment name 'a/b': letters, digits, ...
    """
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ExperimentError(
            f"bad experiment name {_short(name)}: letters, digits, '_', '.' and '-' "
            "(up to 128, starting with a letter or digit)"
        )
    return name


def check_spec(name: str, spec: Any) -> dict[str, Any]:
    """``spec`` (one registry table as JSON) if the registry accepts it; else
    ``ExperimentError`` naming the bad key or value.

    >>> check_spec("e", {"arms": ["a"], "gama": 1})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    flows.experiments.model.ExperimentError: experiment 'e': unknown setting gama (did you ...
    """
    if not isinstance(spec, dict):
        raise ExperimentError(f"the spec must be a JSON object of settings, got {_short(spec)}")
    for key, value in spec.items():
        _check_plain(value, f"spec key {_short(key)}")
    try:
        size = len(orjson.dumps(spec))
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise ExperimentError(f"the spec is not plain JSON: {exc}") from None
    if size > MAX_SPEC_BYTES:
        raise ExperimentError(
            f"the spec is {size} bytes as JSON, over the {MAX_SPEC_BYTES} allowed"
        )
    try:
        Registry.from_dict({"experiments": {name: spec}})
    except RegistryError as exc:
        raise ExperimentError(str(exc)) from None
    return orjson.loads(orjson.dumps(spec))  # a copy the caller cannot change


def _check_plain(value: Any, where: str, depth: int = 0) -> None:
    """Refuse what a TOML table cannot hold: null, NaN and infinities, non-string keys,
    deep nesting."""
    if depth > 8:
        raise ExperimentError(f"{where} is nested too deeply")
    if value is None:
        raise ExperimentError(f"{where} is null: leave the setting out instead")
    if isinstance(value, float) and not math.isfinite(value):
        raise ExperimentError(f"{where} is {value!r}: only finite numbers")
    if isinstance(value, list):
        for item in value:
            _check_plain(item, where, depth + 1)
    elif isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ExperimentError(f"{where} has a key that is not a string: {key!r}")
            _check_plain(item, where, depth + 1)
    elif not isinstance(value, str | int | float | bool):
        raise ExperimentError(f"{where} is not JSON: {type(value).__name__}")


def _check_served(resource: Resource) -> None:
    """Refuse a resource whose served table the registry refuses (a forced arm that the
    spec's arms lack)."""
    served = resource.served()
    if served is not None and resource.arm is not None:
        try:
            Registry.from_dict({"experiments": {resource.name: served}})
        except RegistryError as exc:
            raise ExperimentError(str(exc)) from None


def _short(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters (a hostile value stays one short line)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def now_utc() -> str:
    """The time now, UTC, ISO 8601 (milliseconds)."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _who(who: Any) -> str:
    if not isinstance(who, str) or not who.strip() or len(who) > MAX_WHO:
        raise ExperimentError(f"who must be a name of 1 to {MAX_WHO} characters, got {_short(who)}")
    return who


def diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, list[Any]]:
    """``{key: [old, new]}`` for each key whose value differs (None: absent).

    >>> diff({"a": 1, "b": 2}, {"b": 3, "c": 4})
    {'a': [1, None], 'b': [2, 3], 'c': [None, 4]}
    """
    keys = sorted(old.keys() | new.keys())
    return {k: [old.get(k), new.get(k)] for k in keys if old.get(k) != new.get(k)}


def replay(audits: Iterable[Audit]) -> dict[str, Any]:
    """The flat fields (``Resource.fields``) that ``audits``' diffs, in order, lead to.

    >>> made, first = apply(None, "e", {"arms": ["a"]}, "ann")
    >>> replay([first]) == made.fields()
    True
    """
    flat: dict[str, Any] = {}
    for audit in audits:
        for key, (_, new) in audit.diff.items():
            if new is None:
                flat.pop(key, None)
            else:
                flat[key] = new
    return flat


def _changed(
    old: Resource | None, new: Resource, who: str, action: str, when: str | None
) -> tuple[Resource, Audit]:
    """``new`` and its audit record against ``old``."""
    before = {} if old is None else old.fields()
    changes = diff(before, new.fields())
    audit = Audit(new.name, new.version, _who(who), when or now_utc(), action, changes)
    return new, audit


def _live(current: Resource | None, name: str, action: str) -> Resource:
    """``current``, unless there is none or it is archived (``ExperimentError``)."""
    if current is None:
        raise NotFoundError(f"no experiment {name!r}")
    if current.status == "archived":
        raise ExperimentError(f"experiment {name!r} is archived: it cannot {action}")
    return current


def apply(
    current: Resource | None,
    name: str,
    spec: Any,
    who: str,
    expected_version: int | None = None,
    when: str | None = None,
) -> tuple[Resource, Audit | None]:
    """Create ``name`` with ``spec``, or change its spec (its status kept); no audit when
    the spec is the same. ``expected_version`` (0: it must not exist yet) must be the
    current version, else ``ConflictError`` naming both.

    >>> made, _ = apply(None, "e", {"arms": ["a"]}, "ann")
    >>> apply(made, "e", {"arms": ["a"]}, "ann")[1] is None
    True
    >>> apply(made, "e", {"arms": ["b"]}, "ann", expected_version=3)[0]
    Traceback (most recent call last):
    ...
    flows.experiments.model.ConflictError: experiment 'e' is at version 1, not the expected 3
    """
    _who(who)
    name = check_name(name)
    have = 0 if current is None else current.version
    if expected_version is not None and expected_version != have:
        raise ConflictError(
            f"experiment {name!r} is at version {have}, not the expected {expected_version}"
        )
    spec = check_spec(name, spec)
    if current is None:
        return _changed(None, Resource(name, spec), who, "create", when)
    _live(current, name, "change")
    if current.spec == spec:
        return current, None
    new = replace(current, spec=spec, version=current.version + 1)
    _check_served(new)
    return _changed(current, new, who, "apply", when)


def _arm(current: Resource, arm: str | None) -> str:
    """``arm``, one of the experiment's arms (None: the first, the control)."""
    arms = current.spec["arms"]
    if arm is None:
        return arms[0]
    if arm not in arms:
        raise ExperimentError(
            f"experiment {current.name!r} has no arm {_short(arm)} (arms: {', '.join(arms)})"
        )
    return arm


def pause(
    current: Resource | None, who: str, arm: str | None = None, when: str | None = None
) -> tuple[Resource, Audit]:
    """Serve the control arm (``arm``, or the first) to everyone and learn nothing."""
    current = _live(current, "" if current is None else current.name, "pause")
    if current.status != "active":
        raise ExperimentError(f"experiment {current.name!r} is {current.status}, not active")
    new = replace(current, status="paused", arm=_arm(current, arm), version=current.version + 1)
    return _changed(current, new, who, "pause", when)


def resume(current: Resource | None, who: str, when: str | None = None) -> tuple[Resource, Audit]:
    """Serve and learn again (a paused or stopped experiment): the forced arm removed."""
    current = _live(current, "" if current is None else current.name, "resume")
    if current.status == "active":
        raise ExperimentError(f"experiment {current.name!r} is active already")
    new = replace(current, status="active", arm=None, version=current.version + 1)
    return _changed(current, new, who, "resume", when)


def stop(
    current: Resource | None, arm: str, who: str, when: str | None = None
) -> tuple[Resource, Audit]:
    """End the experiment: ``arm`` (the winner) served to everyone."""
    current = _live(current, "" if current is None else current.name, "stop")
    chosen = _arm(current, arm)
    if current.status == "stopped" and current.arm == chosen:
        raise ExperimentError(f"experiment {current.name!r} is stopped on {chosen!r} already")
    new = replace(current, status="stopped", arm=chosen, version=current.version + 1)
    return _changed(current, new, who, "stop", when)


def archive(current: Resource | None, who: str, when: str | None = None) -> tuple[Resource, Audit]:
    """Stop serving it (out of the registry); its record and history stay."""
    current = _live(current, "" if current is None else current.name, "be archived")
    new = replace(current, status="archived", arm=None, version=current.version + 1)
    return _changed(current, new, who, "archive", when)


def registry_of(resources: Iterable[Resource]) -> Registry:
    """The registry the resources serve (the archived ones left out).

    >>> made, _ = apply(None, "e", {"arms": ["a", "b"]}, "ann")
    >>> registry_of([pause(made, "ann")[0]])["e"].force_arm
    'a'
    """
    tables = {r.name: r.served() for r in resources if r.served() is not None}
    return Registry(
        {name: Registry.from_dict({"experiments": {name: t}})[name] for name, t in tables.items()}
    )
