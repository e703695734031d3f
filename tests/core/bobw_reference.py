"""A direct Python transcription of the ``bobw`` variant's round for Fixed and Contextual
(VARIANTS.md, "bobw"): the test oracle the compiled kernel is compared with. Plain floats
and math.sqrt, no mantissa/exponent bookkeeping, D kept as a number: it agrees with the
kernel to rounding, not bit for bit."""

from __future__ import annotations

import math

CUT = 100.0
LOW = 0.75  # a negative estimate is kept above -LOW/(η̃·sqrt(q))
GRID = 2.0**10
PRIOR = 30.0  # several contexts: the weight of the mean of every loss in a context's baseline


class BobwReference:
    """½-Tsallis-INF on importance-weighted gaps from the mean loss (several contexts:
    each context's, shrunk towards the mean of all), in units of D: the root of the mean
    over the arms of each arm's mean squared gap, each gap's square counted only as far as
    D at most doubles."""

    def __init__(self, n_arms: int, n_contexts: int = 1, scale: float = 2.0) -> None:
        self.m, self.c = n_arms, n_contexts
        self.gamma = scale  # each context's: its own clock
        self.phi = [[0.0] * n_arms for _ in range(n_contexts)]  # Σ estimates, units of D
        self.clocks = [0.0] * n_contexts  # Σ(1 - q) of each context's updates
        self.means = [0.0] * n_contexts  # each context's mean loss
        self.counts = [0] * n_contexts  # the losses in each context's mean
        self.mean, self.d, self.n = 0.0, 0.0, 0  # the mean of every loss, D, the losses
        self.arm_sq = [0.0] * n_arms  # each arm's mean squared gap, in units of D²
        self.arm_gaps = [0] * n_arms  # each arm's count of gaps

    def eta(self, ctx: int = 0) -> float:
        return self.gamma / math.sqrt(1.0 + self.clocks[ctx])

    def probabilities(self, ctx: int = 0) -> list[float]:
        """q_i = 4/(y_i − z)², y_i = η̃(Φ_i − min Φ), Σq = 1 (bisection, not Newton)."""
        eta, phi = self.eta(ctx), self.phi[ctx]
        y = [eta * (v - min(phi)) for v in phi]
        lo, hi = -2.0 * math.sqrt(self.m) - 1.0, -2.0  # Σq(lo) < 1 <= Σq(hi)
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            if sum(4.0 / (v - mid) ** 2 for v in y) > 1.0:
                hi = mid
            else:
                lo = mid
        w = [4.0 / (v - hi) ** 2 for v in y]
        return [x / sum(w) for x in w]

    def update(self, ctx: int, arm: int, q: float, loss: float) -> None:
        eta = self.eta(ctx)
        self.clocks[ctx] += 1.0 - q
        n, self.n = self.n, self.n + 1
        base = self.mean if self.c == 1 else self._context_baseline(ctx, n, loss)
        if n == 0:
            self.mean = loss
            return
        gap = loss - base
        if self.d == 0.0:
            if gap == 0.0:
                self.arm_gaps[arm] += 1
                return
            self.d = abs(gap)
            if self.c == 1:
                self.mean += gap / (n + 1)
            new_d = self._arm_scale(arm, 1.0)
            self._add(ctx, arm, math.copysign(1.0, gap) * self.d / new_d / q, eta, q)
            self.d = new_d
            return
        full = math.floor(gap / self.d * GRID + 0.5) / GRID  # on the kernel's grid
        lim = math.sqrt(1.0 + 3.0 * n)  # the mean takes the gap as far as lim·D
        new_d = self._arm_scale(arm, full)
        ratio = self.d / new_d
        if self.c == 1:
            self.mean += max(-lim, min(lim, full)) * self.d / (n + 1)
        self.d = new_d
        self.phi = [[v * ratio for v in row] for row in self.phi]
        self._add(ctx, arm, max(-CUT, min(CUT, full * ratio)) / q, eta, q)

    def _arm_scale(self, arm: int, x: float) -> float:
        """D after the arm's gap x·D: its square joins the arm's mean (only as far as the
        mean over the arms with a gap at most quadruples), D² that mean; the means are
        kept in units of D² (in loss units they underflow for losses near 1e-160)."""
        k, r = self.arm_gaps[arm], self.arm_sq
        played = sum(1 for c in self.arm_gaps if c > 0) + (k == 0)
        held = sum(s for s, c in zip(r, self.arm_gaps, strict=True) if c > 0)
        room = 4.0 * played - held  # the sum of the squares at most 4·played (4·D²)
        cap = room if k == 0 else r[arm] + room * (k + 1)
        r[arm] += (min(x * x, cap) - r[arm]) / (k + 1)
        self.arm_gaps[arm] = k + 1
        total = sum(s for s, c in zip(r, self.arm_gaps, strict=True) if c > 0) / played
        if total <= 0.0:
            return self.d
        self.arm_sq = [s / total for s in r]
        return self.d * math.sqrt(total)

    def _context_baseline(self, ctx: int, n: int, loss: float) -> float:
        """(k·m_c + P·m)/(k + P); then m, m_c and k take the loss, each gap only as far
        as lim·D (a context's first loss is its mean)."""
        k, m_c = self.counts[ctx], self.means[ctx]
        base = self.mean + (m_c - self.mean) * k / (k + PRIOR)
        lim = math.sqrt(1.0 + 3.0 * n)

        def step(m: float, count: int) -> float:
            if self.d == 0.0:
                return m + (loss - m) / (count + 1)
            return m + max(-lim, min(lim, (loss - m) / self.d)) * self.d / (count + 1)

        self.mean = loss if n == 0 else step(self.mean, n)
        self.means[ctx] = loss if k == 0 else step(m_c, k)
        self.counts[ctx] += 1
        return base

    def _add(self, ctx: int, arm: int, est: float, eta: float, q: float) -> None:
        self.phi[ctx][arm] += max(-LOW / (eta * math.sqrt(q)), est)
