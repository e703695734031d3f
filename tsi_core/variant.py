"""Variants of the algorithm: the paper's Algorithm 1, and invariant changes to it.

Every variant keeps the property the project is built on: shifting the losses or scaling
them by a positive factor changes no probability, and a power-of-two map of integer losses
changes no selection, bit for bit. ``VARIANTS`` names the presets; ``Variant`` builds any
combination. What each change does to the regret analysis: ``VARIANTS.md``.

- ``baseline``: "min" centres the losses on ψ, their running minimum (the paper); "mean"
  on the running mean of the losses before this one (φ may then be negative).
- ``adaptive_gamma``: γ_t = γ·((V + D²)/V)^¼ instead of γ: the choice that minimises the
  two-term bound before the range D is plugged in (η = γ/((V·(V + D²))^¼)).
- ``step_cap``: |η_t·φ_t| is at most this per update (a loss step of the weights).
- ``growth``: D, the range estimate, grows by at most 2^growth per update (φ is cut to
  2^growth·D, and the mean baseline takes the loss as cut): one outlier no longer sets the
  learning rate, or the baseline, for the rest of the run.
- ``gamma_scale``: the default γ is gamma_scale·sqrt(W) (a γ given explicitly is used as
  it is).
- ``learner``: "exp" (exponential weights, the paper's update) or "tsallis": for the
  classes with an identity transition (Fixed, Contextual) the round is ½-Tsallis-INF on
  importance-weighted gaps l − baseline in units of their range D (no forced exploration);
  Switching and Markov classes keep the exponential-weights round of the other options.
- ``tsallis_scale``: the Tsallis learner's rate η̃_t = tsallis_scale·sqrt(C/t) (C the
  number of contexts) is its default γ (γ given explicitly: η̃_t = γ/sqrt(t)).

>>> variant_of("paper") == Variant()
True
>>> variant_of("robust").baseline, variant_of("robust").growth
('mean', 1)
>>> variant_of("fast")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: variant must be one of ['adaptive', 'bobw', ...] or a Variant, got 'fast'
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

BASELINES = ("min", "mean")
LEARNERS = ("exp", "tsallis")


@dataclass(frozen=True)
class Variant:
    """One combination of the changes (the defaults are the paper's Algorithm 1)."""

    name: str = "paper"
    baseline: str = "min"
    adaptive_gamma: bool = False
    step_cap: float | None = None
    growth: int | None = None
    gamma_scale: float = 1.0
    learner: str = "exp"
    tsallis_scale: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a variant's name must be a non-empty string, got {self.name!r}")
        if self.baseline not in BASELINES:
            raise ValueError(f"baseline must be one of {BASELINES}, got {self.baseline!r}")
        if type(self.adaptive_gamma) is not bool:
            raise ValueError(f"adaptive_gamma must be true or false, got {self.adaptive_gamma!r}")
        cap = self.step_cap
        if cap is not None and (
            isinstance(cap, bool) or not isinstance(cap, int | float) or not 0 < cap < math.inf
        ):
            raise ValueError(f"step_cap must be a finite number > 0 or None, got {cap!r}")
        scale = self.gamma_scale
        if isinstance(scale, bool) or not isinstance(scale, int | float) or not 0 < scale < 1e300:
            raise ValueError(f"gamma_scale must be a number in (0, 1e300), got {scale!r}")
        if self.learner not in LEARNERS:
            raise ValueError(f"learner must be one of {LEARNERS}, got {self.learner!r}")
        t_scale = self.tsallis_scale
        if (
            isinstance(t_scale, bool)
            or not isinstance(t_scale, int | float)
            or not (0 < t_scale < 1e300)
        ):
            raise ValueError(f"tsallis_scale must be a number in (0, 1e300), got {t_scale!r}")
        growth = self.growth
        if growth is not None and (type(growth) is not int or not 1 <= growth <= 64):
            raise ValueError(f"growth must be an integer in [1, 64] or None, got {growth!r}")

    @property
    def is_paper(self) -> bool:
        """True when this computes exactly the paper's Algorithm 1."""
        changes = (self.baseline, self.adaptive_gamma, self.step_cap, self.growth)
        paper = changes == ("min", False, None, None) and self.gamma_scale == 1.0
        return paper and self.learner == "exp"

    def kernel_options(self) -> dict[str, Any]:
        """The compiled round's options (``tsi_core._kernel.Kernel``)."""
        cap = None if self.step_cap is None else float(self.step_cap)
        return {
            "baseline": self.baseline,
            "adaptive": self.adaptive_gamma,
            "step_cap": cap,
            "growth": self.growth,
            "learner": self.learner,
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> Variant:
        """A variant from ``to_dict`` (or a preset's name); bad data raises ``ValueError``."""
        if isinstance(data, str):
            return variant_of(data)
        if not isinstance(data, dict) or set(data) - set(cls.__dataclass_fields__):
            raise ValueError(f"not a variant: {data!r:.120}")
        return cls(**data)


#: the ``bobw`` preset's Tsallis rate constant (chosen on the arena's tuning tables,
#: ``bench/RESULTS.md``, "best of both worlds")
TSALLIS_SCALE = 2.0

VARIANTS: dict[str, Variant] = {
    "paper": Variant(),
    "mean": Variant("mean", baseline="mean"),
    "adaptive": Variant("adaptive", adaptive_gamma=True),
    "robust": Variant(
        "robust", baseline="mean", adaptive_gamma=True, step_cap=1.0, growth=1, gamma_scale=0.5
    ),
    "bobw": Variant(
        "bobw",
        baseline="mean",
        adaptive_gamma=True,
        step_cap=1.0,
        growth=1,
        gamma_scale=0.5,
        learner="tsallis",
        tsallis_scale=TSALLIS_SCALE,
    ),
}

#: The variant ``Bandit``, ``BatchBandit`` and the registry use when none is named.
DEFAULT_VARIANT = "bobw"


def variant_of(value: Any) -> Variant:
    """A preset's name, a ``Variant``, or None (the default) as a ``Variant``."""
    if value is None:
        return VARIANTS[DEFAULT_VARIANT]
    if isinstance(value, Variant):
        return value
    if isinstance(value, str) and value in VARIANTS:
        return VARIANTS[value]
    raise ValueError(f"variant must be one of {sorted(VARIANTS)} or a Variant, got {value!r}")
