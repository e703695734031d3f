"""An experiment's guardrails in the registry (``guardrails = [{...}, ...]``), read and
checked: a bad one is a ``ValueError`` naming the key and the value.

```toml
holdout = { arm = "control", share = 0.1 }          # required by guardrails
guardrails = [
  { metric = "latency_ms", worse = "higher", margin = 0.0, alpha = 0.05, min_samples = 100 },
  { metric = "error" },                                # the defaults: as above
]
```

``metric`` names a value the feedback sends in its ``guardrails`` object; ``worse`` which
direction hurts; ``margin`` the degradation tolerated (in the metric's unit, >= 0);
``alpha`` the error rate of the anytime-valid test (``flows.guardrails.sequential``);
``min_samples`` the samples each group (bandit, holdout) needs before it is tested.

>>> read_guardrails([{"metric": "error"}], ("control", 0.1))
(Guardrail(metric='error', worse='higher', margin=0.0, alpha=0.05, min_samples=100),)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["METRIC_NAME", "WORSE", "Guardrail", "read_guardrails"]

#: which direction of a guardrail metric is bad
WORSE = ("higher", "lower")
#: what a guardrail metric's name may be (it becomes a Prometheus label value)
METRIC_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_KEYS = ("metric", "worse", "margin", "alpha", "min_samples")


@dataclass(frozen=True)
class Guardrail:
    """One guardrail of an experiment (see the module)."""

    metric: str
    worse: str = "higher"
    margin: float = 0.0
    alpha: float = 0.05
    min_samples: int = 100


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def _one(table: Any) -> Guardrail:
    if not isinstance(table, dict):
        raise ValueError(
            f"guardrails must be a list of tables {{metric = NAME, ...}}, got {table!r}"
        )
    unknown = sorted(set(table) - set(_KEYS))
    if unknown:
        raise ValueError(f"guardrail keys {unknown} unknown (known: {', '.join(_KEYS)})")
    metric = table.get("metric")
    if not isinstance(metric, str) or not METRIC_NAME.fullmatch(metric):
        raise ValueError(
            f"guardrail metric must be a name of letters, digits and _ (up to 64), got {metric!r}"
        )
    worse, margin = table.get("worse", "higher"), table.get("margin", 0.0)
    alpha, min_samples = table.get("alpha", 0.05), table.get("min_samples", 100)
    if worse not in WORSE:
        raise ValueError(f"guardrail {metric!r}: worse must be one of {WORSE}, got {worse!r}")
    if not _number(margin) or margin < 0:
        raise ValueError(f"guardrail {metric!r}: margin must be a number >= 0, got {margin!r}")
    if not _number(alpha) or not 0 < alpha < 1:
        raise ValueError(f"guardrail {metric!r}: alpha must be a number in (0, 1), got {alpha!r}")
    if isinstance(min_samples, bool) or not isinstance(min_samples, int) or min_samples < 2:
        raise ValueError(
            f"guardrail {metric!r}: min_samples must be an integer >= 2, got {min_samples!r}"
        )
    return Guardrail(metric, worse, float(margin), float(alpha), min_samples)


def read_guardrails(value: Any, holdout: tuple[str, float] | None) -> tuple[Guardrail, ...]:
    """The registry's ``guardrails`` (None: none); they compare the bandit with the holdout,
    so an experiment without ``holdout`` is refused.

    >>> read_guardrails([{"metric": "error"}], None)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: guardrails need a holdout (holdout = {arm = NAME, share = S}) to compare ...
    """
    if value is None:
        return ()
    if not isinstance(value, list) or not value:
        raise ValueError(f"guardrails must be a non-empty list of tables, got {value!r}")
    if holdout is None:
        raise ValueError(
            "guardrails need a holdout (holdout = {arm = NAME, share = S}) to compare the "
            "bandit with"
        )
    found = tuple(_one(table) for table in value)
    names = [g.metric for g in found]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"guardrail metrics {twice} are named more than once")
    return found
