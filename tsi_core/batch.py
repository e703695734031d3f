"""Many independent bandit instances advanced together with vectorised numpy.

Given the same uniform draws, ``BatchBandit`` makes the same selections as the same
number of separate ``Bandit`` objects: both use the same competition structures, and the
statistics are computed by the same operations in the same order.

>>> bb = BatchBandit(n_instances=1000, n_arms=10, seed=1)
>>> tickets = bb.select()
>>> bb.update(tickets, losses=tickets.arms * 0.1 + 5.0)
>>> bb.probabilities().shape
(1000, 10)
"""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from tsi_core.bandit import TicketError, configure
from tsi_core.stats import observe_batch
from tsi_core.validate import check_int, check_int_vector


@dataclass(frozen=True, eq=False)
class TicketBatch:
    """The selections of one ``BatchBandit.select`` call, one entry per instance."""

    owner: str
    serial: int
    instances: np.ndarray
    rounds: np.ndarray
    arms: np.ndarray
    probs: np.ndarray
    weight_shares: np.ndarray  # the paper's p of each chosen arm (see Ticket.weight_share)
    contexts: np.ndarray
    every: bool = False  # one entry per instance of the BatchBandit, in order

    def __len__(self) -> int:
        return len(self.instances)


def _real_array(name: str, values: Any, n: int, low: float, high: float) -> np.ndarray:
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


def where_mask(where: Any, n: int) -> np.ndarray:
    """The entries of an n-entry ticket batch to settle: all (None) or a boolean mask."""
    if where is None:
        return np.ones(n, dtype=bool)
    take = np.asarray(where)
    if take.shape != (n,) or take.dtype != bool:
        raise ValueError(f"where must be {n} booleans, got {where!r}")
    return take


def checked_losses(losses: Any, take: np.ndarray) -> np.ndarray:
    """One float loss per ticket entry (a view when already floats); the entries ``take``
    selects must be finite. Raises ``ValueError`` naming the bad value."""
    n = len(take)
    try:
        given = np.asarray(losses)
        values = given.astype(float, copy=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"losses must be {n} real numbers, got {losses!r}") from exc
    if values.shape != (n,) or given.dtype == bool:
        raise ValueError(f"losses must be {n} real numbers, got {given!r}")
    bad = np.flatnonzero(take & ~np.isfinite(values))
    if len(bad):
        raise ValueError(
            f"loss must be a finite real number, got losses[{bad[0]}] = {float(values[bad[0]])!r}"
        )
    return values


def cumulative(q: np.ndarray) -> np.ndarray:
    """Cumulative sums over arms (axis 0); a loop of vector adds beats np.cumsum for few arms.

    The additions are the same, in the same order, so the result is identical to np.cumsum.
    """
    if len(q) > 64:
        return np.cumsum(q, axis=0)
    out = q.copy()
    for i in range(1, len(out)):
        out[i] += out[i - 1]
    return out


def arm_total(w: np.ndarray) -> np.ndarray:
    """Σ over arms (axis 0), added in arm order: the same sum as ``cumulative(w)[-1]``."""
    if len(w) > 64:
        return np.cumsum(w, axis=0)[-1]
    total = w[0].copy()
    for row in w[1:]:
        total += row
    return total


def select_arms(cumulative_q: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Per instance (column), the smallest i with u < q_0 + … + q_i (else the last arm)."""
    return np.minimum((cumulative_q <= u).sum(axis=0), cumulative_q.shape[0] - 1)


class BatchBandit:
    """N independent instances of the same configuration (replay, simulation, per-user).

    ``select`` draws for all (or the chosen) instances at once and returns a
    ``TicketBatch``; ``update`` applies losses for a ticket batch, or for the entries
    chosen by ``where`` (feedback may arrive in parts and late).
    """

    def __init__(
        self,
        n_instances: int,
        n_arms: int,
        competition: Any = None,
        gamma: float | None = None,
        seed: int | None = None,
    ) -> None:
        self.n_instances = check_int("n_instances", n_instances, 1)
        self.n_arms, self.competition, self.structure, self.gamma = configure(
            n_arms, competition, gamma, seed
        )
        self._rng = np.random.default_rng(seed)
        self.token = os.urandom(8).hex()
        n = self.n_instances
        self.weights = self.structure.initial_state(n)
        self.psi = np.full(n, math.inf)
        self.vn = np.zeros(n)
        self.d_mant = np.zeros(n)
        self.d_exp = np.zeros(n, dtype=np.int64)
        self.n_updates = np.zeros(n, dtype=np.int64)
        self.n_rounds = np.zeros(n, dtype=np.int64)
        self._open: dict[int, np.ndarray] = {}
        self._serials = itertools.count(1)

    @property
    def nbytes(self) -> int:
        """Bytes of per-instance state (weights and statistics)."""
        arrays = (self.weights, self.psi, self.vn, self.d_mant, self.d_exp)
        return sum(a.nbytes for a in arrays) + self.n_updates.nbytes + self.n_rounds.nbytes

    def _rows(self, instances: Any) -> np.ndarray | slice:
        """Row selector: a slice for all instances (views, no copies), else unique indices."""
        if instances is None:
            return slice(None)
        rows = check_int_vector(
            "instances", instances, len(np.atleast_1d(instances)), 0, self.n_instances - 1
        )
        if len(np.unique(rows)) != len(rows):
            raise ValueError("instances must not repeat within one call")
        return rows

    def _contexts(self, contexts: Any, n: int) -> np.ndarray:
        c = self.structure.n_contexts
        if contexts is None:
            if c > 1:
                raise ValueError(f"contexts are required: integers in [0, {c - 1}]")
            return np.zeros(n, dtype=np.int64)
        if c == 1:
            raise ValueError("contexts given but the competition class has no contexts")
        return check_int_vector("contexts", contexts, n, 0, c - 1)

    def _policy(self, rows: np.ndarray | slice, contexts: np.ndarray) -> tuple[np.ndarray, ...]:
        """(q, w, Σw): q and the arm weights w have shape (M, n), arms first; p = w / Σw."""
        c = self.gamma / np.sqrt(self.vn[rows] + 1.0)
        w = self.structure.arm_weights(self.weights, rows, contexts, c)
        total = arm_total(w)  # Σw in arm order, exactly as Bandit sums it
        t = (self.n_updates[rows] + 1).astype(float)
        eps = np.minimum(0.5, np.sqrt(self.n_arms / t))
        q = w * ((1.0 - eps) / total)
        q += eps / self.n_arms
        return q, w, total

    def probabilities(self, instances: Any = None, contexts: Any = None) -> np.ndarray:
        """q for each chosen instance (rows in the order given), shape (n, M)."""
        rows = self._rows(instances)
        return self._policy(rows, self._contexts(contexts, self._count(rows)))[0].T

    def select(self, instances: Any = None, contexts: Any = None, u: Any = None) -> TicketBatch:
        """Draw one arm per chosen instance; ``u`` gives the uniform draws (else the seed)."""
        rows = self._rows(instances)
        n = self._count(rows)
        ctx = self._contexts(contexts, n)
        u = self._rng.random(n) if u is None else _real_array("u", u, n, 0.0, 1.0)
        if (u >= 1.0).any():
            raise ValueError(f"u must be in [0, 1), got {u[u >= 1.0][0]!r}")
        q, w, total = self._policy(rows, ctx)
        arms = select_arms(cumulative(q), u)
        idx = np.arange(n)
        self.n_rounds[rows] += 1
        serial = next(self._serials)
        self._open[serial] = np.ones(n, dtype=bool)
        instances = idx if isinstance(rows, slice) else rows
        return TicketBatch(
            self.token,
            serial,
            instances,
            self.n_rounds[rows].copy(),  # not a view: the counter moves on
            arms,
            q[arms, idx],
            w[arms, idx] / total,
            ctx,
            isinstance(rows, slice),
        )

    def _count(self, rows: np.ndarray | slice) -> int:
        return self.n_instances if isinstance(rows, slice) else len(rows)

    def _take(self, tickets: Any, where: Any) -> np.ndarray:
        """Mask of the ticket entries to settle now; refuses foreign or settled entries."""
        if not isinstance(tickets, TicketBatch):
            raise TicketError(f"expected a TicketBatch, got {tickets!r}")
        if tickets.owner != self.token:
            raise TicketError("ticket batch belongs to another BatchBandit")
        take = where_mask(where, len(tickets))
        if not take.any():
            return take
        still_open = self._open.get(tickets.serial)
        if still_open is None:
            raise TicketError(f"ticket batch {tickets.serial} is already settled")
        settled = np.flatnonzero(take & ~still_open)
        if len(settled):
            raise TicketError(
                f"ticket entry {settled[0]} of batch {tickets.serial} is already settled"
            )
        return take

    def update(self, tickets: TicketBatch, losses: Any, where: Any = None) -> None:
        """Apply the losses of a ticket batch (``losses`` has one entry per ticket)."""
        take = self._take(tickets, where)
        losses = checked_losses(losses, take)
        # the whole batch at once: slices give views instead of gathers and scatters
        pick = slice(None) if take.all() else take
        full = isinstance(pick, slice)
        rows = slice(None) if tickets.every and full else tickets.instances[pick]
        step = observe_batch(
            self.psi[rows],
            self.vn[rows],
            self.d_mant[rows],
            self.d_exp[rows],
            losses[pick],
            tickets.probs[pick],
            tickets.weight_shares[pick],
        )
        self.n_updates[rows] += 1
        if self.n_arms > 1:
            c = self.gamma / np.sqrt(step.vn + 1.0)
            self.structure.update(
                self.weights,
                rows,
                tickets.contexts[pick],
                tickets.arms[pick],
                step,
                c,
                self.n_updates[rows],
            )
        self.psi[rows], self.vn[rows] = step.psi, step.vn
        self.d_mant[rows], self.d_exp[rows] = step.d_mant, step.d_exp
        self._settle(tickets.serial, take)

    def discard(self, tickets: TicketBatch, where: Any = None) -> None:
        """Forget ticket entries without feedback (their time to live ran out)."""
        self._settle(tickets.serial, self._take(tickets, where))

    def _settle(self, serial: int, take: np.ndarray) -> None:
        if not take.any():
            return
        still_open = self._open[serial]
        still_open &= ~take
        if not still_open.any():
            del self._open[serial]
