"""How traffic is allocated around the learner: a floor, a holdout, a burn-in, a forced arm.

An ``Allocation`` is configuration, not learned state: setting it on a bandit changes none
of what the bandit learned. The rule it stands for lives in one place, the compiled round
(``tsi_core._kernel``, ``Kernel.serve``); here are its settings and their checks, and the
check of a request's eligible arms. With E the eligible arms (M_e of them), r the
selections made before this one and u the request's draw:

- ``force_arm`` set: that arm, with probability 1 (``why`` "forced"); nothing is learned
  from its feedback.
- otherwise the base distribution π over E: uniform while r < ``burn_in`` ("burn_in"),
  else the learner's q restricted to E and renormalised, then floored additively:
  π_a = f + (1 - M_e·f)·q̃_a with f = ``min_share`` ("bandit");
- a holdout (arm h, share s), when h is in E: u < s serves h ("holdout"), else the arm is
  drawn from π with u' = (u - s)/(1 - s). The arm's probability, logged on its ticket, is
  P(a) = s·[a = h] + (1 - s)·π_a.

``Allocation()`` is today's behaviour exactly: the same draws, bit for bit.

>>> a = Allocation(min_share=0.05, holdout_arm=0, holdout_share=0.1).check(n_arms=3)
>>> Allocation.from_dict(a.to_dict()) == a
True
>>> Allocation(min_share=0.5).check(2)
Traceback (most recent call last):
ValueError: min_share 0.5 with 2 arms: M·f must be < 1
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from tsi_core.validate import is_real

__all__ = ["Allocation", "eligible_mask"]


def _arm(name: str, value: Any, n_arms: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name} must be an arm index (an integer) or None, got {value!r}")
    if not 0 <= value < n_arms:
        raise ValueError(f"{name} {value!r} is outside the arms [0, {n_arms - 1}]")


def _share(name: str, value: Any) -> None:
    if not is_real(value) or not 0.0 <= float(value) < 1.0:
        raise ValueError(f"{name} must be a real number in [0, 1), got {value!r}")


@dataclass(frozen=True, slots=True)
class Allocation:
    """The allocation settings of a bandit (see the module for the rule).

    ``min_share`` f: every eligible arm's floor (additive; M·f < 1); ``holdout_arm`` and
    ``holdout_share``: that share of requests served the holdout arm; ``burn_in``: the
    first selections served uniformly; ``force_arm``: every request served this arm and
    nothing learned.
    """

    min_share: float = 0.0
    holdout_arm: int | None = None
    holdout_share: float = 0.0
    burn_in: int = 0
    force_arm: int | None = None

    def check(self, n_arms: int) -> Allocation:
        """Self, if valid for ``n_arms`` arms; else ``ValueError`` naming the bad value."""
        _share("min_share", self.min_share)
        if n_arms * float(self.min_share) >= 1.0:
            raise ValueError(f"min_share {self.min_share!r} with {n_arms} arms: M·f must be < 1")
        _share("holdout_share", self.holdout_share)
        _arm("holdout_arm", self.holdout_arm, n_arms)
        if (self.holdout_arm is None) != (float(self.holdout_share) == 0.0):
            raise ValueError(
                f"holdout_arm {self.holdout_arm!r} and holdout_share {self.holdout_share!r}: "
                "a holdout needs both an arm and a share > 0"
            )
        if isinstance(self.burn_in, bool) or not isinstance(self.burn_in, int | np.integer):
            raise ValueError(f"burn_in must be an integer, got {self.burn_in!r}")
        if not 0 <= self.burn_in < 2**53:
            raise ValueError(f"burn_in must be in [0, 2**53), got {self.burn_in!r}")
        _arm("force_arm", self.force_arm, n_arms)
        return self

    @property
    def plain(self) -> bool:
        """Whether this is ``Allocation()``: the learner's q, unchanged."""
        return self == _PLAIN

    def to_dict(self) -> dict[str, Any]:
        """JSON-able settings (every field, by name, as Python numbers)."""
        return {
            "min_share": float(self.min_share),
            "holdout_arm": None if self.holdout_arm is None else int(self.holdout_arm),
            "holdout_share": float(self.holdout_share),
            "burn_in": int(self.burn_in),
            "force_arm": None if self.force_arm is None else int(self.force_arm),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Allocation:
        """The settings of ``to_dict`` (absent fields: their defaults); ``ValueError`` for
        a field it does not know. Checked against the arms by ``check``."""
        if not isinstance(data, dict):
            raise ValueError(f"an allocation is a dict of settings, got {data!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown allocation setting {unknown[0]!r} (known: {sorted(known)})")
        return cls(**data)


_PLAIN = Allocation()


def eligible_mask(eligible: Any, n_arms: int) -> bytearray | None:
    """The eligible arms of one request as a mask of ``n_arms`` bytes (1: eligible), or
    None for all arms (None given, or every arm named). ``eligible`` is a non-empty
    sequence of distinct arm indices or a boolean mask of length M; anything else raises
    ``ValueError`` naming it.

    >>> list(eligible_mask([2, 0], 3)), eligible_mask([True, True], 2)
    ([1, 0, 1], None)
    """
    if eligible is None:
        return None
    if type(eligible) in (list, tuple) and eligible:  # without numpy
        mask = bytearray(n_arms)
        for arm in eligible:
            if type(arm) is not int:
                break
            if not 0 <= arm < n_arms:
                raise ValueError(f"eligible arm {arm} is outside the arms [0, {n_arms - 1}]")
            if mask[arm]:
                raise ValueError(f"eligible arms repeat: {eligible!r}")
            mask[arm] = 1
        else:
            return None if len(eligible) == n_arms else mask
    given = np.asarray(eligible) if not isinstance(eligible, str | bytes | dict | set) else None
    if given is None or given.ndim != 1:
        raise ValueError(f"eligible must be arm indices or a boolean mask, got {eligible!r}")
    if given.dtype == bool:
        if given.shape != (n_arms,):
            raise ValueError(f"an eligible mask must have {n_arms} entries, got {eligible!r}")
        mask = bytearray(given.astype(np.uint8).tobytes())
    else:
        if len(given) == 0 or not np.issubdtype(given.dtype, np.integer):
            raise ValueError(f"eligible must be a non-empty list of arm indices, got {eligible!r}")
        bad = given[(given < 0) | (given >= n_arms)]
        if len(bad):
            raise ValueError(f"eligible arm {int(bad[0])} is outside the arms [0, {n_arms - 1}]")
        if len(np.unique(given)) != len(given):
            raise ValueError(f"eligible arms repeat: {eligible!r}")
        mask = bytearray(n_arms)
        for arm in given.tolist():
            mask[arm] = 1
    if not any(mask):
        raise ValueError(f"no eligible arm: {eligible!r}")
    return None if all(mask) else mask
