"""Weight structures: the arrays a competition class keeps, and the paper's weight update.

A batch of instances keeps its state with the instances on the LAST axis (shape
``state_shape + (n,)``), so every reduction over arms or classes is a vectorised pass
across instances. One instance (``Bandit``) keeps a ``state_shape`` array and uses the
``*_one`` methods; by default they run the batch methods on a one-instance view, and
structures override them where a scalar path is much faster.

>>> s = CumulativeLoss(n_arms=3, n_contexts=1)
>>> state = s.initial_state(2)
>>> s.arm_weights(state, slice(None), np.zeros(2, dtype=int), np.ones(2)).shape
(3, 2)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tsi_core.stats import BatchStep

SCALAR_ARMS = 32  # up to this many arms, one instance computes w with Python floats

Rows = np.ndarray | slice


class Structure:
    """What a bound competition class provides to the bandit engines."""

    n_arms: int
    n_contexts: int
    state_shape: tuple[int, ...]

    def initial_state(self, n: int) -> np.ndarray:
        raise NotImplementedError

    def arm_weights(
        self, state: np.ndarray, rows: Rows, contexts: np.ndarray, c: np.ndarray
    ) -> np.ndarray:
        """Unnormalised arm weights w, shape (M, n), of the instances ``rows`` (p = w / Σw).

        Given their contexts and η·D; the largest weight of each instance is 1.
        """
        raise NotImplementedError

    def update(
        self,
        state: np.ndarray,
        rows: Rows,
        contexts: np.ndarray,
        arms: np.ndarray,
        step: BatchStep,
        c: np.ndarray,
        n_updates: np.ndarray,
    ) -> None:
        """Apply one round's update (``step``) to the instances ``rows``, in place.

        ``rows`` is an index array, or ``slice(None)`` for all instances in order.
        """
        raise NotImplementedError

    def arm_weights_one(self, state: np.ndarray, context: int, c: float) -> Any:
        """Unnormalised arm weights w of one instance (p = w / Σw): a list or an array."""
        return self.arm_weights(state[..., None], slice(None), np.array([context]), np.array([c]))[
            :, 0
        ]

    def update_one(
        self, state: np.ndarray, context: int, arm: int, step: Any, c: float, n_updates: int
    ) -> None:
        """Apply one scalar ``Step`` to one instance's state, in place."""
        self.update(
            state[..., None],
            np.zeros(1, dtype=np.int64),
            np.array([context]),
            np.array([arm]),
            BatchStep(*(np.array([v]) for v in step)),
            np.array([c]),
            np.array([n_updates]),
        )

    def log_weights_one(self, state: np.ndarray, c: float) -> np.ndarray:
        """log w of one instance, shape (n_contexts, M), up to a constant per context."""
        rows = [self.arm_weights_one(state, row, c) for row in range(self.n_contexts)]
        with np.errstate(divide="ignore"):
            return np.log(np.array(rows, dtype=float))

    def log_weight_scale(self, c: float) -> float | None:
        """k with log w = k·state when the state keeps one value per arm on its last axis
        (up to a constant per context); None when it does not (classes, not arms)."""
        return None

    def state_from_log_p(self, log_p: np.ndarray, c: float) -> np.ndarray:
        """One instance's state whose arm distribution is exp(log_p), shape (n_contexts, M)."""
        raise NotImplementedError


def _log_normalise(logw: np.ndarray) -> np.ndarray:
    """Subtract each instance's log-sum-exp over axis 0 (all -inf stays -inf)."""
    top = logw.max(axis=0)
    top = np.where(np.isfinite(top), top, 0.0)
    return logw - (np.log(np.exp(logw - top).sum(axis=0)) + top)


def _apply_loss(logw: np.ndarray, step: BatchStep, c: np.ndarray, hit: np.ndarray) -> np.ndarray:
    """log z = r·log w - η·φ·[λ(1) = arm], with 0·(-inf) = -inf; η = ∞ leaves log w alone."""
    finite = np.isfinite(logw)
    scaled = np.where(finite, step.r * np.where(finite, logw, 0.0), -np.inf)
    return np.where(step.active, scaled - (c * step.x) * hit, logw)


class CumulativeLoss(Structure):
    """Identity transition (Fixed, Contextual): log w = -η_t · Φ_t in closed form.

    With T = identity the powers η_t/η_{t-1} of the paper's update telescope, so the
    log-weights are exactly -η_t times the cumulative φ of each (context, arm). The state
    keeps that cumulative φ in units of the current range D (``Φ / D``); an update is O(1)
    unless D grows, when the instance's state is rescaled.
    """

    def __init__(self, n_arms: int, n_contexts: int) -> None:
        self.n_arms = n_arms
        self.n_contexts = n_contexts
        self.state_shape = (n_contexts, n_arms)

    def initial_state(self, n: int) -> np.ndarray:
        return np.zeros((self.n_contexts, self.n_arms, n))

    def arm_weights(self, state, rows, contexts, c) -> np.ndarray:
        if self.n_contexts == 1:
            losses = state[0][:, rows]
        else:
            idx = np.arange(state.shape[-1])[rows]
            losses = state[contexts, :, idx].T
        w = losses.min(axis=0) - losses
        w *= c
        return np.exp(w, out=w)

    def update(self, state, rows, contexts, arms, step, c, n_updates) -> None:
        every = isinstance(rows, slice)  # all instances, in order
        grown = step.ratio != 1.0
        if grown.any():
            state[:, :, np.flatnonzero(grown) if every else rows[grown]] *= step.ratio[grown]
        state[contexts, arms, np.arange(state.shape[-1]) if every else rows] += step.x

    def arm_weights_one(self, state: np.ndarray, context: int, c: float) -> Any:
        if self.n_arms > SCALAR_ARMS:
            losses = state[context]
            return np.exp((losses.min() - losses) * c)
        losses = state[context].tolist()
        low = min(losses)
        return [math.exp((low - v) * c) for v in losses]

    def update_one(
        self, state: np.ndarray, context: int, arm: int, step: Any, c: float, n_updates: int
    ) -> None:
        if step.ratio != 1.0:
            state *= step.ratio
        state[context, arm] += step.x

    def log_weights_one(self, state: np.ndarray, c: float) -> np.ndarray:
        return -c * state

    def log_weight_scale(self, c: float) -> float | None:
        return -c

    def state_from_log_p(self, log_p: np.ndarray, c: float) -> np.ndarray:
        """Φ/D = (max log p - log p) / c; a p of 0 becomes the smallest positive float's log."""
        floored = np.maximum(log_p, math.log(math.ulp(0.0)))
        return (floored.max(axis=1, keepdims=True) - floored) / c


class SwitchingWeights(Structure):
    """Fixed-share transition over arms, O(M) per update, in the log domain."""

    def __init__(self, n_arms: int, rate: float | None) -> None:
        self.n_arms = n_arms
        self.n_contexts = 1
        self.state_shape = (n_arms,)
        self.rate = rate

    def initial_state(self, n: int) -> np.ndarray:
        return np.full((self.n_arms, n), -math.log(self.n_arms))

    def arm_weights(self, state, rows, contexts, c) -> np.ndarray:
        logw = state[:, rows]
        return np.exp(logw - logw.max(axis=0))

    def update(self, state, rows, contexts, arms, step, c, n_updates) -> None:
        hit = np.arange(self.n_arms)[:, None] == arms
        logw = _apply_loss(state[:, rows], step, c, hit)
        if self.n_arms > 1:
            logw = self._share(logw, n_updates)
        state[:, rows] = _log_normalise(logw)

    def arm_weights_one(self, state: np.ndarray, context: int, c: float) -> Any:
        if self.n_arms > SCALAR_ARMS:
            return super().arm_weights_one(state, context, c)
        logw = state.tolist()
        top = max(logw)
        return [math.exp(v - top) for v in logw]

    def update_one(
        self, state: np.ndarray, context: int, arm: int, step: Any, c: float, n_updates: int
    ) -> None:
        """The batch update's operations, in the same order, on Python floats."""
        if self.n_arms > SCALAR_ARMS:
            super().update_one(state, context, arm, step, c, n_updates)
            return
        logw = state.tolist()
        if step.active:
            r, eta_phi = step.r, c * step.x
            logw = [
                (r * v if math.isfinite(v) else -math.inf) - (eta_phi if i == arm else 0.0)
                for i, v in enumerate(logw)
            ]
        m = self.n_arms
        if m > 1:
            top = max(logw)
            e = [math.exp(v - top) for v in logw]
            total = sum(e)
            alpha = 1.0 / (n_updates + 1.0) if self.rate is None else self.rate
            b = alpha / (m - 1)
            a = 1.0 - alpha - b
            if a >= 0:
                shared = [a * x + b * total for x in e]
            else:
                shared = [max((1.0 - alpha) * x + b * (total - x), 0.0) for x in e]
            logw = [(math.log(x) if x > 0 else -math.inf) + top for x in shared]
        top = max(logw)
        top = top if math.isfinite(top) else 0.0
        lse = math.log(sum([math.exp(v - top) for v in logw])) + top
        state[:] = [v - lse for v in logw]

    def log_weights_one(self, state: np.ndarray, c: float) -> np.ndarray:
        return state[None, :].copy()

    def log_weight_scale(self, c: float) -> float | None:
        return 1.0

    def state_from_log_p(self, log_p: np.ndarray, c: float) -> np.ndarray:
        return np.array(log_p[0], dtype=float)

    def _share(self, logw: np.ndarray, n_updates: np.ndarray) -> np.ndarray:
        """w' = (1-α)·z + α/(M-1)·(Σz - z), computed without cancellation when possible."""
        m = self.n_arms
        alpha = 1.0 / (n_updates + 1.0) if self.rate is None else np.full(logw.shape[1], self.rate)
        top = logw.max(axis=0)
        e = np.exp(logw - top)
        total = e.sum(axis=0)
        b = alpha / (m - 1)
        a = 1.0 - alpha - b
        direct = a * e + b * total  # both terms >= 0 when a >= 0 (α <= (M-1)/M)
        shared = np.where(a >= 0, direct, np.maximum((1.0 - alpha) * e + b * (total - e), 0.0))
        with np.errstate(divide="ignore"):
            return np.log(shared) + top


class MarkovWeights(Structure):
    """General Markov prior over K classes; transition as a sorted edge list (dense or sparse)."""

    def __init__(
        self,
        n_arms: int,
        arm_of: np.ndarray,
        log_initial: np.ndarray,
        edges: tuple[np.ndarray, np.ndarray, np.ndarray],
    ) -> None:
        self.n_arms = n_arms
        self.n_contexts = 1
        self.arm_of = arm_of
        self.log_initial = log_initial
        self.state_shape = (len(arm_of),)
        self.src, dst, log_t = edges
        self.log_t = log_t[:, None]
        self.targets, self.starts = np.unique(dst, return_index=True)
        self.fan_in = np.diff(np.append(self.starts, len(dst)))
        self.from_classes = np.zeros((n_arms, len(arm_of)))
        self.from_classes[arm_of, np.arange(len(arm_of))] = 1.0

    def initial_state(self, n: int) -> np.ndarray:
        return np.repeat(self.log_initial[:, None], n, axis=1)

    def state_from_log_p(self, log_p: np.ndarray, c: float) -> np.ndarray:
        """Each arm's p spread over its classes in proportion to their initial prior (evenly
        where that prior is all 0); an arm with no class loses its mass."""
        prior = np.exp(self.log_initial)
        mass = np.bincount(self.arm_of, prior, self.n_arms)[self.arm_of]
        count = np.bincount(self.arm_of, minlength=self.n_arms)[self.arm_of]
        within = np.where(mass > 0, prior / np.where(mass > 0, mass, 1.0), 1.0 / count)
        with np.errstate(divide="ignore"):
            logw = log_p[0][self.arm_of] + np.log(within)
        if not np.isfinite(logw).any():
            return self.log_initial.copy()
        return _log_normalise(logw[:, None])[:, 0]

    def arm_weights(self, state, rows, contexts, c) -> np.ndarray:
        logw = state[:, rows]
        return self.from_classes @ np.exp(logw - logw.max(axis=0))

    def update(self, state, rows, contexts, arms, step, c, n_updates) -> None:
        logw = _apply_loss(state[:, rows], step, c, self.arm_of[:, None] == arms)
        state[:, rows] = _log_normalise(self._transition(logw))

    def _transition(self, logz: np.ndarray) -> np.ndarray:
        """w'_λ = Σ_μ T(λ|μ) z_μ, as a per-target log-sum-exp over the edges."""
        terms = logz[self.src] + self.log_t
        top = np.maximum.reduceat(terms, self.starts, axis=0)
        top = np.where(np.isfinite(top), top, 0.0)
        total = np.add.reduceat(
            np.exp(terms - np.repeat(top, self.fan_in, axis=0)), self.starts, axis=0
        )
        out = np.full(logz.shape, -np.inf)
        with np.errstate(divide="ignore"):
            out[self.targets] = np.log(total) + top
        return out
