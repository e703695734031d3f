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
import struct
from bisect import bisect_right
from collections.abc import Iterable
from itertools import accumulate
from types import MappingProxyType
from typing import Any

import numpy as np

from tsi_core.competition import Fixed, competition_from_dict
from tsi_core.stats import exploration, observe
from tsi_core.structures import Structure
from tsi_core.ticket import Ticket
from tsi_core.validate import check_draw, check_int, check_loss, check_real, context_problem

FORMAT = "tsi.bandit"
VERSION = 1


_NO_TICKETS: Any = MappingProxyType({})  # shared read-only stand-in for an empty table
_PACKED = struct.Struct("<dddqqq")  # psi, V/D², D mantissa, D exponent, updates, rounds


class TicketError(ValueError):
    """A ticket that this instance cannot settle (foreign, settled, discarded or forged)."""


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


@functools.lru_cache(maxsize=64)
def _weights_struct(n: int) -> struct.Struct:
    return struct.Struct(f"<{n}d")


@functools.lru_cache(maxsize=1024)
def _bound(competition: Any, n_arms: int) -> Structure:
    """Structures hold configuration only: instances of one configuration share one."""
    return competition.bind(n_arms)


def configure(n_arms: Any, competition: Any, gamma: Any, seed: Any) -> tuple[int, Any, Any, float]:
    """Validate a bandit's configuration: (M, competition class, its structure, γ)."""
    n_arms = check_int("n_arms", n_arms, 1)
    competition = Fixed() if competition is None else competition
    if not hasattr(competition, "bind"):
        raise ValueError(f"competition must be a competition class, got {competition!r}")
    structure = _bound(competition, n_arms)
    gamma = default_gamma(competition, n_arms) if gamma is None else check_gamma(gamma)
    if seed is not None:
        check_int("seed", seed, 0)
    return n_arms, competition, structure, gamma


def check_context(structure: Structure, context: Any) -> int:
    """Row of the weights a context selects (the rule: ``validate.context_problem``)."""
    problem = context_problem(structure.n_contexts, context)
    if problem is not None:
        raise ValueError(problem)
    return 0 if context is None else int(context)


def _first_above(cumulative_w: np.ndarray, u: float, scale: float, spread: float) -> int:
    """Smallest i with u < scale·W_i + spread·(i + 1) (binary search, no full q array)."""
    low, high = 0, len(cumulative_w)
    while low < high:
        mid = (low + high) // 2
        if u < scale * cumulative_w[mid] + spread * (mid + 1):
            high = mid
        else:
            low = mid + 1
    return low


class Bandit:
    """A bandit instance: ``select`` an arm, later ``update`` its ticket with the loss.

    Parameters: ``n_arms`` M >= 1; ``competition`` the class of arm sequences to compete
    with (``Fixed()`` by default); ``gamma`` the learning-rate scale (default sqrt(W));
    ``seed`` for the instance's own draws; ``instance_id`` names the instance on its
    tickets (random when not given).
    """

    __slots__ = (
        "_d_exp",
        "_d_mant",
        "_pending",
        "_rng_obj",
        "_rng_state",
        "_seed",
        "_state",
        "_vn",
        "competition",
        "gamma",
        "instance_id",
        "n_arms",
        "n_rounds",
        "n_updates",
        "psi",
        "structure",
    )

    def __init__(
        self,
        n_arms: int,
        competition: Any = None,
        gamma: float | None = None,
        seed: int | None = None,
        instance_id: str | None = None,
    ) -> None:
        self.n_arms, self.competition, self.structure, self.gamma = configure(
            n_arms, competition, gamma, seed
        )
        if instance_id is not None and not isinstance(instance_id, str):
            raise ValueError(f"instance_id must be a string, got {instance_id!r}")
        self.instance_id = instance_id if instance_id is not None else os.urandom(8).hex()
        self._seed = seed
        self._rng_state: dict[str, Any] | None = None  # restored generator state, if any
        self._rng_obj: np.random.Generator | None = None
        self._state = self.structure.initial_state(1)[..., 0].copy()
        self.psi = math.inf
        self._vn = 0.0
        self._d_mant = 0.0
        self._d_exp = 0
        self.n_updates = 0
        self.n_rounds = 0
        # no table while idle, the ticket itself while one is pending, else round -> ticket
        self._pending: Any = _NO_TICKETS

    @property
    def _rng(self) -> np.random.Generator:
        """The instance's own generator, created on first use (streams pass their own u)."""
        if self._rng_obj is None:
            self._rng_obj = np.random.default_rng(self._seed)
            if self._rng_state is not None:
                self._rng_obj.bit_generator.state = self._rng_state
        return self._rng_obj

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
    def eta(self) -> float:
        """The current learning rate γ / sqrt(V + D²) (+inf until a positive φ is seen)."""
        if not self._d_mant:
            return math.inf
        return self.gamma / (self.D * math.sqrt(self._vn + 1.0))

    @property
    def pending(self) -> tuple[Ticket, ...]:
        """Tickets selected and not yet updated or discarded."""
        if type(self._pending) is Ticket:
            return (self._pending,)
        return tuple(self._pending.values())

    # ------------------------------------------------------------------ decisions
    def _weights(self, row: int) -> tuple[Any, Any, float, float, float]:
        """(w, W, Σw, 1 - ε, ε/M) of one context: q = w·((1 - ε)/Σw) + ε/M, p = w/Σw.

        W is the cumulative sum of an array w (None for a list); Σw is summed in arm
        order, as the batch engine sums over its arm axis.
        """
        c = self.gamma / math.sqrt(self._vn + 1.0)
        w = self.structure.arm_weights_one(self._state, row, c)
        eps = exploration(self.n_arms, self.n_updates + 1)
        if isinstance(w, list):
            return w, None, sum(w), 1.0 - eps, eps / self.n_arms
        cw = np.cumsum(w)
        return w, cw, float(cw[-1]), 1.0 - eps, eps / self.n_arms

    def probabilities(self, context: int | None = None) -> np.ndarray:
        """q: the distribution the next selection (in this context) is drawn from."""
        w, _, total, keep, spread = self._weights(check_context(self.structure, context))
        return np.asarray(w) * (keep / total) + spread

    def select(self, context: int | None = None, u: float | None = None) -> Ticket:
        """Draw an arm; ``u`` in [0, 1) replaces the instance's own uniform draw."""
        row = check_context(self.structure, context)
        u = self._rng.random() if u is None else check_draw(u)
        w, cw, total, keep, spread = self._weights(row)
        if cw is None:
            scale = keep / total
            arm = bisect_right(list(accumulate([x * scale + spread for x in w])), u)
        else:
            arm = _first_above(cw, u, keep / total, spread)
        arm = min(arm, self.n_arms - 1)
        p = float(w[arm]) / total
        self.n_rounds += 1
        prob = float(w[arm]) * (keep / total) + spread
        ticket = Ticket(self.instance_id, self.n_rounds, arm, prob, p, context)
        self._hold(ticket)
        return ticket

    def _hold(self, ticket: Ticket) -> None:
        held = self._pending
        if held is _NO_TICKETS:
            self._pending = ticket  # the common case of one pending ticket needs no table
        elif type(held) is Ticket:
            self._pending = {held.round: held, ticket.round: ticket}
        else:
            held[ticket.round] = ticket

    def update(self, ticket: Ticket, loss: float) -> None:
        """Apply the loss of a ticket's arm; each ticket exactly once, in any order."""
        self._check_pending(ticket)
        loss = check_loss(loss)
        step = observe(
            self.psi, self._vn, self._d_mant, self._d_exp, loss, ticket.prob, ticket.weight_share
        )
        if self.n_arms > 1:
            context = 0 if ticket.context is None else ticket.context
            c = self.gamma / math.sqrt(step.vn + 1.0)
            self.structure.update_one(self._state, context, ticket.arm, step, c, self.n_updates + 1)
        self.psi, self._vn, self._d_mant, self._d_exp = step.psi, step.vn, step.d_mant, step.d_exp
        self.n_updates += 1
        self._settle(ticket)

    def discard(self, ticket: Ticket) -> None:
        """Forget a pending ticket without feedback (its time to live ran out)."""
        self._check_pending(ticket)
        self._settle(ticket)

    def _settle(self, ticket: Ticket) -> None:
        held = self._pending
        if type(held) is Ticket:
            self._pending = _NO_TICKETS  # an idle instance keeps no ticket table
            return
        del held[ticket.round]
        if len(held) == 1:
            [self._pending] = held.values()

    def _pending_at(self, round_: int) -> Ticket | None:
        held = self._pending
        if type(held) is Ticket:
            return held if held.round == round_ else None
        return held.get(round_)

    def _check_pending(self, ticket: Any) -> None:
        if not isinstance(ticket, Ticket):
            raise TicketError(f"expected a Ticket, got {ticket!r}")
        if ticket.instance != self.instance_id:
            raise TicketError(
                f"ticket of instance {ticket.instance!r} given to instance {self.instance_id!r}"
            )
        if self._pending_at(ticket.round) != ticket:
            raise TicketError(
                f"ticket round {ticket.round} is not pending here "
                "(already updated, discarded, never issued, or altered)"
            )

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
            "psi": None if math.isinf(self.psi) else self.psi,
            "vn": self._vn,
            "d_mant": self._d_mant,
            "d_exp": self._d_exp,
            "n_updates": self.n_updates,
            "n_rounds": self.n_rounds,
            "weights": [None if math.isinf(v) else v for v in self._state.ravel().tolist()],
            "pending": [t.to_dict() for t in self.pending],
            "seed": self._seed,
            "rng": self._rng_state if self._rng_obj is None else self._rng_obj.bit_generator.state,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Bandit:
        """Rebuild an instance from ``to_dict``; a malformed snapshot raises ``ValueError``."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} snapshot: {str(data)[:80]!r}")
        if data.get("version") != VERSION:
            raise ValueError(f"unsupported snapshot version {data.get('version')!r}")
        try:
            b = cls(
                data["n_arms"],
                competition_from_dict(data["competition"]),
                data["gamma"],
                instance_id=data["instance_id"],
            )
            weights = np.array(
                [-math.inf if v is None else float(v) for v in data["weights"]], dtype=float
            )
            if weights.size != b._state.size or np.isnan(weights).any():
                raise ValueError(f"weights must be {b._state.size} numbers")
            b._state = weights.reshape(b._state.shape)
            b.psi = math.inf if data["psi"] is None else check_loss(data["psi"])
            b._vn = check_real("vn", data["vn"], 0.0, math.inf)
            b._d_mant = check_real("d_mant", data["d_mant"], 0.0, 1.0)
            b._d_exp = check_int("d_exp", data["d_exp"], -(2**31))
            b.n_updates = check_int("n_updates", data["n_updates"], 0)
            b.n_rounds = check_int("n_rounds", data["n_rounds"], 0)
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

    # ------------------------------------------------------- compact idle state
    def pack(self, keep_pending: bool = False) -> bytes | None:
        """The learning state as compact bytes, or None if the instance owns a generator
        or (unless ``keep_pending``) has pending tickets: those stay live objects.

        About 130 bytes for 10 arms, against ~470 for the live object: services that keep
        one bandit per user hold them this way between events. Pending tickets are not in
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
        if self._pending is not _NO_TICKETS and not keep_pending:
            return None
        head = _PACKED.pack(
            self.psi, self._vn, self._d_mant, self._d_exp, self.n_updates, self.n_rounds
        )
        return head + self._state.tobytes()

    @classmethod
    def unpack(
        cls, blob: bytes, template: Bandit, instance_id: str, pending: Iterable[Ticket] = ()
    ) -> Bandit:
        """Rebuild an instance from ``pack()``; ``template`` is any instance of the same
        configuration (arms, competition, γ, seed), whose own state is not used, and
        ``pending`` the tickets that were pending when it was packed."""
        shape = template._state.shape
        size = _PACKED.size + template._state.nbytes
        if not isinstance(blob, bytes) or len(blob) != size:
            raise ValueError(f"a packed {shape} bandit is {size} bytes, got {blob!r:.80}")
        psi, vn, d_mant, d_exp, n_updates, n_rounds = _PACKED.unpack_from(blob)
        weights = _weights_struct(template._state.size).unpack_from(blob, _PACKED.size)
        if math.isnan(psi) or not 0.0 <= vn < math.inf or not 0.0 <= d_mant < 1.0:
            raise ValueError(f"packed statistics out of range: psi={psi}, vn={vn}, d={d_mant}")
        # a NaN or a +inf weight makes the sum NaN or +inf (-inf weights are valid): no numpy
        total = sum(weights)
        if n_updates < 0 or n_rounds < 0 or math.isnan(total) or total == math.inf:
            raise ValueError(f"packed counters or weights invalid: {n_updates}, {n_rounds}")
        b = cls.__new__(cls)
        b.n_arms, b.structure, b.gamma = template.n_arms, template.structure, template.gamma
        b.competition, b._seed, b.instance_id = template.competition, template._seed, instance_id
        b._rng_state = b._rng_obj = None
        b._state = np.array(weights).reshape(shape)
        b.psi, b._vn, b._d_mant, b._d_exp = psi, vn, d_mant, d_exp
        b.n_updates, b.n_rounds = n_updates, n_rounds
        b._pending = _NO_TICKETS
        for ticket in pending:
            if not isinstance(ticket, Ticket) or ticket.instance != instance_id:
                raise TicketError(f"not a ticket of instance {instance_id!r}: {ticket!r}")
            if not 0 < ticket.round <= n_rounds or b._pending_at(ticket.round) is not None:
                raise TicketError(f"ticket round {ticket.round} cannot be pending here")
            b._hold(ticket)
        return b
