"""An experiment's serving settings in the registry: how a window's feedback becomes one
loss (``default_loss``, ``aggregate``), how traffic is allocated (``min_share``,
``holdout``, ``burn_in``, ``force_arm``) and named contexts (``contexts``). Each is read
and checked here, once; a bad value is a ``ValueError`` naming the setting and the value
(the registry adds the experiment's name). None of them is part of what the bandit
learned: a live edit applies them at once, without migrating it (arms, competition,
gamma, variant and ``contexts``, which makes a competition, are what an edit migrates).

Named contexts: ``contexts = {device = ["ios", "android"], plan = ["free", "pro"]}`` is the
contextual class over the product of the attributes' slots, each attribute having its
listed values and one ``other`` slot for any value not listed. A request's
``{"device": "ios", "plan": "pro"}`` is the combination's mixed-radix index, the first
attribute written being the most significant digit.

>>> named = NamedContexts.read({"device": ["ios", "android"], "plan": ["free", "pro"]})
>>> named.n_contexts
9
>>> named.index({"device": "android", "plan": "pro"})
(4, ())
>>> named.index({"device": "web", "plan": "free"})
(6, ('device',))
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tsi_core.validate import context_problem

#: how the feedback of one window is combined into the loss applied (``first``: the first
#: feedback is applied at once, later ones are ``duplicate_feedback``)
AGGREGATES = ("first", "sum", "mean", "last", "max")


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float)


def default_loss(value: Any) -> float | None:
    """The loss of a window closed without feedback (None: the ticket expires unapplied).

    >>> default_loss(1), default_loss(None)
    (1.0, None)
    """
    if value is None:
        return None
    if not _number(value) or not math.isfinite(value) or abs(value) > 1e300:
        raise ValueError(f"default_loss must be a finite number, got {value!r}")
    return float(value)


def aggregate(value: Any) -> str:
    """One of ``AGGREGATES``."""
    if value not in AGGREGATES:
        raise ValueError(f"aggregate must be one of {', '.join(AGGREGATES)}, got {value!r}")
    return value


def min_share(value: Any, n_arms: int) -> float:
    """The floor f on every arm's probability: f >= 0 and n_arms * f < 1."""
    if not _number(value) or not 0 <= value < math.inf or n_arms * value >= 1:
        raise ValueError(
            f"min_share must be a number >= 0 with {n_arms} arms x min_share < 1, got {value!r}"
        )
    return float(value)


def holdout(value: Any, arms: tuple[str, ...]) -> tuple[str, float] | None:
    """``{arm = NAME, share = s}``: the arm held out and its share in (0, 1)."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"arm", "share"}:
        raise ValueError(f"holdout must be a table {{arm = NAME, share = S}}, got {value!r}")
    arm, share = value["arm"], value["share"]
    if arm not in arms:
        raise ValueError(f"holdout arm {arm!r} is not one of the arms {list(arms)}")
    if not _number(share) or not 0 < share < 1:
        raise ValueError(f"holdout share must be a number in (0, 1), got {share!r}")
    return arm, float(share)


def burn_in(value: Any) -> int:
    """Requests of an instance served uniformly first: an integer >= 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"burn_in must be an integer >= 0, got {value!r}")
    return value


def arm_indices(
    arm_index: Mapping[str, int], n_arms: int, named: Any
) -> tuple[list[int], list[Any]]:
    """The arms ``named`` (a request's eligible arms: names, or indices 0 to n_arms - 1)
    as indices, and the entries that name no arm (each caller words its refusal).

    >>> arm_indices({"a": 0, "b": 1}, 2, ["b", 0, "z", 5])
    ([1, 0], ['z', 5])
    """
    found: list[int] = []
    unknown: list[Any] = []
    for arm in named:
        if isinstance(arm, str):
            index = arm_index.get(arm)
        else:
            index = arm if type(arm) is int and 0 <= arm < n_arms else None
        if index is None:
            unknown.append(arm)
        else:
            found.append(index)
    return found, unknown


def force_arm(value: Any, arms: tuple[str, ...]) -> str | None:
    """The arm everyone gets (None: the bandit decides)."""
    if value is not None and value not in arms:
        raise ValueError(f"force_arm {value!r} is not one of the arms {list(arms)}")
    return value


@dataclass(frozen=True)
class NamedContexts:
    """Attributes and their listed values, in the order written (see the module)."""

    attributes: tuple[tuple[str, tuple[str, ...]], ...]

    @classmethod
    def read(cls, value: Any) -> NamedContexts | None:
        """The registry's ``contexts`` table (None: none)."""
        if value is None:
            return None
        if not isinstance(value, dict) or not value:
            raise ValueError(f"contexts must be a table of attribute = [values...], got {value!r}")
        attributes = []
        for name, values in value.items():
            if (
                not isinstance(values, list)
                or not values
                or not all(isinstance(v, str) and v for v in values)
                or len(set(values)) != len(values)
            ):
                raise ValueError(
                    f"contexts attribute {name!r} must list distinct non-empty strings, "
                    f"got {values!r}"
                )
            attributes.append((name, tuple(values)))
        return cls(tuple(attributes))

    def renumbers(self, old: NamedContexts | None) -> bool:
        """Whether replacing ``old`` by these contexts moves combinations to other indices
        (what was learned is kept by index, so it would stay under other names). Values
        appended to the first attribute keep every index (the first new value takes over
        what ``other`` learned); any other change renumbers.

        >>> old = NamedContexts.read({"device": ["ios", "web"], "plan": ["free"]})
        >>> NamedContexts.read({"device": ["ios", "web", "tv"], "plan": ["free"]}).renumbers(old)
        False
        >>> NamedContexts.read({"device": ["ios", "web"], "plan": ["free", "pro"]}).renumbers(old)
        True
        """
        if old is None or old == self:
            return False
        if [name for name, _ in old.attributes] != [name for name, _ in self.attributes]:
            return True
        (_, first_old), *rest_old = old.attributes
        (_, first_new), *rest_new = self.attributes
        return rest_old != rest_new or first_new[: len(first_old)] != first_old

    @property
    def n_contexts(self) -> int:
        """Combinations of slots: the product of (values + 1, the ``other`` slot)."""
        return math.prod(len(values) + 1 for _, values in self.attributes)

    def labels(self) -> list[str]:
        """Each combination's readable name, by index (``other``: the other slot).

        >>> NamedContexts.read({"d": ["ios"], "p": ["pro"]}).labels()
        ['d=ios,p=pro', 'd=ios,p=other', 'd=other,p=pro', 'd=other,p=other']
        """
        labels = [""]
        for name, values in self.attributes:
            slots = [f"{name}={value}" for value in (*values, "other")]
            labels = [f"{head},{slot}" if head else slot for head in labels for slot in slots]
        return labels

    def index(self, context: Mapping[str, Any]) -> tuple[int, tuple[str, ...]]:
        """(the combination's index, the attributes whose value went to ``other``);
        ``KeyError`` naming a missing attribute, ``ValueError`` an unknown one."""
        extra = sorted(set(context) - {name for name, _ in self.attributes})
        if extra:
            raise ValueError(f"unknown context attribute{'s' * (len(extra) > 1)} {extra}")
        index, others = 0, []
        for name, values in self.attributes:
            if name not in context:
                raise KeyError(name)
            value = context[name]
            slot = values.index(value) if value in values else len(values)
            if slot == len(values):
                others.append(name)
            index = index * (len(values) + 1) + slot
        return index, tuple(others)


def request_context_problem(
    contexts: NamedContexts | None, n_contexts: int, context: Any
) -> str | None:
    """Why a request's ``context`` (an index: named ones are resolved before) is not valid
    for an experiment, or None: ``context_problem``'s reason, naming the attributes of an
    experiment with named contexts, which takes them as well as the integers.

    >>> named = NamedContexts.read({"device": ["ios"], "plan": ["pro"]})
    >>> request_context_problem(named, 4, None)
    'context is required: an object of its attributes (device, plan), or an integer in [0, 3]'
    >>> request_context_problem(None, 4, 7)
    'context must be in [0, 3], got 7'
    """
    problem = context_problem(n_contexts, context)
    if problem is None or contexts is None:
        return problem
    names = ", ".join(name for name, _ in contexts.attributes)
    wanted = f"an object of its attributes ({names}), or an integer in [0, {n_contexts - 1}]"
    return (
        f"context is required: {wanted}"
        if context is None
        else f"context must be {wanted}, got {context!r}"
    )
