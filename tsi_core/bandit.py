"""One translation- and scale-invariant bandit instance (Gokcesu & Gokcesu, Algorithm 1).

>>> b = Bandit(n_arms=3, seed=7)
>>> ticket = b.select()
>>> b.update(ticket, loss=1e6 + 12.5)      # any real loss: no range, no horizon
>>> round(float(b.probabilities().sum()), 12)
1.0
>>> Bandit.from_dict(b.to_dict()).probabilities().tolist() == b.probabilities().tolist()
True
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Iterable
from typing import Any

import numpy as np

from tsi_core._bandit import BanditCore, unpacked
from tsi_core._kernel import D_EXP, D_MANT, HEAD, N_ROUNDS, N_UPDATES, PSI, VN, Table, exp_array
from tsi_core._packing import MAX_COUNT
from tsi_core.allocation import Allocation, eligible_mask
from tsi_core.competition import Fixed, competition_from_dict
from tsi_core.structures import Structure, SwitchingWeights
from tsi_core.ticket import Ticket, TicketError
from tsi_core.validate import check_int, check_loss, check_real, context_problem
from tsi_core.variant import Variant, variant_of

FORMAT = "tsi.bandit"
#: 2: Switching keeps its weights, not their logs; 3: the Tsallis learner's context clocks;
#: 4: its context means and counts (versions 1 to 3 are read too)
VERSION = 5


@functools.lru_cache(maxsize=1024)
def default_gamma(competition: Any, n_arms: int) -> float:
    """γ = sqrt(W) of the class (the paper's corollary); 1 where W = 0 (a single class)."""
    w = competition.complexity(n_arms)
    return math.sqrt(w) if w > 0 else 1.0


def check_gamma(gamma: Any) -> float:
    g = check_real("gamma", gamma, 0.0, math.inf)
    if g == 0.0 or math.isinf(g):
        raise ValueError(f"gamma must be finite and > 0, got {gamma!r}")
    return g


@functools.lru_cache(maxsize=1024)
def _bound(competition: Any, n_arms: int) -> Structure:
    """Structures hold configuration only: instances of one configuration share one."""
    return competition.bind(n_arms)


def configure(
    n_arms: Any, competition: Any, gamma: Any, seed: Any, variant: Any = None
) -> tuple[int, Any, Any, float, Variant]:
    """Validate a bandit's configuration: (M, competition class, its structure, γ, variant)."""
    n_arms = check_int("n_arms", n_arms, 1)
    competition = Fixed() if competition is None else competition
    if not hasattr(competition, "bind"):
        raise ValueError(f"competition must be a competition class, got {competition!r}")
    structure = _bound(competition, n_arms)
    variant = variant_of(variant)
    if gamma is None and variant.learner == "tsallis" and structure.tsallis_capable:
        gamma = variant.tsallis_scale  # each context's rate (its own clock)
    elif gamma is None:
        gamma = default_gamma(competition, n_arms) * variant.gamma_scale
    else:
        gamma = check_gamma(gamma)
    if seed is not None:
        check_int("seed", seed, 0)
    return n_arms, competition, structure, gamma, variant


def check_context(structure: Structure, context: Any) -> int:
    """Row of the weights a context selects (the rule: ``validate.context_problem``)."""
    problem = context_problem(structure.n_contexts, context)
    if problem is not None:
        raise ValueError(problem)
    return 0 if context is None else int(context)


__all__ = ["Bandit", "TicketError", "check_context", "configure", "default_gamma"]


def _snapshot_gamma(data: dict[str, Any], competition: Any, variant: Variant) -> Any:
    """A snapshot's γ. Before version 3 the Tsallis learner's default for C contexts was
    tsallis_scale·sqrt(C) on one shared clock: that γ reads as today's default (the
    context clocks then keep every context's rate, ``Kernel.clocks_from_total``)."""
    gamma = data["gamma"]
    if data["version"] >= 3 or variant.learner != "tsallis":
        return gamma
    n_contexts = getattr(competition, "n_contexts", 1)
    return None if gamma == variant.tsallis_scale * math.sqrt(n_contexts) else gamma


def _snapshot_arm_stats(
    data: dict[str, Any], kernel: Any, d_mant: float, n_updates: int
) -> np.ndarray:
    """A snapshot's per-arm gap statistics, checked (``Kernel.arm_stats_problem``); before
    version 5 from D (``Kernel.arm_stats_from_scale``)."""
    if data["version"] < 5:
        return kernel.arm_stats_from_scale(d_mant != 0.0)
    squares, counts = data["arm_mean_squares"], data["arm_gap_counts"]
    if not all(isinstance(v, (int, float)) for v in [*squares, *counts]):
        raise ValueError(f"arm statistics must be numbers, got {squares!r}, {counts!r}")
    if len(squares) != kernel.n_arm_stats or len(counts) != kernel.n_arm_stats:
        raise ValueError(f"arm statistics must be {kernel.n_arm_stats} numbers each")
    problem = kernel.arm_stats_problem(squares, counts, n_updates)
    if problem is not None:
        raise ValueError(f"arm statistics: {problem}")
    return np.concatenate([squares, counts]).astype(float)


class _Column:
    """One statistic of an instance: a column of its kernel row, read as ``kind``."""

    def __init__(self, column: int, kind: type, doc: str) -> None:
        self.column, self.kind, self.__doc__ = column, kind, doc

    def __get__(self, bandit: Any, owner: type | None = None) -> Any:
        if bandit is None:
            return self
        return self.kind(bandit._row[self.column])

    def __set__(self, bandit: Any, value: float) -> None:
        bandit._row[self.column] = value


class Bandit(BanditCore):
    """A bandit instance: ``select`` an arm, later ``update`` its ticket with the loss.

    Parameters: ``n_arms`` M >= 1; ``competition`` the class of arm sequences to compete
    with (``Fixed()`` by default); ``gamma`` the learning-rate scale (default sqrt(W),
    times the variant's ``gamma_scale``);
    ``seed`` for the instance's own draws; ``instance_id`` names the instance on its
    tickets (random when not given); ``variant`` the algorithm (``tsi_core.variant``: a
    preset's name, "paper" for the paper's Algorithm 1, or a ``Variant``); ``allocation``
    how traffic is allocated around the learner (``tsi_core.allocation``: a floor, a
    holdout, a burn-in, a forced arm; a settable property). ``select``,
    ``update`` and ``discard`` are compiled (``tsi_core._bandit``); the round itself is
    the kernel's (``tsi_core._kernel``), which ``BatchBandit`` and the service share.
    """

    __slots__ = ("competition", "gamma", "n_arms", "structure", "variant")

    def __init__(
        self,
        n_arms: int,
        competition: Any = None,
        gamma: float | None = None,
        seed: int | None = None,
        instance_id: str | None = None,
        variant: str | Variant | None = None,
        allocation: Allocation | None = None,
    ) -> None:
        self.n_arms, self.competition, self.structure, self.gamma, self.variant = configure(
            n_arms, competition, gamma, seed, variant
        )
        if allocation is not None and not isinstance(allocation, Allocation):
            raise ValueError(f"allocation must be an Allocation or None, got {allocation!r}")
        if allocation is not None:
            allocation.check(self.n_arms)
        if instance_id is not None and not isinstance(instance_id, str):
            raise ValueError(f"instance_id must be a string, got {instance_id!r}")
        self.instance_id = instance_id if instance_id is not None else os.urandom(8).hex()
        self._seed = seed
        kernel = self.structure.kernel(self.gamma, self.variant)
        self._attach(Table(kernel, kernel.initial_rows(1)))
        self.allocation = allocation

    # ------------------------------------------------ state (one row of the kernel's table)
    psi = _Column(PSI, float, "ψ, the smallest loss seen (+inf before any), or the mean")
    n_updates = _Column(N_UPDATES, int, "losses applied")
    n_rounds = _Column(N_ROUNDS, int, "selections made")
    _vn = _Column(VN, float, "V / D²")
    _d_mant = _Column(D_MANT, float, "D's mantissa, in [0.5, 1) (0 before a positive φ)")
    _d_exp = _Column(D_EXP, int, "D's exponent")

    @property
    def _state(self) -> np.ndarray:
        """The class's state (a view), shape ``structure.state_shape``."""
        n = self._table.kernel.n_state
        return self._row[HEAD : HEAD + n].reshape(self.structure.state_shape)

    @_state.setter
    def _state(self, value: np.ndarray) -> None:
        n = self._table.kernel.n_state
        self._row[HEAD : HEAD + n] = np.asarray(value, dtype=float).ravel()

    @property
    def _clocks(self) -> np.ndarray:
        """The Tsallis learner's clock S_c of each context (a view; empty for one context
        or the exponential-weights learner)."""
        start = HEAD + self._table.kernel.n_state
        return self._row[start : start + self._table.kernel.n_clocks]

    @_clocks.setter
    def _clocks(self, value: np.ndarray) -> None:
        self._clocks[:] = np.asarray(value, dtype=float).ravel()

    @property
    def _context_means(self) -> np.ndarray:
        """The Tsallis learner's mean loss m_c of each context, then each context's count
        of losses (a view, 2·C values; empty for one context or the exponential-weights
        learner)."""
        kernel = self._table.kernel
        start = HEAD + kernel.n_state + kernel.n_clocks
        return self._row[start : start + 2 * kernel.n_clocks]

    @_context_means.setter
    def _context_means(self, value: np.ndarray) -> None:
        self._context_means[:] = np.asarray(value, dtype=float).ravel()

    @property
    def _arm_stats(self) -> np.ndarray:
        """The Tsallis learner's mean squared gap of each arm in units of D², then each
        arm's count of gaps (a view, 2·M values; empty for the exponential-weights
        learner)."""
        return self._row[self._row.shape[0] - 2 * self._table.kernel.n_arm_stats :]

    @_arm_stats.setter
    def _arm_stats(self, value: np.ndarray) -> None:
        """Sets the column before them too: the number of arms with a gap."""
        block = self._table.kernel.arm_block(value)
        self._row[self._row.shape[0] - block.shape[0] :] = block

    # ---------------------------------------------------------------- statistics
    @property
    def D(self) -> float:  # noqa: N802 - the paper's name
        """Running max of φ (the range estimate); may print as inf for extreme losses."""
        try:
            return math.ldexp(self._d_mant, self._d_exp)
        except OverflowError:  # D itself is beyond float64; only its scale-free form is used
            return math.inf

    @property
    def V(self) -> float:  # noqa: N802 - the paper's name
        """Σ v_t = Σ p_{i_t} φ_t² (kept internally as V / D², which never overflows)."""
        d = self.D
        return self._vn * d * d if d else 0.0

    @property
    def baseline(self) -> float:
        """What the losses are centred on: ψ, or the mean of the losses so far (the
        variant's baseline); +inf before any loss."""
        return self.psi if self.n_updates or self.variant.baseline == "min" else math.inf

    @property
    def eta(self) -> float:
        """The current learning rate γ / sqrt(V + D²), or the variant's (+inf until a
        non-zero φ is seen)."""
        if not self._d_mant:
            return math.inf
        return self._table.kernel.scale(self._vn) / self.D

    # ------------------------------------------------------------------ decisions
    def probabilities(self, context: int | None = None, eligible: Any = None) -> np.ndarray:
        """P: the probability of each arm at the next selection (in this context, among
        the ``eligible`` arms as ``select`` takes them), under the allocation: what a
        ticket's ``prob`` would be. With no allocation and every arm eligible, q.

        >>> b = Bandit(3, allocation=Allocation(holdout_arm=0, holdout_share=0.5))
        >>> b.probabilities().round(4).tolist(), b.policy().round(4).tolist()
        ([0.6667, 0.1667, 0.1667], [0.3333, 0.3333, 0.3333])
        """
        ctx = check_context(self.structure, context)
        mask = eligible_mask(eligible, self.n_arms)
        return self._table.probabilities(0, ctx, self._allocation, mask)

    def policy(self, context: int | None = None) -> np.ndarray:
        """q: the learner's own distribution (in this context), before the allocation and
        eligibility (``probabilities``)."""
        return self._table.probabilities(0, check_context(self.structure, context))

    def weight_shares(self, context: int | None = None) -> np.ndarray:
        """p = w/Σw: the class's arm distribution before the ε-mixing (q = (1-ε)p + ε/M)."""
        return self._table.weight_shares(0, check_context(self.structure, context))

    # -------------------------------------------------------------- persistence
    def to_dict(self) -> dict[str, Any]:
        """A versioned, JSON-serialisable snapshot (no pickle)."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "instance_id": self.instance_id,
            "n_arms": self.n_arms,
            "competition": self.competition.to_dict(),
            "gamma": self.gamma,
            "variant": self.variant.to_dict(),
            "allocation": self.allocation.to_dict(),
            "psi": None if math.isinf(self.psi) else self.psi,
            "vn": self._vn,
            "d_mant": self._d_mant,
            "d_exp": self._d_exp,
            "n_updates": self.n_updates,
            "n_rounds": self.n_rounds,
            "weights": [None if math.isinf(v) else v for v in self._state.ravel().tolist()],
            "clocks": self._clocks.tolist(),
            "context_means": self._context_means[: len(self._clocks)].tolist(),
            "context_counts": self._context_means[len(self._clocks) :].tolist(),
            "arm_mean_squares": self._arm_stats[: self._table.kernel.n_arm_stats].tolist(),
            "arm_gap_counts": self._arm_stats[self._table.kernel.n_arm_stats :].tolist(),
            "pending": [t.to_dict() for t in self.pending],
            "seed": self._seed,
            "rng": self._rng_state if self._rng_obj is None else self._rng_obj.bit_generator.state,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Bandit:
        """Rebuild an instance from ``to_dict``; a malformed snapshot raises ``ValueError``."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} snapshot: {str(data)[:80]!r}")
        if data.get("version") not in (1, 2, 3, 4, VERSION):
            raise ValueError(f"unsupported snapshot version {data.get('version')!r}")
        try:
            competition = competition_from_dict(data["competition"])
            variant = Variant.from_dict(data.get("variant", "paper"))  # before: the paper's
            b = cls(
                data["n_arms"],
                competition,
                _snapshot_gamma(data, competition, variant),
                instance_id=data["instance_id"],
                variant=variant,
                allocation=Allocation.from_dict(data.get("allocation", {})),  # before: none
            )
            b._restore_learning(data)
            for raw in data["pending"]:
                t = Ticket.from_dict(raw)
                if b._pending_at(t.round) is not None or t.instance != b.instance_id:
                    raise ValueError(
                        f"pending ticket {raw!r} repeats a round or names another instance"
                    )
                b._hold(t)
            if data["seed"] is not None:
                b._seed = check_int("seed", data["seed"], 0)
            if data["rng"] is not None:
                b._rng_state = data["rng"]
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed {FORMAT} snapshot: {exc!r}") from exc
        return b

    def _restore_learning(self, data: dict[str, Any]) -> None:
        """The statistics, the state, the context clocks and means and the arms' gap
        statistics of a ``to_dict`` snapshot, each checked (a snapshot before version 3
        has no clocks: they come from the total S, ``Kernel.clocks_from_total``; before
        version 4 no context means: from ψ, ``Kernel.means_from_mean``; before version 5
        no arm statistics: ``Kernel.arm_stats_from_scale``)."""
        kernel = self._table.kernel
        weights = np.array(
            [-math.inf if v is None else float(v) for v in data["weights"]], dtype=float
        )
        if weights.size != self._state.size:
            raise ValueError(f"weights must be {self._state.size} numbers")
        if data["version"] == 1 and isinstance(self.structure, SwitchingWeights):
            weights = exp_array(weights)  # version 1 kept Switching's log-weights
        problem = kernel.state_problem(weights)
        if problem is not None:
            raise ValueError(f"weights: {problem}")
        vn = check_real("vn", data["vn"], 0.0, math.inf)
        clocks = data["clocks"] if data["version"] >= 3 else kernel.clocks_from_total(vn)
        problem = kernel.clocks_problem(clocks)
        if problem is not None:
            raise ValueError(f"clocks: {problem}")
        psi = math.inf if data["psi"] is None else check_loss(data["psi"])
        n_updates = check_int("n_updates", data["n_updates"], 0, MAX_COUNT)
        means = kernel.means_from_mean(psi)
        if data["version"] >= 4:
            means = np.concatenate([data["context_means"], data["context_counts"]])
        problem = kernel.means_problem(means[: len(clocks)], means[len(clocks) :], n_updates)
        if problem is not None:
            raise ValueError(f"context means: {problem}")
        d_mant = check_real("d_mant", data["d_mant"], 0.0, 1.0)
        arm_stats = _snapshot_arm_stats(data, kernel, d_mant, n_updates)
        self._state, self._clocks, self._context_means = weights, clocks, means
        self._arm_stats = arm_stats
        self.psi, self._vn, self.n_updates, self._d_mant = psi, vn, n_updates, d_mant
        self._d_exp = check_int("d_exp", data["d_exp"], -(2**31), 2**31)
        self.n_rounds = check_int("n_rounds", data["n_rounds"], 0, MAX_COUNT)

    # ------------------------------------------------------- compact idle state
    def pack(self, keep_pending: bool = False) -> bytes | None:
        """The learning state as compact bytes, or None if the instance owns a generator
        or (unless ``keep_pending``) has pending tickets: those stay live objects.

        The layout is ``tsi_core._packing``'s: at 10 arms 128 bytes for the exponential-
        weights variants and 138 to about 250 for the default (its arms' gap statistics), against
        several hundred for the live object: services that keep one bandit per user hold
        them this way between events. Pending tickets are not in
        the bytes: with ``keep_pending=True`` the caller keeps them and hands them back to
        ``unpack``.

        >>> b = Bandit(3, instance_id="u1")
        >>> b.update(b.select(u=0.5), 2.0)
        >>> again = Bandit.unpack(b.pack(), Bandit(3), "u1")
        >>> again.to_dict() == b.to_dict()
        True
        """
        if self._rng_obj is not None or self._rng_state is not None:
            return None
        if self._pending is not None and not keep_pending:
            return None
        return self._packed()

    @classmethod
    def unpack(
        cls, blob: bytes, template: Bandit, instance_id: str, pending: Iterable[Ticket] = ()
    ) -> Bandit:
        """Rebuild an instance from ``pack()``; ``template`` is any instance of the same
        configuration (arms, competition, γ, variant, seed), whose own state is not used, and
        ``pending`` the tickets that were pending when it was packed. The allocation is
        the template's (configuration: the bytes do not carry it)."""
        b = unpacked(cls, blob, template, instance_id)
        for ticket in pending:
            if not isinstance(ticket, Ticket) or ticket.instance != instance_id:
                raise TicketError(f"not a ticket of instance {instance_id!r}: {ticket!r}")
            if not 0 < ticket.round <= b.n_rounds or b._pending_at(ticket.round) is not None:
                raise TicketError(f"ticket round {ticket.round} cannot be pending here")
            b._hold(ticket)
        return b
