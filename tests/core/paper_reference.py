"""A slow, direct transcription of the paper's Algorithm 1 (plain weights, no log domain).

Only for small, well-scaled cases: it is what the fast implementation must agree with.
Classes are enumerated explicitly; ``arm_of(λ, context)`` is λ(1) in that context, and
``kernel(k)`` the K×K matrix T[μ, λ] = T(λ | μ) used after the k-th update.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np


class PaperReference:
    def __init__(
        self,
        n_arms: int,
        arm_of: Callable[[int, int], int],
        kernel: Callable[[int], np.ndarray],
        initial: np.ndarray,
        gamma: float,
    ) -> None:
        self.m = n_arms
        self.arm_of = arm_of
        self.kernel = kernel
        self.w = np.array(initial, dtype=float)
        self.gamma = gamma
        self.psi = math.inf
        self.V = 0.0
        self.D = 0.0
        self.eta_prev = math.inf
        self.t = 1

    def policy(self, context: int = 0) -> tuple[np.ndarray, np.ndarray]:
        p = np.zeros(self.m)
        for lam, w in enumerate(self.w):
            p[self.arm_of(lam, context)] += w
        p /= p.sum()
        eps = min(0.5, math.sqrt(self.m / self.t))
        return (1 - eps) * p + eps / self.m, p

    def update(self, arm: int, loss: float, q_i: float, p_i: float, context: int = 0) -> None:
        self.psi = min(self.psi, loss)
        phi = (loss - self.psi) / q_i  # φ of the chosen arm; the others have φ = 0
        self.V += p_i * phi**2
        self.D = max(self.D, phi)
        eta = self.gamma / math.sqrt(self.V + self.D**2) if self.V + self.D**2 > 0 else math.inf
        hit = np.array([self.arm_of(lam, context) == arm for lam in range(len(self.w))])
        if math.isinf(eta):  # no positive φ yet: weights move only by the transition
            powered = self.w
        elif math.isinf(self.eta_prev):  # the limit of z^(η/η_prev) as η_prev → ∞
            powered = np.where(self.w > 0, np.exp(-eta * phi * hit), 0.0)
        else:  # the paper: z = w·exp(-η_{t-1} φ), then z^(η_t/η_{t-1})
            z = self.w * np.exp(-self.eta_prev * phi * hit)
            powered = z ** (eta / self.eta_prev)
        self.w = self.kernel(self.t).T @ powered
        self.w /= self.w.sum()
        self.eta_prev = eta
        self.t += 1
