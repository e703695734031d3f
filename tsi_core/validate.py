"""Input checks shared by the public API: each names the bad value in a ``ValueError``.

>>> check_loss(2.5)
2.5
>>> check_loss(float("nan"))
Traceback (most recent call last):
ValueError: loss must be a finite real number, got nan
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

_REAL = (int, float, np.integer, np.floating)


def check_int(name: str, value: Any, minimum: int, maximum: float = math.inf) -> int:
    """An integer (not a bool) in [minimum, maximum]."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if not minimum <= value <= maximum:
        bounds = f">= {minimum}" if maximum == math.inf else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{name} must be {bounds}, got {value!r}")
    return int(value)


def check_real(name: str, value: Any, low: float, high: float) -> float:
    """A real number (not a bool, not NaN) in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, _REAL):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    v = float(value)
    if not low <= v <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value!r}")
    return v


def check_loss(value: Any) -> float:
    """A finite real loss of any sign and scale."""
    if isinstance(value, bool) or not isinstance(value, _REAL) or not math.isfinite(value):
        raise ValueError(f"loss must be a finite real number, got {value!r}")
    return float(value)


def check_unit(value: Any) -> float:
    """An external uniform draw u in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, _REAL) or not 0.0 <= value < 1.0:
        raise ValueError(f"u must be a real number in [0, 1), got {value!r}")
    return float(value)
