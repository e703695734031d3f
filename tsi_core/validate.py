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


def is_real(value: Any) -> bool:
    """A real number of Python or numpy, not a bool."""
    return isinstance(value, _REAL) and not isinstance(value, bool)


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
    if not is_real(value):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    v = float(value)
    if not low <= v <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value!r}")
    return v


def check_loss(value: Any) -> float:
    """A finite real loss of any sign and scale."""
    if not is_real(value) or not math.isfinite(value):
        raise ValueError(f"loss must be a finite real number, got {value!r}")
    return float(value)


def check_draw(value: Any) -> float:
    """An external uniform draw u in [0, 1)."""
    if not is_real(value) or not 0.0 <= value < 1.0:
        raise ValueError(f"u must be a real number in [0, 1), got {value!r}")
    return float(value)


def context_problem(n_contexts: int, context: Any) -> str | None:
    """Why ``context`` is not valid for a class with ``n_contexts`` contexts, or None:
    contextual classes require an integer in [0, n_contexts - 1], others take none.

    >>> context_problem(1, None) is None, context_problem(3, 3)
    (True, 'context must be in [0, 2], got 3')
    """
    last = n_contexts - 1
    if context is None:
        return None if n_contexts == 1 else f"context is required: an integer in [0, {last}]"
    if n_contexts == 1:
        return f"context given ({context!r}) but the competition class has no contexts"
    if isinstance(context, bool) or not isinstance(context, int | np.integer):
        return f"context must be an integer, got {context!r}"
    if not 0 <= context <= last:
        return f"context must be in [0, {last}], got {context!r}"
    return None


def check_int_vector(name: str, values: Any, n: int | None, low: int, high: float) -> np.ndarray:
    """A 1-D integer array (length n unless None) with entries in [low, high]."""
    arr = np.asarray(values)
    if arr.ndim != 1 or (n is not None and len(arr) != n):
        want = "a 1-D array" if n is None else f"{n} integers"
        raise ValueError(f"{name} must be {want}, got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer) and len(arr):
        raise ValueError(f"{name} must be integers, got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    bad = np.flatnonzero((arr < low) | (arr > high))
    if len(bad):
        raise ValueError(f"{name}[{bad[0]}] = {arr[bad[0]]} is outside [{low}, {high}]")
    return arr


def check_real_vector(name: str, values: Any, n: int, low: float, high: float) -> np.ndarray:
    """n finite real numbers (not bools) in [low, high], as a float array."""
    try:
        arr = np.asarray(values, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be {n} real numbers, got {values!r}") from exc
    if arr.shape != (n,) or np.asarray(values).dtype == bool:
        raise ValueError(f"{name} must be {n} real numbers, got shape {arr.shape}")
    bad = np.flatnonzero(~((arr >= low) & (arr <= high) & np.isfinite(arr)))
    if len(bad):
        raise ValueError(
            f"{name}[{bad[0]}] = {float(arr[bad[0]])!r} is not a finite number in range"
        )
    return arr


def check_draws(u: Any, n: int) -> np.ndarray:
    """n uniform draws in [0, 1), as a float array (``ValueError`` naming a bad one)."""
    draws = check_real_vector("u", u, n, 0.0, 1.0)
    if (draws >= 1.0).any():
        raise ValueError(f"u must be in [0, 1), got {draws[draws >= 1.0][0]!r}")
    return draws
