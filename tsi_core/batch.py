"""Many independent bandit instances of one configuration, as rows of one table.

``BatchBandit`` calls the same compiled round as ``Bandit`` (``tsi_core._kernel``), once
per call for all the chosen instances: given the same uniform draws it makes the same
selections, with the same q bit for bit, as the same number of separate ``Bandit`` objects.

>>> bb = BatchBandit(n_instances=1000, n_arms=10, seed=1)
>>> tickets = bb.select()
>>> bb.update(tickets, losses=tickets.arms * 0.1 + 5.0)
>>> bb.probabilities().shape
(1000, 10)
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from tsi_core._kernel import D_EXP, D_MANT, HEAD, N_ROUNDS, N_UPDATES, PSI, VN, WHYS, Table
from tsi_core.allocation import Allocation
from tsi_core.bandit import TicketError, configure
from tsi_core.validate import check_draws, check_int, check_int_vector, is_real
from tsi_core.variant import Variant

FORCED = WHYS.index("forced")


@dataclass(frozen=True, eq=False)
class TicketBatch:
    """The selections of one ``BatchBandit.select`` call, one entry per instance.

    ``probs`` are the probabilities the arms were served with (see ``Ticket.prob``);
    ``why`` is an int8 array of codes, ``WHYS[code]`` the reason each arm was served
    ("bandit", "holdout", "burn_in", "forced"; ``Ticket.why``); None given: all "bandit".
    """

    owner: str
    serial: int
    instances: np.ndarray
    rounds: np.ndarray
    arms: np.ndarray
    probs: np.ndarray
    weight_shares: np.ndarray  # the paper's p of each chosen arm (see Ticket.weight_share)
    contexts: np.ndarray
    every: bool = False  # one entry per instance of the BatchBandit, in order
    why: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.why is None:
            object.__setattr__(self, "why", np.zeros(len(self.instances), dtype=np.int8))

    def __len__(self) -> int:
        return len(self.instances)


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
    given = np.asarray(losses)
    if given.shape != (n,) or given.dtype.kind not in "iuf":
        odd = [i for i, v in enumerate(given.ravel()[:n]) if not is_real(v)]
        where = f": losses[{odd[0]}] = {given.ravel()[odd[0]]!r}" if odd else ""
        raise ValueError(f"losses must be {n} real numbers, got {losses!r:.200}{where}")
    values = given.astype(float, copy=False)
    bad = np.flatnonzero(take & ~np.isfinite(values))
    if len(bad):
        raise ValueError(
            f"loss must be a finite real number, got losses[{bad[0]}] = {float(values[bad[0]])!r}"
        )
    return values


class BatchBandit:
    """N independent instances of the same configuration (replay, simulation, per-user).

    ``select`` draws for all (or the chosen) instances at once and returns a
    ``TicketBatch``; ``update`` applies losses for a ticket batch, or for the entries
    chosen by ``where`` (feedback may arrive in parts and late). Instance i is row i of
    ``rows`` (the kernel's layout: statistics, then the class's state). ``variant`` and
    ``allocation`` (one for every instance; a settable property) as for ``Bandit``.
    """

    def __init__(
        self,
        n_instances: int,
        n_arms: int,
        competition: Any = None,
        gamma: float | None = None,
        seed: int | None = None,
        variant: str | Variant | None = None,
        allocation: Allocation | None = None,
    ) -> None:
        self.n_instances = check_int("n_instances", n_instances, 1)
        self.n_arms, self.competition, self.structure, self.gamma, self.variant = configure(
            n_arms, competition, gamma, seed, variant
        )
        self.allocation = allocation
        self._rng = np.random.default_rng(seed)
        self.token = os.urandom(8).hex()
        kernel = self.structure.kernel(self.gamma, self.variant)
        self._table = Table(kernel, kernel.initial_rows(self.n_instances))
        self._every = np.arange(self.n_instances, dtype=np.int64)
        self._no_context = np.zeros(self.n_instances, dtype=np.int64)
        self._open: dict[int, np.ndarray] = {}
        self._serials = itertools.count(1)

    @property
    def allocation(self) -> Allocation:
        """How traffic is allocated around the learner, for every instance
        (``tsi_core.allocation``); setting it is a live edit and changes no learned state."""
        return self._allocation

    @allocation.setter
    def allocation(self, allocation: Allocation | None) -> None:
        if allocation is None:
            allocation = Allocation()
        if not isinstance(allocation, Allocation):
            raise ValueError(f"allocation must be an Allocation or None, got {allocation!r}")
        self._allocation = allocation.check(self.n_arms)

    # ------------------------------------------------------------- state views
    @property
    def rows(self) -> np.ndarray:
        """The state table, one row per instance (a view: writing it changes the bandits)."""
        return self._table.rows

    @property
    def weights(self) -> np.ndarray:
        """The class's state of every instance, shape (N, *state_shape) (a view)."""
        end = HEAD + self._table.kernel.n_state  # then the context clocks and means, if any
        return self.rows[:, HEAD:end].reshape(self.n_instances, *self.structure.state_shape)

    @property
    def psi(self) -> np.ndarray:
        return self.rows[:, PSI]

    @property
    def vn(self) -> np.ndarray:
        return self.rows[:, VN]

    @property
    def d_mant(self) -> np.ndarray:
        return self.rows[:, D_MANT]

    @property
    def d_exp(self) -> np.ndarray:
        return self.rows[:, D_EXP].astype(np.int64)

    @property
    def n_updates(self) -> np.ndarray:
        return self.rows[:, N_UPDATES].astype(np.int64)

    @property
    def n_rounds(self) -> np.ndarray:
        return self.rows[:, N_ROUNDS].astype(np.int64)

    @property
    def nbytes(self) -> int:
        """Bytes of per-instance state (weights and statistics)."""
        return self.rows.nbytes

    # ------------------------------------------------------------------ rounds
    def _rows(self, instances: Any) -> np.ndarray:
        """Row indices: all instances in order (None), else unique indices."""
        if instances is None:
            return self._every
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
            return self._no_context[:n]
        if c == 1:
            raise ValueError("contexts given but the competition class has no contexts")
        return check_int_vector("contexts", contexts, n, 0, c - 1)

    def _eligible(self, eligible: Any, n: int) -> np.ndarray | None:
        """A uint8 mask of shape (n, M) or (M,) from booleans of that shape, or None for
        every arm; ``ValueError`` naming a row with no eligible arm (the round refuses a
        forced arm that is not eligible)."""
        if eligible is None:
            return None
        given = np.asarray(eligible)
        m = self.n_arms
        if given.dtype != bool or given.shape not in ((m,), (n, m)):
            raise ValueError(
                f"eligible must be booleans of shape ({m},) or ({n}, {m}), got {eligible!r:.200}"
            )
        empty = np.flatnonzero(~given.reshape(-1, m).any(axis=1))
        if len(empty):
            raise ValueError(f"eligible row {empty[0]} has no eligible arm")
        return None if given.all() else np.ascontiguousarray(given, dtype=np.uint8)

    def probabilities(
        self, instances: Any = None, contexts: Any = None, eligible: Any = None
    ) -> np.ndarray:
        """P for each chosen instance (rows in the order given), shape (n, M): the
        probability of each arm at its next selection under the allocation, among the
        ``eligible`` arms (as ``select`` takes them); q with neither."""
        rows = self._rows(instances)
        ctx = self._contexts(contexts, len(rows))
        mask = self._eligible(eligible, len(rows))
        return self._table.probabilities_many(rows, ctx, self._allocation, mask)

    def policy(self, instances: Any = None, contexts: Any = None) -> np.ndarray:
        """q, the learners' own distributions (before allocation and eligibility), (n, M)."""
        rows = self._rows(instances)
        return self._table.probabilities_many(rows, self._contexts(contexts, len(rows)))

    def select(
        self, instances: Any = None, contexts: Any = None, u: Any = None, eligible: Any = None
    ) -> TicketBatch:
        """Draw one arm per chosen instance; ``u`` gives the uniform draws (else the seed);
        ``eligible`` booleans of shape (n, M), or (M,) for every instance, the arms each
        request may be served (None: all)."""
        rows = self._rows(instances)
        n = len(rows)
        ctx = self._contexts(contexts, n)
        mask = self._eligible(eligible, n)
        u = self._rng.random(n) if u is None else check_draws(u, n)
        arms = np.empty(n, dtype=np.int64)
        probs, shares, why = np.empty(n), np.empty(n), np.empty(n, dtype=np.int8)
        self._table.select_many(
            rows, ctx, np.ascontiguousarray(u), arms, probs, shares, why, self._allocation, mask
        )
        serial = next(self._serials)
        self._open[serial] = np.ones(n, dtype=bool)
        return TicketBatch(
            self.token,
            serial,
            rows,
            self.rows[rows, N_ROUNDS].astype(np.int64),
            arms,
            probs,
            shares,
            ctx,
            instances is None,
            why,
        )

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
        """Apply the losses of a ticket batch (``losses`` has one entry per ticket); the
        entries served because an arm was forced are settled and teach nothing."""
        settle = self._take(tickets, where)
        losses = checked_losses(losses, settle)
        take = settle & (tickets.why != FORCED)
        if take.all():
            parts = (tickets.instances, tickets.contexts, tickets.arms, tickets.probs)
            shares, values = tickets.weight_shares, losses
        else:
            parts = tuple(a[take] for a in (tickets.instances, tickets.contexts, tickets.arms))
            parts += (tickets.probs[take],)
            shares, values = tickets.weight_shares[take], losses[take]
        self._table.update_many(*parts, shares, np.ascontiguousarray(values))
        self._settle(tickets.serial, settle)

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
