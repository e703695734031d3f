"""Competition classes: which arm sequences the bandit competes with.

A class is a small, immutable, JSON-describable spec. ``bind(n_arms)`` turns it into a
*structure* (``tsi_core.structures``): the object that knows the class's state and gives
its compiled round. Complexities (which size the default γ) use the kernel's log, so γ
has the same bits on every machine.

>>> round(Fixed().complexity(10), 12) == round(math.log(10), 12)
True
>>> round(Switching(rate=0.01, switches=2).complexity(10), 3)
17.897
>>> round(Contextual(3).complexity(4), 12) == round(3 * math.log(4), 12)
True
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tsi_core._kernel import log as _log
from tsi_core.structures import CumulativeLoss, MarkovWeights, Structure, SwitchingWeights
from tsi_core.validate import check_int, check_real

DEFAULT_HORIZON = 1_000_000


def _log1p(x: float) -> float:
    """log(1 + x), accurate for small x, from the kernel's log (Goldberg's method)."""
    u = 1.0 + x
    return x if u == 1.0 else _log(u) * x / (u - 1.0)


# --------------------------------------------------------------------------- specs


@dataclass(frozen=True)
class Fixed:
    """Compete with the best fixed arm: Ω = arms, T = identity, W = log M."""

    def complexity(self, n_arms: int) -> float:
        return _log(n_arms)

    def bind(self, n_arms: int) -> Structure:
        return CumulativeLoss(n_arms, 1)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "fixed"}


@dataclass(frozen=True)
class Contextual:
    """Compete with the best map context → arm, for ``n_contexts`` finite contexts.

    The product class factorises into one weight vector per context with shared ψ, V, D
    and η; W = C·log M.
    """

    n_contexts: int

    def __post_init__(self) -> None:
        check_int("n_contexts", self.n_contexts, 1)

    def complexity(self, n_arms: int) -> float:
        return self.n_contexts * _log(n_arms)

    def bind(self, n_arms: int) -> Structure:
        return CumulativeLoss(n_arms, self.n_contexts)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "contextual", "n_contexts": self.n_contexts}


@dataclass(frozen=True)
class Switching:
    """Compete with arm sequences that switch: T(m'|m) = 1-α if m' = m, else α/(M-1).

    ``rate=α`` (constant, 0 <= α <= 1) suits a known horizon T and switch count S
    (α ≈ S/T). ``rate=None`` uses the decaying α_k = 1/(k+1) at the k-th update, for an
    unknown number of switches. ``switches`` and ``horizon`` only size the default
    γ = sqrt(W): W = log M + S·log((M-1)/α) - (S/α - S)·log(1-α) for a constant rate
    (the horizon S/α it implies), and W = log M + log H + S·log(H·(M-1)) when decaying.
    Cost per update O(M); the M×M matrix is never built.
    """

    rate: float | None = None
    switches: float = 1.0
    horizon: int = DEFAULT_HORIZON

    def __post_init__(self) -> None:
        if self.rate is not None:
            check_real("rate", self.rate, 0.0, 1.0)
        check_real("switches", self.switches, 0.0, math.inf)
        check_int("horizon", self.horizon, 1)

    def complexity(self, n_arms: int) -> float:
        w = _log(n_arms)
        s = float(self.switches)
        if n_arms == 1 or s == 0.0:
            return w
        if self.rate is None:
            h = float(self.horizon)
            return w + _log(h) + s * _log(h * (n_arms - 1))
        a = float(self.rate)
        if a == 0.0:
            return w
        stay = 0.0 if a == 1.0 else -(s / a - s) * _log1p(-a)
        return w + s * _log((n_arms - 1) / a) + stay

    def bind(self, n_arms: int) -> Structure:
        return SwitchingWeights(n_arms, self.rate)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "switching",
            "rate": self.rate,
            "switches": self.switches,
            "horizon": self.horizon,
        }


@dataclass(frozen=True, eq=False)
class Markov:
    """Any finite class set with a Markov prior.

    ``transition[μ, λ] = T(λ | μ)``: a K×K row-stochastic matrix, dense (array-like) or
    sparse (anything with ``.tocoo()``, e.g. scipy.sparse). ``arm_of[λ]`` is the arm class
    λ recommends; ``initial`` the distribution over classes at t = 1 (default uniform).
    ``complexity_`` sizes the default γ; it defaults to log K (the fixed part of W).

    >>> m = Markov([[0.9, 0.1], [0.1, 0.9]], arm_of=[0, 1])
    >>> m.n_classes, round(m.complexity(2), 4)
    (2, 0.6931)
    """

    transition: Any
    arm_of: Any
    initial: Any = None
    complexity_: float | None = None
    _edges: tuple[np.ndarray, np.ndarray, np.ndarray] = field(init=False, repr=False)
    _arm_of: np.ndarray = field(init=False, repr=False)
    _initial: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        src, dst, val, k = _edges_of(self.transition)
        arm_of = np.asarray(self.arm_of)
        if arm_of.shape != (k,) or not np.issubdtype(arm_of.dtype, np.integer):
            raise ValueError(f"arm_of must be {k} integers (one per class), got {self.arm_of!r}")
        if (arm_of < 0).any():
            raise ValueError(f"arm_of has a negative arm: {int(arm_of.min())}")
        if self.initial is None:
            initial = np.full(k, 1.0 / k)
        else:
            initial = np.asarray(self.initial, dtype=float)
            if initial.shape != (k,) or not np.isfinite(initial).all() or (initial < 0).any():
                raise ValueError(
                    f"initial must be {k} finite non-negative numbers, got {self.initial!r}"
                )
            if abs(initial.sum() - 1.0) > 1e-9:
                raise ValueError(f"initial must sum to 1, sums to {float(initial.sum())!r}")
        if self.complexity_ is not None:
            check_real("complexity_", self.complexity_, 0.0, math.inf)
        order = np.lexsort((src, dst))
        object.__setattr__(self, "_edges", (src[order], dst[order], val[order]))
        object.__setattr__(self, "_arm_of", arm_of.astype(np.int64))
        object.__setattr__(self, "_initial", initial)

    @property
    def n_classes(self) -> int:
        return len(self._arm_of)

    def complexity(self, n_arms: int) -> float:
        if self.complexity_ is not None:
            return float(self.complexity_)
        return _log(self.n_classes)

    def bind(self, n_arms: int) -> Structure:
        if int(self._arm_of.max()) >= n_arms:
            raise ValueError(
                f"arm_of names arm {int(self._arm_of.max())}, but the bandit has {n_arms} arms"
            )
        return MarkovWeights(n_arms, self._arm_of, self._initial, self._edges)

    def to_dict(self) -> dict[str, Any]:
        src, dst, val = self._edges
        return {
            "kind": "markov",
            "n_classes": self.n_classes,
            "edges": [src.tolist(), dst.tolist(), val.tolist()],
            "arm_of": self._arm_of.tolist(),
            "initial": self._initial.tolist(),
            "complexity": self.complexity_,
        }


def _edges_of(transition: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Non-zero entries (src, dst, value) of a dense or sparse K×K row-stochastic matrix."""
    if hasattr(transition, "tocoo"):
        coo = transition.tocoo()
        shape = coo.shape
        src, dst = np.asarray(coo.row, np.int64), np.asarray(coo.col, np.int64)
        val = np.asarray(coo.data, dtype=float)
    else:
        try:
            dense = np.asarray(transition, dtype=float)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"transition must be a numeric matrix, got {transition!r}") from exc
        shape = dense.shape
        if dense.ndim == 2:
            src, dst = np.nonzero(dense)
            val = dense[src, dst]
        else:
            src = dst = val = np.empty(0)
    if len(shape) != 2 or shape[0] != shape[1] or shape[0] < 1:
        raise ValueError(f"transition must be a square K×K matrix, got shape {shape}")
    if not np.isfinite(val).all() or (val < 0).any():
        raise ValueError("transition entries must be finite and non-negative")
    k = shape[0]
    row_sums = np.bincount(src, weights=val, minlength=k)
    bad = np.flatnonzero(np.abs(row_sums - 1.0) > 1e-9)
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"transition row {i} sums to {float(row_sums[i])!r}, not 1")
    keep = val > 0
    return src[keep].astype(np.int64), dst[keep].astype(np.int64), val[keep], k


COMPETITIONS = {"fixed": Fixed, "switching": Switching, "contextual": Contextual, "markov": Markov}


def competition_from_spec(spec: Any) -> Fixed | Contextual | Switching | Markov:
    """A competition class from a name or ``{"kind": ..., options}`` (a registry's words):
    a ``ValueError`` names an unknown kind, an unexpected or missing option, or a bad value.

    >>> competition_from_spec({"kind": "switching", "rate": 0.01}).rate
    0.01
    >>> competition_from_spec({"kind": "fixed", "rate": 0.1})
    Traceback (most recent call last):
    ...
    ValueError: competition 'fixed' takes no options; unexpected ['rate']
    """
    if spec is None:
        return Fixed()
    if isinstance(spec, str):
        spec = {"kind": spec}
    if not isinstance(spec, dict):
        raise ValueError(f"competition must be a table or a name, got {spec!r}")
    kind = spec.get("kind")
    cls = COMPETITIONS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        known = ", ".join(COMPETITIONS)
        raise ValueError(f"unknown competition kind {kind!r} ({known})")
    options = {k: v for k, v in spec.items() if k != "kind"}
    init = [f for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")]
    allowed = [f.name for f in init]
    unexpected = sorted(set(options) - set(allowed))
    if unexpected:
        takes = f"takes {', '.join(allowed)}" if allowed else "takes no options"
        raise ValueError(f"competition {kind!r} {takes}; unexpected {unexpected}")
    missing = [f.name for f in init if f.default is dataclasses.MISSING and f.name not in options]
    if missing:
        raise ValueError(f"competition {kind!r} needs {', '.join(missing)}")
    try:
        return cls(**options)
    except TypeError as exc:
        raise ValueError(f"competition {kind!r}: {exc}") from None


def competition_from_dict(data: dict[str, Any]) -> Fixed | Contextual | Switching | Markov:
    """Inverse of ``to_dict`` for every competition class.

    >>> competition_from_dict(Switching(rate=0.1).to_dict())
    Switching(rate=0.1, switches=1.0, horizon=1000000)
    """
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind == "fixed":
        return Fixed()
    if kind == "contextual":
        return Contextual(data["n_contexts"])
    if kind == "switching":
        return Switching(data["rate"], data["switches"], data["horizon"])
    if kind == "markov":
        k = data["n_classes"]
        src, dst, val = data["edges"]
        dense = np.zeros((k, k))
        dense[np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)] = val
        return Markov(dense, data["arm_of"], data["initial"], data["complexity"])
    raise ValueError(f"unknown competition class: {data!r}")
