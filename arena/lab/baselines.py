"""Baseline adversarial bandits that the arena runs beside tsi on the same loss tables.

Every class advances N independent instances together, with the calling convention of
``BatchBandit``: ``select()`` returns a ``TicketBatch`` with one arm per instance,
``update(tickets, losses)`` feeds one loss per ticket entry, ``probabilities()`` is the
(N, M) matrix of next-round distributions, and ``name`` labels the algorithm in tables.
Internally arrays are (M, N), arms first, as in ``tsi_core.batch``.

The baselines are context-free and draw for all instances at once (``instances`` and
``contexts`` must be None). Unlike tsi, most need what a user may not have: a horizon,
a loss range, or losses in [0, 1]. They accept any finite loss anyway and never produce
NaN: weights are kept as log-weights shifted to a maximum of 0, single estimates and
cumulative sums are clipped to ±1e300, and ranges are rescaled with halved operands.
An algorithm fed losses far outside the range it was tuned for may put all its mass on
one arm: that is the algorithm's behaviour, not a numerical failure.

>>> algs = [
...     Exp3.oracle(4, 3, horizon=200, loss_range=(0.0, 10.0), seed=1),
...     Exp3.raw(4, 3, horizon=200, seed=1),
...     TsallisInf(4, 3, seed=1),
...     AHB(4, 3, seed=1),
... ]
>>> for alg in algs:
...     for _ in range(200):
...         tickets = alg.select()
...         alg.update(tickets, losses=10.0 * (tickets.arms != 0))  # arm 0 is best
>>> [alg.name for alg in algs]
['EXP3 (oracle)', 'EXP3 (raw)', 'Tsallis-INF', 'AHB']
>>> [bool((alg.probabilities()[:, 0] > 0.5).all()) for alg in algs]
[True, True, True, True]
"""

from __future__ import annotations

import itertools
import math
import os
from typing import Any

import numpy as np

from tsi_core.bandit import TicketError
from tsi_core.batch import TicketBatch, checked_losses
from tsi_core.validate import check_draws, check_int, check_real

__all__ = [
    "AHB",
    "Baseline",
    "EpsilonGreedy",
    "Exp3",
    "Exp3IX",
    "Exp3S",
    "ThompsonNIG",
    "TsallisInf",
]

_BIG = 1e300  # bound on single estimates and cumulative sums: every later sum stays finite


def cumulative(q: np.ndarray) -> np.ndarray:
    """Cumulative sums over arms (axis 0); a loop of vector adds beats np.cumsum for few arms."""
    if len(q) > 64:
        return np.cumsum(q, axis=0)
    out = q.copy()
    for i in range(1, len(out)):
        out[i] += out[i - 1]
    return out


def select_arms(cumulative_q: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Per instance (column), the smallest i with u < q_0 + … + q_i (else the last arm)."""
    return np.minimum((cumulative_q <= u).sum(axis=0), cumulative_q.shape[0] - 1)


# ------------------------------------------------------------------------------- helpers
def _clip(x: np.ndarray) -> np.ndarray:
    """±inf (from an overflow) and huge values to ±1e300; the input has no NaN."""
    return np.clip(x, -_BIG, _BIG)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den (den > 0) without overflow warnings, clipped to ±1e300."""
    with np.errstate(over="ignore"):
        return _clip(num / den)


def _unit(x: np.ndarray, low: Any, high: Any) -> np.ndarray:
    """(x - low) / (high - low) from halved operands, which cannot overflow (high > low)."""
    return _ratio(0.5 * x - 0.5 * low, 0.5 * high - 0.5 * low)


def _softmax(logits: np.ndarray) -> np.ndarray:
    """exp(logits) normalised over arms (axis 0), after subtracting each column's max."""
    w = np.exp(logits - logits.max(axis=0))
    return w / w.sum(axis=0)


def _shift_max(log_w: np.ndarray) -> None:
    """Shift each column of log-weights in place so that its maximum is 0."""
    log_w -= log_w.max(axis=0)
    np.maximum(log_w, -_BIG, out=log_w)


def _shift_min(cum: np.ndarray) -> None:
    """Shift each column of cumulative losses in place so that its minimum is 0."""
    cum -= cum.min(axis=0)
    np.minimum(cum, _BIG, out=cum)


def _check_range(loss_range: Any) -> tuple[float, float] | None:
    """None, or (lo, hi): two finite reals with lo < hi and a finite width."""
    if loss_range is None:
        return None
    try:
        lo, hi = loss_range
    except (TypeError, ValueError) as exc:
        raise ValueError(f"loss_range must be a pair (lo, hi), got {loss_range!r}") from exc
    lo = check_real("loss_range[0]", lo, -math.inf, math.inf)
    hi = check_real("loss_range[1]", hi, -math.inf, math.inf)
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi and math.isfinite(hi - lo)):
        raise ValueError(f"loss_range must be finite with lo < hi, got {loss_range!r}")
    return lo, hi


def _check_positive(name: str, value: Any) -> float:
    v = check_real(name, value, 0.0, math.inf)
    if v == 0.0 or math.isinf(v):
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return v


def exp3_eta(n_arms: int, horizon: int) -> float:
    """sqrt(2 ln M / (M T)): the fixed-horizon EXP3 / EXP3-IX rate for losses in [0, 1]."""
    return math.sqrt(2.0 * math.log(n_arms) / (n_arms * horizon))


# ---------------------------------------------------------------------------- interface
def _horizon_and_eta(name: str, n_arms: int, horizon: Any, eta: Any) -> tuple[int | None, float]:
    """A checked horizon (or None) and η: given, or tuned from the horizon."""
    horizon = None if horizon is None else check_int("horizon", horizon, 1)
    if eta is None:
        if horizon is None:
            raise ValueError(f"{name} needs eta, or a horizon to tune eta = sqrt(2 ln M / (M T))")
        eta = exp3_eta(n_arms, horizon)
    checked = check_real("eta", eta, 0.0, math.inf)
    if math.isinf(checked):
        raise ValueError(f"eta must be finite, got {eta!r}")
    return horizon, checked


class Baseline:
    """Ticket bookkeeping, validation and the draw shared by every baseline.

    Subclasses implement ``_distribution() -> (p, memo)``, where p (M, N) is the played
    distribution and memo is whatever ``_learn`` needs from selection time, and
    ``_learn(arms, probs, losses, memo)``, which must not raise (inputs are checked first).
    """

    name: str = "baseline"

    def __init__(self, n_instances: int, n_arms: int, seed: int | None = None) -> None:
        self.n_instances = check_int("n_instances", n_instances, 1)
        self.n_arms = check_int("n_arms", n_arms, 1)
        if seed is not None:
            check_int("seed", seed, 0)
        self._rng = np.random.default_rng(seed)
        self.token = os.urandom(8).hex()
        self.n_rounds = np.zeros(self.n_instances, dtype=np.int64)
        self.n_updates = np.zeros(self.n_instances, dtype=np.int64)
        self._open: dict[int, Any] = {}
        self._serials = itertools.count(1)

    def _distribution(self) -> tuple[np.ndarray, Any]:
        raise NotImplementedError

    def _learn(self, arms: np.ndarray, probs: np.ndarray, losses: np.ndarray, memo: Any) -> None:
        raise NotImplementedError

    def probabilities(self) -> np.ndarray:
        """The distribution the next selection is drawn from, shape (N, M)."""
        return self._distribution()[0].T.copy()

    def select(self, instances: Any = None, contexts: Any = None, u: Any = None) -> TicketBatch:
        """Draw one arm for every instance; ``u`` (N draws in [0, 1)) replaces the RNG.

        Only ``instances=None`` (all instances, ``every=True``) is supported; baselines
        are context-free, so ``contexts`` must be None.
        """
        if instances is not None:
            raise ValueError(
                f"{type(self).__name__} selects for all instances at once: "
                f"instances must be None, got {instances!r}"
            )
        if contexts is not None:
            raise ValueError(
                f"{self.name} is context-free: contexts must be None, got {contexts!r}"
            )
        n = self.n_instances
        u = self._rng.random(n) if u is None else check_draws(u, n)
        q, memo = self._distribution()
        cum = cumulative(q)
        cum /= cum[-1]  # ends at exactly 1: the drawn arm always has q > 0
        arms = select_arms(cum, u)
        idx = np.arange(n)
        probs = q[arms, idx]
        self.n_rounds += 1
        serial = next(self._serials)
        self._open[serial] = memo
        contexts = np.zeros(n, dtype=np.int64)
        return TicketBatch(
            self.token, serial, idx, self.n_rounds.copy(), arms, probs, probs.copy(), contexts, True
        )

    def _check_tickets(self, tickets: Any) -> None:
        if not isinstance(tickets, TicketBatch):
            raise TicketError(f"expected a TicketBatch, got {tickets!r}")
        if tickets.owner != self.token:
            raise TicketError(f"ticket batch belongs to another bandit, not this {self.name}")
        if tickets.serial not in self._open:
            raise TicketError(f"ticket batch {tickets.serial} is already settled (or never issued)")

    def update(self, tickets: TicketBatch, losses: Any) -> None:
        """Apply one loss per ticket entry; a refused call changes no state."""
        self._check_tickets(tickets)
        values = checked_losses(losses, np.ones(len(tickets), dtype=bool)).copy()
        self._learn(tickets.arms, tickets.probs, values, self._open.pop(tickets.serial))
        self.n_updates += 1

    def discard(self, tickets: TicketBatch) -> None:
        """Forget a ticket batch without feedback."""
        self._check_tickets(tickets)
        del self._open[tickets.serial]


# ------------------------------------------------------------------------------ EXP3
class Exp3(Baseline):
    """Loss-based EXP3 with importance-weighted estimates (optionally mixed with uniform).

    Sources: Auer, Cesa-Bianchi, Freund & Schapire (2002), "The nonstochastic multiarmed
    bandit problem", SIAM J. Comput. 32(1) (EXP3); the loss-based form without mixing and
    its tuning are Bubeck & Cesa-Bianchi (2012), "Regret analysis of stochastic and
    nonstochastic multi-armed bandit problems", Theorem 3.1: with losses in [0, 1] and
    η = sqrt(2 ln M / (M T)), the pseudo-regret is at most sqrt(2 T M ln M).

    Update implemented, per instance, with x the (rescaled) loss of the played arm A:
        q_t = softmax(-η L̂_{t-1}),   p_t = (1 - γ) q_t + γ / M,   A ~ p_t,
        L̂_{t,i} = L̂_{t-1,i} + x · 1[i = A] / p_{t,A}.
    The rescaling x of a raw loss l depends on the variant (each has its own ``name``):

    * ``loss_range=(lo, hi)``: "EXP3 (oracle)", x = (l - lo) / (hi - lo), the true range
      and horizon, which a real user does not have (see ``Exp3.oracle``);
    * ``normalise=None``: "EXP3 (raw)", x = l, the [0, 1]-tuned rate on raw losses;
    * ``normalise="running"``: "EXP3 (running min/max)", x = (l - lo_t) / (hi_t - lo_t)
      with lo_t, hi_t the min and max of the instance's losses so far, this one included;
      x = 1/2 until two distinct losses have been seen. Past estimates are not rescaled
      when the range grows (the usual practitioner's heuristic, without guarantees).

    ``eta`` defaults to sqrt(2 ln M / (M T)) from ``horizon`` T; ``gamma`` (default 0) is
    the uniform exploration mix.
    """

    name = "EXP3"

    def __init__(
        self,
        n_instances: int,
        n_arms: int,
        seed: int | None = None,
        *,
        horizon: int | None = None,
        eta: float | None = None,
        gamma: float = 0.0,
        loss_range: tuple[float, float] | None = None,
        normalise: str | None = None,
    ) -> None:
        super().__init__(n_instances, n_arms, seed)
        self.horizon, self.eta = _horizon_and_eta("Exp3", self.n_arms, horizon, eta)
        self.gamma = check_real("gamma", gamma, 0.0, 1.0)
        self.loss_range = _check_range(loss_range)
        if normalise not in (None, "running"):
            raise ValueError(f"normalise must be None or 'running', got {normalise!r}")
        if normalise is not None and self.loss_range is not None:
            raise ValueError("give either loss_range (oracle) or normalise='running', not both")
        self.normalise = normalise
        if self.loss_range is not None:
            self.name = "EXP3 (oracle)"
        elif normalise == "running":
            self.name = "EXP3 (running min/max)"
        else:
            self.name = "EXP3 (raw)"
        shape = (self.n_arms, self.n_instances)
        self.log_weights = np.zeros(shape)  # -η L̂, each column shifted to a max of 0
        self.low = np.full(self.n_instances, math.inf)  # running min/max (normalise="running")
        self.high = np.full(self.n_instances, -math.inf)

    @classmethod
    def oracle(
        cls,
        n_instances: int,
        n_arms: int,
        horizon: int,
        loss_range: tuple[float, float],
        seed: int | None = None,
    ) -> Exp3:
        """EXP3 tuned with the true horizon and loss range (an oracle baseline)."""
        if loss_range is None:
            raise ValueError("Exp3.oracle needs the true loss_range (lo, hi)")
        return cls(n_instances, n_arms, seed, horizon=horizon, loss_range=loss_range)

    @classmethod
    def raw(cls, n_instances: int, n_arms: int, horizon: int, seed: int | None = None) -> Exp3:
        """EXP3 tuned for [0, 1] losses and fed raw losses (no range knowledge)."""
        return cls(n_instances, n_arms, seed, horizon=horizon)

    @classmethod
    def running(cls, n_instances: int, n_arms: int, horizon: int, seed: int | None = None) -> Exp3:
        """EXP3 on losses rescaled by each instance's running min and max."""
        return cls(n_instances, n_arms, seed, horizon=horizon, normalise="running")

    def _scaled(self, losses: np.ndarray) -> np.ndarray:
        if self.loss_range is not None:
            return _unit(losses, *self.loss_range)
        if self.normalise == "running":
            np.minimum(self.low, losses, out=self.low)
            np.maximum(self.high, losses, out=self.high)
            spread = self.high > self.low
            x = np.full_like(losses, 0.5)
            x[spread] = _unit(losses[spread], self.low[spread], self.high[spread])
            return x
        return losses

    def _distribution(self) -> tuple[np.ndarray, Any]:
        q = _softmax(self.log_weights)
        if self.gamma:
            q = (1.0 - self.gamma) * q + self.gamma / self.n_arms
        return q, None

    def _learn(self, arms: np.ndarray, probs: np.ndarray, losses: np.ndarray, memo: Any) -> None:
        idx = np.arange(self.n_instances)
        with np.errstate(over="ignore"):
            step = _clip(self.eta * _ratio(self._scaled(losses), probs))
        self.log_weights[arms, idx] -= step
        _shift_max(self.log_weights)


# --------------------------------------------------------------------------- EXP3-IX
class Exp3IX(Baseline):
    """EXP3-IX: exponential weights with implicit-exploration loss estimates.

    Source: Neu (2015), "Explore no more: improved high-probability regret bounds for
    non-stochastic bandits", NeurIPS 28, Algorithm 1 and Theorem 1 (η = 2γ = sqrt(2 ln M /
    (M T)) for losses in [0, 1]).

    Update implemented, per instance, with x the loss of the played arm A (rescaled by
    ``loss_range`` if given, "EXP3-IX (oracle)"; else raw, "EXP3-IX"):
        p_t = softmax(-η L̃_{t-1}),   A ~ p_t   (no uniform mixing),
        L̃_{t,i} = L̃_{t-1,i} + x · 1[i = A] / (p_{t,A} + γ_ix),
    with η = sqrt(2 ln M / (M T)) from ``horizon`` T and γ_ix = η / 2 unless given.
    """

    name = "EXP3-IX"

    def __init__(
        self,
        n_instances: int,
        n_arms: int,
        seed: int | None = None,
        *,
        horizon: int | None = None,
        loss_range: tuple[float, float] | None = None,
        eta: float | None = None,
        gamma_ix: float | None = None,
    ) -> None:
        super().__init__(n_instances, n_arms, seed)
        self.horizon, self.eta = _horizon_and_eta("Exp3IX", self.n_arms, horizon, eta)
        self.gamma_ix = self.eta / 2 if gamma_ix is None else check_real("gamma_ix", gamma_ix, 0, 1)
        self.loss_range = _check_range(loss_range)
        self.name = "EXP3-IX (oracle)" if self.loss_range is not None else "EXP3-IX"
        self.log_weights = np.zeros((self.n_arms, self.n_instances))

    def _distribution(self) -> tuple[np.ndarray, Any]:
        return _softmax(self.log_weights), None

    def _learn(self, arms: np.ndarray, probs: np.ndarray, losses: np.ndarray, memo: Any) -> None:
        x = losses if self.loss_range is None else _unit(losses, *self.loss_range)
        with np.errstate(over="ignore"):
            step = _clip(self.eta * _ratio(x, probs + self.gamma_ix))
        self.log_weights[arms, np.arange(self.n_instances)] -= step
        _shift_max(self.log_weights)


# ----------------------------------------------------------------------------- EXP3.S
class Exp3S(Baseline):
    """EXP3.S: EXP3 with weight sharing, for competing with switching sequences of arms.

    Source: Auer, Cesa-Bianchi, Freund & Schapire (2002), "The nonstochastic multiarmed
    bandit problem", SIAM J. Comput. 32(1), Section 8 (algorithm Exp3.S) and Corollary 8:
    α = 1/T, γ = min(1, sqrt(M (S ln(M T) + e) / ((e - 1) T))) for at most S switches.

    Update implemented, per instance, on rewards r = 1 - x in [0, 1] (x the loss, rescaled
    by ``loss_range`` if given, else raw):
        p_{t,i} = (1 - γ) w_i / Σ_j w_j + γ / M,   A ~ p_t,   r̂_i = r · 1[i = A] / p_{t,A},
        w_i ← w_i exp(γ r̂_i / M) + (e α / M) Σ_j w_j,
    computed on log-weights: log w_i ← logaddexp(log w_i + γ r̂_i / M,
    log(e α / M) + logsumexp(log w)), then shifted to a maximum of 0.
    """

    name = "EXP3.S"

    def __init__(
        self,
        n_instances: int,
        n_arms: int,
        seed: int | None = None,
        *,
        horizon: int,
        switches: int,
        loss_range: tuple[float, float] | None = None,
        alpha: float | None = None,
        gamma: float | None = None,
    ) -> None:
        super().__init__(n_instances, n_arms, seed)
        self.horizon = check_int("horizon", horizon, 1)
        self.switches = check_int("switches", switches, 0)
        m, t = self.n_arms, self.horizon
        if alpha is None:
            alpha = 1.0 / t
        if gamma is None:
            gamma = min(
                1.0, math.sqrt(m * (self.switches * math.log(m * t) + math.e) / ((math.e - 1) * t))
            )
        self.alpha = _check_positive("alpha", alpha)
        self.gamma = check_real("gamma", gamma, 0.0, 1.0)
        if self.gamma == 0.0:
            raise ValueError(f"gamma must be in (0, 1], got {gamma!r}")
        self.loss_range = _check_range(loss_range)
        self._log_share = math.log(math.e * self.alpha / m)
        self.log_weights = np.zeros((m, self.n_instances))

    def _distribution(self) -> tuple[np.ndarray, Any]:
        q = (1.0 - self.gamma) * _softmax(self.log_weights) + self.gamma / self.n_arms
        return q, None

    def _learn(self, arms: np.ndarray, probs: np.ndarray, losses: np.ndarray, memo: Any) -> None:
        x = losses if self.loss_range is None else _unit(losses, *self.loss_range)
        with np.errstate(over="ignore"):
            gain = _clip((self.gamma / self.n_arms) * _ratio(1.0 - x, probs))
        lw = self.log_weights
        top = lw.max(axis=0)
        share = self._log_share + top + np.log(np.exp(lw - top).sum(axis=0))  # log(eα/M Σw)
        lw[arms, np.arange(self.n_instances)] += gain
        np.logaddexp(lw, share, out=lw)
        _shift_max(lw)


# -------------------------------------------------------------------------- Tsallis-INF
class TsallisInf(Baseline):
    """1/2-Tsallis-INF with importance-weighted loss estimates and the anytime rate.

    Source: Zimmert & Seldin (2021), "Tsallis-INF: An optimal algorithm for stochastic
    and adversarial bandits", JMLR 22(28), Algorithm 1 with α = 1/2, Theorem 1
    (η_t = 2 / sqrt(t) for importance-weighted estimates; pseudo-regret <= 4 sqrt(M T) + 1
    for losses in [0, 1]) and their Newton iteration for the normaliser.

    Update implemented, per instance (x the loss, rescaled by ``loss_range`` if given):
        q_t = argmin_{q in simplex} <q, L̂_{t-1}> - (4/η_t) Σ_i sqrt(q_i),  η_t = 2/sqrt(t),
    i.e. q_{t,i} = 4 / (η_t (L̂_{t-1,i} - z))² with the normaliser z < min_i L̂_{t-1,i}
    found by Newton's method z ← z - (Σ_i q_i - 1) / (η_t Σ_i q_i^{3/2}) (started where
    the leader has q = 1, so it decreases monotonically to the root; the tiny residual is
    then removed by normalising q); A ~ q_t; L̂_{t,i} = L̂_{t-1,i} + x · 1[i = A] / q_{t,A}.
    L̂ is shifted to a per-instance minimum of 0 (q is unchanged by the shift). The
    reduced-variance estimator of the paper is not implemented.
    """

    name = "Tsallis-INF"
    newton_steps = 100

    def __init__(
        self,
        n_instances: int,
        n_arms: int,
        seed: int | None = None,
        *,
        loss_range: tuple[float, float] | None = None,
    ) -> None:
        super().__init__(n_instances, n_arms, seed)
        self.loss_range = _check_range(loss_range)
        self.cum_losses = np.zeros((self.n_arms, self.n_instances))  # L̂, column min 0

    @property
    def eta(self) -> np.ndarray:
        """η_t = 2 / sqrt(t) of the next round t = updates + 1, per instance."""
        return 2.0 / np.sqrt(self.n_updates + 1.0)

    def normaliser(self) -> np.ndarray:
        """s = η_t (z - min L̂) per instance: q_i = 4 / (η_t L̂_i - s)² up to rounding."""
        y = self.eta * self.cum_losses  # >= 0, min 0; s lies in [-2 sqrt(M), -2]
        s = np.full(self.n_instances, -2.0)
        for _ in range(self.newton_steps):
            with np.errstate(over="ignore"):
                w = 4.0 / np.square(y - s)
            step = (w.sum(axis=0) - 1.0) / (w * np.sqrt(w)).sum(axis=0)
            s -= step
            if np.all(np.abs(step) <= 1e-15 * np.abs(s)):
                break
        return s

    def _distribution(self) -> tuple[np.ndarray, Any]:
        s = self.normaliser()
        with np.errstate(over="ignore"):
            w = 4.0 / np.square(self.eta * self.cum_losses - s)
        return w / w.sum(axis=0), None

    def _learn(self, arms: np.ndarray, probs: np.ndarray, losses: np.ndarray, memo: Any) -> None:
        x = losses if self.loss_range is None else _unit(losses, *self.loss_range)
        self.cum_losses[arms, np.arange(self.n_instances)] += _ratio(x, probs)
        _shift_min(self.cum_losses)


# ------------------------------------------------------------------------------- AHB
class AHB(Baseline):
    """AHB with extra exploration: AdaHedge on importance-weighted estimates, range-adaptive.

    Source: Hadiji & Stoltz (2023), "Adaptation to the range in K-armed bandits", JMLR 24
    (arXiv 2006.03378): "AdaHedge for K-armed bandits" (AHB) with extra exploration. I
    could not read the paper's algorithm box; the update below follows the authors'
    public experiment code (github.com/H2DI/bandits_lab, ``AdaHedgeExp3ExtraExp``, the
    strategy labelled "AHB with extra exploration" in their experiments), restated for
    losses ℓ = -reward:

    * rounds t = 1..M play arm t (round robin); m = the smallest of these M losses
      (their M = the largest reward; their code sets it after M - 1 rounds, here after M);
    * afterwards, with t the number of past rounds (t >= M):
        q_t = softmax(-η_t L̂_{t-1}) (uniform while η_t = ∞),
        γ_t = min(1/2, sqrt(c M ln M / t)) with c = ``explore`` = 10 as in their code,
        p_t = (1 - γ_t) q_t + γ_t / M,   A ~ p_t,
        ℓ̂_{t,i} = (ℓ - m) · 1[i = A] / p_{t,A},   L̂_t = L̂_{t-1} + ℓ̂_t,
        δ_t = <q_t, ℓ̂_t> + (1/η_t) ln Σ_i q_{t,i} exp(-η_t ℓ̂_{t,i})  (mixability gap,
              on q_t as in their code; δ_t = <q_t, ℓ̂_t> - min_i ℓ̂_{t,i} when η_t = ∞),
        η_{t+1} = ln M / Σ_{s<=t} δ_s  (AdaHedge; ∞ while the sum is 0).

    Consequences (tested): decisions are unchanged when every loss is multiplied by
    a > 0 (ℓ̂, δ scale by a, η by 1/a) and, because m is learned from the data, also when
    a constant is added to every loss, up to floating-point rounding of ℓ - m. The
    version of the paper without extra exploration instead takes m as a known bound
    and is not translation-invariant; it is not implemented here. Feedback is assumed to
    arrive in order for the round-robin phase (m must be known before the first estimate).
    """

    name = "AHB"

    def __init__(
        self, n_instances: int, n_arms: int, seed: int | None = None, *, explore: float = 10.0
    ) -> None:
        super().__init__(n_instances, n_arms, seed)
        self.explore = check_real("explore", explore, 0.0, math.inf)
        if math.isinf(self.explore):
            raise ValueError(f"explore must be finite, got {explore!r}")
        n = self.n_instances
        self.cum_losses = np.zeros((self.n_arms, n))  # L̂, column min 0
        self.gap = np.zeros(n)  # Σ δ_s
        self.low = np.full(n, math.inf)  # m: the smallest round-robin loss

    @property
    def eta(self) -> np.ndarray:
        """η = ln M / Σδ per instance (inf while Σδ = 0, or if the ratio overflows)."""
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            return np.where(self.gap > 0, math.log(self.n_arms) / self.gap, math.inf)

    def _adahedge(self, eta: np.ndarray) -> np.ndarray:
        finite = np.isfinite(eta)
        with np.errstate(over="ignore", invalid="ignore"):
            logits = np.where(finite, -np.where(finite, eta, 0.0) * self.cum_losses, 0.0)
        logits = np.where(~finite & (self.cum_losses > 0), -np.inf, logits)  # η=∞: leaders
        return _softmax(logits)

    def _distribution(self) -> tuple[np.ndarray, Any]:
        m = self.n_arms
        eta = self.eta
        q = self._adahedge(eta)
        t = self.n_updates.astype(float)
        robin = self.n_updates < m
        with np.errstate(divide="ignore"):
            gamma = np.minimum(0.5, np.sqrt(self.explore * m * math.log(m) / np.maximum(t, 1)))
        p = (1.0 - gamma) * q + gamma / m
        if robin.any():
            cols = np.flatnonzero(robin)
            p[:, cols] = 0.0
            p[self.n_updates[cols], cols] = 1.0
        return p, (q, eta, robin)

    def _learn(self, arms: np.ndarray, probs: np.ndarray, losses: np.ndarray, memo: Any) -> None:
        q, eta, robin = memo
        idx = np.arange(self.n_instances)
        self.low = np.where(robin, np.minimum(self.low, losses), self.low)
        with np.errstate(over="ignore"):
            excess = _clip(losses - self.low)
        est = np.where(robin, 0.0, _ratio(excess, probs))  # ℓ̂ at arm A
        q_a = q[arms, idx]
        floor = np.minimum(est, 0.0) if self.n_arms > 1 else est  # min_i ℓ̂_i
        bound = q_a * est - floor  # the mixability gap at η = ∞, and an upper bound on δ
        finite = np.isfinite(eta)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            z = -np.where(finite, eta, 0.0) * est
            near = np.abs(z) < 1.0
            lse = np.where(
                near,
                np.log1p(q_a * np.expm1(np.where(near, z, 0.0))),
                np.logaddexp(np.log1p(-q_a), np.log(q_a) + z),
            )
            lse = np.where(q_a > 0, lse, 0.0)
            delta = np.where(finite, q_a * est + lse / np.where(finite, eta, 1.0), bound)
        delta = np.clip(np.nan_to_num(delta, nan=0.0), 0.0, np.maximum(bound, 0.0))
        self.gap = np.minimum(self.gap + np.where(robin, 0.0, delta), _BIG)
        self.cum_losses[arms, idx] += est
        _shift_min(self.cum_losses)


# --------------------------------------------------------------------------- ε-greedy
class EpsilonGreedy(Baseline):
    """ε-greedy on empirical mean losses with ε_t = min(1, c·M/t): range-free, invariant.

    Source: Auer, Cesa-Bianchi & Fischer (2002), "Finite-time analysis of the multiarmed
    bandit problem", Machine Learning 47, ε_n-GREEDY with ε_n = min(1, cK/(d²n)) and their
    Theorem 3 (c > 5, d a lower bound on the gaps of rewards in [0, 1]).

    Update implemented, per instance, with t = 1, 2, … the round about to be played:
        ε_t = min(1, c·M/t),   p_t = (1 − ε_t)·1[i = g] + ε_t / M,   A ~ p_t,
        L_A += l − r,   n_A += 1,
    with r the instance's first loss (sums of centred losses keep the rounding small
    against the range, whatever the shift) and g the greedy arm: the lowest index among
    the arms whose mean L_i / n_i is within ``tie``·(range seen) of the least mean, an
    arm never played counting as −∞ (so the first rounds go to unplayed arms in index
    order). The tolerance (1e-9 of the range) makes rounding of the sums, which differs
    after l -> a·l + b, unable to break exact ties one way or the other.

    Default c = 5: Auer et al.'s constant with d = 1, the largest gap losses of range 1
    can have, i.e. the least exploration their schedule admits. It is chosen without
    looking at the losses: ε_t never sees a loss, and the greedy arm is defined by
    means and the range, which l -> a·l + b (a > 0) moves together. So selections are
    the same under any such map; bit for bit for integer losses and a power-of-two a.
    Sums are clipped to ±1e300 (no overflow, no NaN).

    >>> alg = EpsilonGreedy(4, 3, seed=1)
    >>> for _ in range(300):
    ...     tickets = alg.select()
    ...     alg.update(tickets, losses=7.0 + 2.0 * (tickets.arms != 2))  # arm 2 is best
    >>> bool((alg.epsilon == 5 * 3 / 301).all())  # c·M/t at t = 301
    True
    >>> bool((alg.probabilities()[:, 2] > 0.95).all())
    True
    """

    name = "ε-greedy (range-free)"
    tie = 1e-9

    def __init__(
        self, n_instances: int, n_arms: int, seed: int | None = None, *, c: float = 5.0
    ) -> None:
        super().__init__(n_instances, n_arms, seed)
        self.c = _check_positive("c", c)
        shape, n = (self.n_arms, self.n_instances), self.n_instances
        self.sums = np.zeros(shape)  # Σ (l − r) per arm, clipped to ±1e300
        self.counts = np.zeros(shape, dtype=np.int64)
        self.ref = np.zeros(n)  # r: the first loss
        self.low = np.zeros(n)  # min and max of l − r so far
        self.high = np.zeros(n)

    @property
    def epsilon(self) -> np.ndarray:
        """ε_t = min(1, c·M/t) of the next round t = updates + 1, per instance."""
        return np.minimum(1.0, self.c * self.n_arms / (self.n_updates + 1.0))

    def greedy(self) -> np.ndarray:
        """Per instance, the greedy arm: unplayed arms first, then the least mean up to
        ``tie``·range, ties to the lowest index."""
        played = self.counts > 0
        means = np.full(self.sums.shape, -math.inf)
        means[played] = self.sums[played] / self.counts[played]
        with np.errstate(over="ignore", invalid="ignore"):
            slack = _clip(self.tie * (self.high - self.low))
            near = means <= means.min(axis=0) + slack
        return np.argmax(near, axis=0)  # the first True

    def _distribution(self) -> tuple[np.ndarray, Any]:
        eps = self.epsilon
        p = np.repeat((eps / self.n_arms)[None, :], self.n_arms, axis=0)
        p[self.greedy(), np.arange(self.n_instances)] += 1.0 - eps
        return p, None

    def _learn(self, arms: np.ndarray, probs: np.ndarray, losses: np.ndarray, memo: Any) -> None:
        idx = np.arange(self.n_instances)
        first = self.n_updates == 0
        self.ref[first] = losses[first]
        with np.errstate(over="ignore"):
            centred = _clip(losses - self.ref)
            self.sums[arms, idx] = _clip(self.sums[arms, idx] + centred)
        np.minimum(self.low, centred, out=self.low)
        np.maximum(self.high, centred, out=self.high)
        self.counts[arms, idx] += 1


# ------------------------------------------------------------- Thompson sampling (NIG)
class ThompsonNIG(Baseline):
    """Thompson sampling with a normal-inverse-gamma posterior per arm: affine-invariant.

    Source: the Gaussian model with unknown mean and variance of Honda & Takemura (2014),
    "Optimality of Thompson sampling for Gaussian bandits depends on priors", AISTATS
    (posterior of the mean: a Student-t around the sample mean), with the prior's variance
    taken from the data so that no scale is assumed.

    Per instance, each arm is played once first (unplayed arms in index order). Then, with
    n_i plays, sample mean x̄_i and centred sum of squares S_i of arm i, and v the variance
    of every loss the instance has seen (all arms pooled: the prior's scale, so that an arm
    whose few losses were equal still has a spread):
        μ̃_i = x̄_i + sqrt(β_i / (α_i·n_i))·t_{2α_i},   α_i = α₀ + n_i/2,
        β_i = α₀·v + S_i/2,
    and the arm with the least μ̃ is played (ties to the lowest index). Under
    l -> a·l + b (a > 0) x̄ moves with the losses and S, v scale by a², so the choices are
    the same for the same draws. Default α₀ = 1: the prior weighs as two observations of
    the pooled variance. The distribution of the choice has no closed form:
    ``probabilities`` raises ``NotImplementedError`` (the arena then scores realised
    losses) and a ticket's ``probs`` is 1 (the sampled arm), not a propensity.
    """

    name = "Thompson (NIG)"

    def __init__(
        self, n_instances: int, n_arms: int, seed: int | None = None, *, alpha0: float = 1.0
    ) -> None:
        super().__init__(n_instances, n_arms, seed)
        self.alpha0 = _check_positive("alpha0", alpha0)
        shape, n = (self.n_arms, self.n_instances), self.n_instances
        self.counts = np.zeros(shape)
        self.means = np.zeros(shape)  # of l − r, r the instance's first loss
        self.squares = np.zeros(shape)  # S_i (Welford)
        self.ref = np.zeros(n)
        self.total = np.zeros(n)  # Σ (l − r), Σ (l − r)² over every arm
        self.total_sq = np.zeros(n)

    def probabilities(self) -> np.ndarray:
        raise NotImplementedError("Thompson sampling's choice probabilities have no closed form")

    def _distribution(self) -> tuple[np.ndarray, Any]:
        m, n = self.n_arms, self.n_instances
        seen = np.maximum(self.n_updates, 1).astype(float)
        mean_all = self.total / seen
        pooled = np.maximum(self.total_sq / seen - mean_all * mean_all, 0.0)
        alpha = self.alpha0 + self.counts / 2.0
        beta = self.alpha0 * pooled + self.squares / 2.0
        played = self.counts > 0
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            spread = np.sqrt(beta / (alpha * np.maximum(self.counts, 1.0)))
            sample = self.means + spread * self._rng.standard_t(2.0 * alpha, size=(m, n))
        sample = np.where(played, sample, -math.inf)
        choice = np.argmin(sample, axis=0)
        q = np.zeros((m, n))
        q[choice, np.arange(n)] = 1.0
        return q, None

    def _learn(self, arms: np.ndarray, probs: np.ndarray, losses: np.ndarray, memo: Any) -> None:
        idx = np.arange(self.n_instances)
        first = self.n_updates == 0
        self.ref[first] = losses[first]
        with np.errstate(over="ignore", invalid="ignore"):
            x = _clip(losses - self.ref)
            self.total = _clip(self.total + x)
            self.total_sq = _clip(self.total_sq + x * x)
            n = self.counts[arms, idx] + 1.0
            d = x - self.means[arms, idx]
            self.means[arms, idx] += d / n
            self.squares[arms, idx] = _clip(
                self.squares[arms, idx] + d * (x - self.means[arms, idx])
            )
        self.counts[arms, idx] = n
