"""Weight structures: the state a competition class keeps, and its compiled round.

A structure is configuration only (arms, contexts, the class's transition); instances of
one configuration share it. ``kernel(gamma)`` gives the compiled round (``tsi_core._kernel``)
that every engine calls; the rest here serves migration between configurations
(``tsi_core.migrate``): one instance's initial state, its log-weights, and a state built
from a given arm distribution.

>>> s = CumulativeLoss(n_arms=3, n_contexts=1)
>>> s.initial_state().shape, s.kernel(gamma=1.0).width   # 6 statistics + 3 states
((1, 3), 9)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from tsi_core._kernel import HEAD, Kernel, exp_array, log_array, log_sum_exp
from tsi_core._kernel import log as kernel_log
from tsi_core.variant import VARIANTS, Variant

Transform = Callable[[np.ndarray], np.ndarray]


class Structure:
    """What a bound competition class provides to the bandit engines."""

    n_arms: int
    n_contexts: int
    state_shape: tuple[int, ...]
    #: the Tsallis learner (``Variant.learner``) applies: identity transition
    tsallis_capable: bool = False

    def kernel(self, gamma: float, variant: Variant | None = None) -> Kernel:
        """The compiled round of this class with learning-rate scale ``gamma`` (and the
        paper's Algorithm 1, or ``variant``)."""
        return _kernel(self, gamma, VARIANTS["paper"] if variant is None else variant)

    def kernel_options(self) -> dict[str, Any]:
        raise NotImplementedError

    def initial_state(self) -> np.ndarray:
        """One fresh instance's state, shape ``state_shape``."""
        kernel = self.kernel(1.0)
        return np.asarray(kernel.initial_rows(1)[0, HEAD : HEAD + kernel.n_state]).reshape(
            self.state_shape
        )

    def log_weights_one(self, state: np.ndarray, c: float) -> np.ndarray:
        """log w of one instance, shape (n_contexts, M), up to a constant per context."""
        raise NotImplementedError

    def per_arm_log(self, c: float) -> tuple[Transform, Transform] | None:
        """(to_log, from_log) when the state keeps one value per arm on its last axis and
        log w = to_log(value) up to a constant per context; None when it does not (classes,
        not arms). ``c`` is η·D."""
        return None

    def state_from_log_p(self, log_p: np.ndarray, c: float) -> np.ndarray:
        """One instance's state whose arm distribution is exp(log_p), shape (n_contexts, M)."""
        raise NotImplementedError


@functools.lru_cache(maxsize=1024)
def _kernel(structure: Structure, gamma: float, variant: Variant) -> Kernel:
    """Kernels hold configuration only: instances of one configuration share one."""
    options = structure.kernel_options() | variant.kernel_options()
    return Kernel(n_arms=structure.n_arms, gamma=gamma, **options)


def log_normalise(logw: np.ndarray) -> np.ndarray:
    """Subtract the log-sum-exp over axis 0 (all -inf stays -inf)."""
    total = log_sum_exp(np.ascontiguousarray(logw.T))  # the kernel's arithmetic
    return logw - np.where(np.isfinite(total), total, 0.0)


class CumulativeLoss(Structure):
    """Identity transition (Fixed, Contextual): log w = -η_t · Φ_t in closed form.

    With T = identity the powers η_t/η_{t-1} of the paper's update telescope, so the
    log-weights are exactly -η_t times the cumulative φ of each (context, arm). The state
    keeps that cumulative φ in units of the current range D (``Φ / D``); an update is O(1)
    unless D grows, when the instance's state is rescaled. With the Tsallis learner the
    state is the cumulative importance-weighted gap per (context, arm), in units of D.
    """

    tsallis_capable = True

    def __init__(self, n_arms: int, n_contexts: int) -> None:
        self.n_arms = n_arms
        self.n_contexts = n_contexts
        self.state_shape = (n_contexts, n_arms)

    def kernel_options(self) -> dict[str, Any]:
        return {"kind": "cumulative", "n_contexts": self.n_contexts}

    def log_weights_one(self, state: np.ndarray, c: float) -> np.ndarray:
        return -c * state

    def per_arm_log(self, c: float) -> tuple[Transform, Transform] | None:
        return (lambda state: -c * state), (lambda log_w: -log_w / c)

    def state_from_log_p(self, log_p: np.ndarray, c: float) -> np.ndarray:
        """Φ/D = (max log p - log p) / c; a p of 0 becomes the smallest positive float's log."""
        floored = np.maximum(log_p, kernel_log(math.ulp(0.0)))
        return (floored.max(axis=1, keepdims=True) - floored) / c


class SwitchingWeights(Structure):
    """Fixed-share transition over arms (``rate``, or None for the decaying 1/(t+1)):
    the weights per arm, normalised to sum 1 by each update, O(M) per update."""

    def __init__(self, n_arms: int, rate: float | None) -> None:
        self.n_arms = n_arms
        self.n_contexts = 1
        self.state_shape = (n_arms,)
        self.rate = rate

    def kernel_options(self) -> dict[str, Any]:
        return {"kind": "switching", "rate": self.rate}

    def log_weights_one(self, state: np.ndarray, c: float) -> np.ndarray:
        return log_array(state)[None, :]

    def per_arm_log(self, c: float) -> tuple[Transform, Transform] | None:
        return log_array, exp_array

    def state_from_log_p(self, log_p: np.ndarray, c: float) -> np.ndarray:
        return exp_array(log_p[0])


class MarkovWeights(Structure):
    """General Markov prior over K classes: normalised log-weights per class, the transition
    as an edge list sorted by target (dense and sparse alike), O(edges) per update."""

    def __init__(
        self,
        n_arms: int,
        arm_of: np.ndarray,
        initial: np.ndarray,
        edges: tuple[np.ndarray, np.ndarray, np.ndarray],
    ) -> None:
        self.n_arms = n_arms
        self.n_contexts = 1
        self.arm_of = arm_of
        self.state_shape = (len(arm_of),)
        self.log_initial = log_array(initial)  # the kernel's log: the same bits everywhere
        self.src, self.dst, values = edges
        self.log_t = log_array(values)

    def kernel_options(self) -> dict[str, Any]:
        return {
            "kind": "markov",
            "arm_of": self.arm_of,
            "src": self.src,
            "dst": self.dst,
            "log_t": self.log_t,
            "log_initial": self.log_initial,
        }

    def log_weights_one(self, state: np.ndarray, c: float) -> np.ndarray:
        top = state.max()
        return log_array(np.bincount(self.arm_of, exp_array(state - top), self.n_arms))[None, :]

    def state_from_log_p(self, log_p: np.ndarray, c: float) -> np.ndarray:
        """Each arm's p spread over its classes in proportion to their initial prior (evenly
        where that prior is all 0); an arm with no class loses its mass."""
        prior = exp_array(self.log_initial)
        mass = np.bincount(self.arm_of, prior, self.n_arms)[self.arm_of]
        count = np.bincount(self.arm_of, minlength=self.n_arms)[self.arm_of]
        within = np.where(mass > 0, prior / np.where(mass > 0, mass, 1.0), 1.0 / count)
        logw = log_p[0][self.arm_of] + log_array(within)
        if not np.isfinite(logw).any():
            return self.log_initial.copy()
        return log_normalise(logw[:, None])[:, 0]
