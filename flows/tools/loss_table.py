"""A full-information loss table and its exact competitors (best fixed arm, best switching
sequence, best context map): what offline evaluation and the arena measure regret against.

``LossTable`` is a T×M table fixed before play (oblivious), an optional context per
round, and the competitor class it is built for. ``best_switching_loss`` is a dynamic
programme, not a segment heuristic.

>>> table = LossTable("t", [[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
>>> table.best_fixed_loss(), table.best_switching_loss(1)
(1.0, 0.0)
>>> table.affine(1000.0, 1e6).best_fixed_loss()
3001000.0
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from tsi_core.validate import check_int, check_int_vector

_REAL = (int, float, np.integer, np.floating)


@dataclass(frozen=True, eq=False, repr=False)
class LossTable:
    """A T×M oblivious loss table, optional contexts, and the competitor it is built for.

    ``kind`` is "contextual" when there are contexts, else "switching" when
    ``n_switches > 0``, else "fixed"; ``competitor_loss`` is the best loss in that class.
    The arrays are stored as read-only copies.
    """

    name: str
    losses: np.ndarray
    contexts: np.ndarray | None = None
    n_contexts: int = 1
    n_switches: int = 0

    def __post_init__(self) -> None:
        try:
            losses = np.array(self.losses, dtype=float)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"losses must be a T×M array of reals, got {self.losses!r}") from exc
        if losses.ndim != 2 or losses.shape[0] < 1 or losses.shape[1] < 1:
            raise ValueError(f"losses must be a non-empty T×M array, got shape {losses.shape}")
        bad = np.argwhere(~np.isfinite(losses))
        if len(bad):
            t, m = bad[0]
            raise ValueError(f"losses[{t}, {m}] = {losses[t, m]!r} is not finite")
        losses.setflags(write=False)
        object.__setattr__(self, "losses", losses)
        check_int("n_switches", self.n_switches, 0)
        check_int("n_contexts", self.n_contexts, 1)
        if self.contexts is None:
            if self.n_contexts != 1:
                raise ValueError(f"n_contexts must be 1 without contexts, got {self.n_contexts}")
            return
        if self.n_switches:
            raise ValueError(
                f"n_switches must be 0 for a contextual environment, got {self.n_switches}"
            )
        contexts = check_int_vector(
            "contexts", self.contexts, losses.shape[0], 0, self.n_contexts - 1
        )
        contexts.setflags(write=False)
        object.__setattr__(self, "contexts", contexts)

    def __repr__(self) -> str:
        t, m = self.shape
        extra = f", n_contexts={self.n_contexts}" if self.contexts is not None else ""
        extra += f", n_switches={self.n_switches}" if self.n_switches else ""
        return f"LossTable({self.name!r}, T={t}, M={m}{extra})"

    # ------------------------------------------------------------------ properties

    @property
    def shape(self) -> tuple[int, int]:
        """(T, M): rounds and arms."""
        t, m = self.losses.shape
        return int(t), int(m)

    @property
    def range(self) -> float:
        """D = max − min of the whole loss table."""
        return float(self.losses.max() - self.losses.min())

    @property
    def kind(self) -> str:
        """The competitor class: "fixed", "switching" or "contextual"."""
        if self.contexts is not None:
            return "contextual"
        return "switching" if self.n_switches else "fixed"

    @cached_property
    def _floor(self) -> float:
        return float(self.losses.min())

    @cached_property
    def _prefix(self) -> np.ndarray:
        """(T+1)×M prefix sums of the losses minus their minimum (row 0 is zeros).

        Every arm sequence collects exactly T losses, so a competitor's loss is its loss on
        the centred table plus T·min; centring keeps large shifts out of the sums.
        """
        t, m = self.shape
        out = np.zeros((t + 1, m))
        np.cumsum(self.losses - self._floor, axis=0, out=out[1:])
        return out

    def _uncentre(self, value: float) -> float:
        return float(value + self.shape[0] * self._floor)

    # ------------------------------------------------------------------ competitors

    def best_fixed_loss(self) -> float:
        """Loss of the best fixed arm: the least column sum."""
        return self._uncentre(self._prefix[-1].min())

    def best_switching_loss(self, n_switches: int) -> float:
        """Exact loss of the best arm sequence with at most ``n_switches`` switches.

        Contexts are ignored. Dynamic programme over the number of switches s, vectorised
        over rounds and arms with prefix sums C: the best sequence ending at arm m after t
        rounds with ≤ s switches costs C[t, m] + min_{τ<t} (B_{s-1}[τ] − C[τ, m]), where
        B_{s-1}[τ] is the best cost of τ rounds with ≤ s−1 switches (B[0] = 0); the inner
        minimum is a running minimum. O(T·M·S) time, O(T·M) memory.
        """
        s_max = check_int("n_switches", n_switches, 0)
        t, _ = self.shape
        c = self._prefix
        if s_max >= t - 1:  # the arm may change every round
            return self._uncentre((self.losses - self._floor).min(axis=1).sum())
        best = c.min(axis=1)  # B_0: no switch
        for _ in range(s_max):
            run = np.minimum.accumulate(best[:-1, None] - c[:-1], axis=0)
            best = np.concatenate(([0.0], (c[1:] + run).min(axis=1)))
        return self._uncentre(best[-1])

    def best_contextual_loss(self) -> float:
        """Loss of the best map context → arm (the best fixed arm when there are no contexts)."""
        if self.contexts is None:
            return self.best_fixed_loss()
        centred = self.losses - self._floor
        k = self.n_contexts
        per_context = np.stack(
            [np.bincount(self.contexts, weights=col, minlength=k) for col in centred.T], axis=1
        )
        return self._uncentre(per_context.min(axis=1).sum())

    def competitor_loss(self) -> float:
        """The best loss in the class the environment is designed for (see ``kind``)."""
        if self.kind == "contextual":
            return self.best_contextual_loss()
        if self.kind == "switching":
            return self.best_switching_loss(self.n_switches)
        return self.best_fixed_loss()

    # ------------------------------------------------------------------ transforms

    def affine(self, scale: float, shift: float) -> LossTable:
        """The same environment with losses scale·l + shift (scale > 0, both finite)."""
        if isinstance(scale, bool) or not isinstance(scale, _REAL):
            raise ValueError(f"scale must be a real number, got {scale!r}")
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"scale must be a finite number > 0, got {scale!r}")
        if isinstance(shift, bool) or not isinstance(shift, _REAL) or not math.isfinite(shift):
            raise ValueError(f"shift must be a finite real number, got {shift!r}")
        with np.errstate(over="ignore"):
            losses = float(scale) * self.losses + float(shift)
        if not np.isfinite(losses).all():
            raise ValueError(f"scale={scale!r}, shift={shift!r} overflow the losses")
        return LossTable(
            f"{self.name} ×{_short(scale)} {'+' if shift >= 0 else '-'}{_short(abs(shift))}",
            losses,
            self.contexts,
            self.n_contexts,
            self.n_switches,
        )


def _short(x: float) -> str:
    """Compact number: 1000 → "1000", 1e6 → "1e6", 2.5e-07 → "2.5e-7"."""
    text = f"{float(x):g}"
    mantissa, e, exponent = text.partition("e")
    return f"{mantissa}e{int(exponent)}" if e else text
