"""What every peer adapter shares: ``PeerBatch`` (the ``BatchBandit`` calling convention over
one peer object per instance, with guarded calls), the failure records, and the helpers
for importing a library quietly and checking a peer's vectors.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import math
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from tsi_core.bandit import TicketError
from tsi_core.batch import TicketBatch, checked_losses, where_mask
from tsi_core.validate import check_int

INSTALL_HINT = "pip install -e '.[lab]'"
KINDS = ("exception", "nan", "overflow", "collapse")

_TINY = np.finfo(float).tiny  # weights summing to less have lost their precision (subnormal)
# numpy's floating-point warnings ("overflow encountered in exp", "invalid value encountered
# in divide", "divide by zero encountered in log"); underflow is left at numpy's default (ignored)
_FP_WARNING = re.compile(r"(overflow|invalid value|divide by zero) encountered")


@dataclass(frozen=True)
class Failure:
    """Where an algorithm broke or degraded: the instance, its round (1-based), the kind and
    what happened. Recorded by the peer adapters and by the arena's loop (``arena.runner``).

    ``kind`` is one of ``KINDS``: "exception" (the peer raised), "nan" (NaN in its state or
    probabilities), "overflow" (numpy warned of an overflow, ``OverflowError``, or infinite
    state), "collapse" (finite but degenerate: all weights zero or subnormal, i.e. without
    precision, or probabilities not summing to one). A peer's ``detail`` starts with the phase
    ("select", "update" or "probabilities") and quotes numpy's warnings in the same call.

    >>> Failure(0, 7, "nan", "update: weights contain NaN: [nan, 1.0]").round
    7
    """

    instance: int
    round: int
    kind: str
    detail: str


@dataclass
class NumericWarning:
    """A numpy floating-point warning seen in peer calls: its first instance and round, and
    the number of calls that raised it (not failures by themselves unless about overflow).

    >>> NumericWarning("divide by zero encountered in log", instance=2, round=1, calls=4)
    NumericWarning(message='divide by zero encountered in log', instance=2, round=1, calls=4)
    """

    message: str
    instance: int
    round: int
    calls: int = 0


class PeerFaultError(Exception):
    """Raised by an adapter's own checks on a peer's state; recorded as a ``Failure``.

    >>> try:
    ...     check_vector("weights", np.array([0.0, 0.0]), normalised=False)
    ... except PeerFaultError as exc:
    ...     print(exc.kind, "|", exc)
    collapse | weights are not a positive vector: [0.0, 0.0]
    """

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


@contextlib.contextmanager
def quiet_import() -> Iterator[io.StringIO]:
    """Import a library without letting it change the process: its prints are captured, and
    numpy's error state, the warnings filters and ``sys.path`` are restored afterwards
    (SMPyBandits calls ``np.seterr(divide='ignore')``, adds ``'..'`` to ``sys.path`` and
    warnings filters; river adds warnings filters)."""
    err = np.geterr()
    path = list(sys.path)
    out = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(out):
            yield out
    finally:
        np.seterr(**err)
        sys.path[:] = path


def uniform_probs(n: int, m: int) -> np.ndarray:
    return np.full((n, m), 1.0 / m)


def check_vector(name: str, v: np.ndarray, normalised: bool) -> None:
    """Raise ``PeerFaultError`` when a peer's weight or probability vector is unusable."""
    if np.isnan(v).any():
        raise PeerFaultError("nan", f"{name} contain NaN: {v.tolist()}")
    if np.isinf(v).any():
        raise PeerFaultError("overflow", f"{name} contain inf: {v.tolist()}")
    total = v.sum()
    if (v < 0).any() or not total > 0:
        raise PeerFaultError("collapse", f"{name} are not a positive vector: {v.tolist()}")
    if total < _TINY:
        raise PeerFaultError("collapse", f"{name} underflowed to subnormal numbers: {v.tolist()}")
    if normalised and abs(v.sum() - 1.0) > 1e-6:
        raise PeerFaultError("collapse", f"{name} sum to {v.sum()!r}, not 1: {v.tolist()}")


class PeerBatch:
    """N independent instances of one peer library's algorithm, driven like ``BatchBandit``.

    ``seed`` seeds every instance (``SeedSequence(seed).spawn(n_instances)``); ``loss_range``
    (lo, hi) switches to range-aware rewards in [0, 1]; other keyword arguments go to the
    peer's constructor (see each adapter's ``_make``). The calls the arena makes:

    - ``select(instances=None, contexts=None, u=None) -> TicketBatch``
    - ``update(tickets, losses, where=None)`` and ``discard(tickets, where=None)``
    - ``probabilities(instances=None, contexts=None) -> (n, M)``, for the peers that expose
      their selection probabilities (``exposes_probabilities``); the others raise
      ``NotImplementedError``.

    Losses and rewards
        Reward-maximising peers get ``reward(loss) = -loss``: what a practitioner does who
        does not know the range of the losses. With ``loss_range=(lo, hi)`` they get
        ``(hi - loss) / (hi - lo)`` in [0, 1] instead. Cost-minimising peers (Vowpal Wabbit)
        get ``cost(loss) = loss`` (with ``loss_range``: ``(loss - lo) / (hi - lo)``).

    Randomness
        Every instance gets its own seed (``numpy.random.SeedSequence(seed).spawn``): the same
        ``seed`` gives the same arms, whatever the other instances do. The peers draw arms
        with their own generators; ``u`` is used only where the adapter itself draws from a
        distribution (a probability mass function, a first round, the uniform fallback).

    Probabilities
        ``TicketBatch.probs`` is the probability the peer assigns to the chosen arm (the one
        it uses for importance weighting), or NaN where the peer does not expose one.
        ``TicketBatch.weight_shares`` repeats ``probs``: peers have no separate exploration-free
        distribution.

    Failures are results
        Every peer call runs inside ``np.errstate``/``warnings.catch_warnings``. When a peer
        raises, makes numpy warn of an overflow, or leaves non-finite or collapsed state or
        probabilities (NaN, inf, all weights zero or subnormal, probabilities not summing to
        one: checked after every call), a ``Failure`` is appended to ``failures`` and that
        instance plays uniformly at random from then on (its peer object is no longer
        called). The arena never sees the exception. Invalid-value and divide-by-zero
        warnings alone are not failures: they are tallied in ``numeric_warnings`` and quoted
        in the detail of a failure of the same call.

    Peers learn one round at a time: an instance with an unsettled ticket entry cannot be
    selected again (``TicketError``). Contexts are not supported (every peer is context-free).

    An adapter provides ``_load``, ``_make``, ``_choose`` and ``_learn`` (``_probs`` and
    ``_close`` if it can):

    >>> class FirstArm(PeerBatch):
    ...     name, library, exposes_probabilities = "first arm", "none", True
    ...     @classmethod
    ...     def _load(cls):
    ...         return None
    ...     def _make(self, i, seed):
    ...         return None
    ...     def _choose(self, i, u):
    ...         return 0, 1.0
    ...     def _learn(self, i, arm, prob, loss):
    ...         pass
    ...     def _probs(self, i):
    ...         return np.eye(self.n_arms)[0]
    >>> bandit = FirstArm(2, 3, seed=0)
    >>> tickets = bandit.select()
    >>> tickets.arms.tolist(), tickets.probs.tolist()
    ([0, 0], [1.0, 1.0])
    >>> bandit.update(tickets, [0.5, 2.0])
    >>> bandit.n_updates.tolist(), bandit.probabilities()[1].tolist()
    ([1, 1], [1.0, 0.0, 0.0])
    >>> bandit
    <FirstArm 'first arm': 2 instances, 3 arms, 0 failed>
    """

    name: ClassVar[str] = ""
    library: ClassVar[str] = ""  # the distribution to install
    exposes_probabilities: ClassVar[bool] = False

    def __init__(
        self,
        n_instances: int,
        n_arms: int,
        seed: int | None = None,
        loss_range: tuple[float, float] | None = None,
        **params: Any,
    ) -> None:
        self.n_instances = check_int("n_instances", n_instances, 1)
        self.n_arms = check_int("n_arms", n_arms, 1)
        if loss_range is not None:
            lo, hi = (float(x) for x in loss_range)
            if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
                raise ValueError(f"loss_range must be finite (lo, hi) with lo < hi: {loss_range}")
            loss_range = (lo, hi)
        self.loss_range = loss_range
        self.params = params
        self.lib = self.load()
        # instance i's seeds depend on (seed, i) only
        children = np.random.SeedSequence(seed).spawn(self.n_instances)
        self.seeds = [int(c.generate_state(1)[0]) for c in children]
        # the adapter's own draws (u not given): one generator per instance
        self._draws = [np.random.default_rng(c) for c in children]
        self.token = os.urandom(8).hex()
        self.failures: list[Failure] = []
        self.numeric_warnings: dict[str, NumericWarning] = {}
        self.failed = np.zeros(self.n_instances, dtype=bool)
        self.n_rounds = np.zeros(self.n_instances, dtype=np.int64)
        self.n_updates = np.zeros(self.n_instances, dtype=np.int64)
        self._busy = np.zeros(self.n_instances, dtype=bool)
        self._open: dict[int, np.ndarray] = {}
        self._serials = itertools.count(1)
        self.peers = [self._make(i, s, **params) for i, s in enumerate(self.seeds)]

    # -- what each adapter provides

    @classmethod
    def load(cls) -> Any:
        """The peer library (cached); ``ImportError`` naming the install command if missing."""
        try:
            return cls._load()
        except Exception as exc:
            raise ImportError(
                f"{cls.name} needs {cls.library}, which does not import "
                f"({type(exc).__name__}: {exc}); install the peers with {INSTALL_HINT}"
            ) from exc

    @classmethod
    def _load(cls) -> Any:
        raise NotImplementedError

    def _make(self, i: int, seed: int, **params: Any) -> Any:
        raise NotImplementedError

    def _choose(self, i: int, u: float | None) -> tuple[int, float]:
        """(arm, probability of that arm or NaN) from instance i's peer."""
        raise NotImplementedError

    def _learn(self, i: int, arm: int, prob: float, loss: float) -> None:
        raise NotImplementedError

    def _probs(self, i: int) -> np.ndarray:
        raise NotImplementedError(f"{self.name} does not expose its selection probabilities")

    def _close(self, peer: Any) -> None:
        """Release a peer's resources (Vowpal Wabbit workspaces)."""

    # -- conversions

    def reward(self, loss: float) -> float:
        """The reward a reward-maximising peer gets for ``loss``."""
        if self.loss_range is None:
            return -loss
        lo, hi = self.loss_range
        return (hi - loss) / (hi - lo)

    def cost(self, loss: float) -> float:
        """The cost a cost-minimising peer gets for ``loss``."""
        if self.loss_range is None:
            return loss
        lo, hi = self.loss_range
        return (loss - lo) / (hi - lo)

    def _draw(self, i: int, u: float | None) -> float:
        return float(self._draws[i].random()) if u is None else u

    def _from_pmf(self, i: int, pmf: np.ndarray, u: float | None) -> int:
        """The smallest arm a with u < pmf[0] + … + pmf[a] (u drawn if not given)."""
        c = np.cumsum(pmf)
        c /= c[-1]
        return min(int(np.searchsorted(c, self._draw(i, u), side="right")), len(pmf) - 1)

    # -- guarded calls

    def _fail(self, i: int, rnd: int, kind: str, detail: str) -> None:
        self.failures.append(Failure(int(i), int(rnd), kind, detail))
        self.failed[i] = True

    def _guard(self, i: int, rnd: int, phase: str, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args), or None after recording a failure of instance i in round rnd."""
        failure = None
        result = None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with np.errstate(over="warn", invalid="warn", divide="warn", under="ignore"):
                    result = fn(*args)
            except PeerFaultError as exc:
                failure = (exc.kind, str(exc))
            except (OverflowError, FloatingPointError) as exc:
                failure = ("overflow", f"{type(exc).__name__}: {exc}")
            except Exception as exc:
                failure = ("exception", f"{type(exc).__name__}: {exc}")
        if caught:
            failure = self._tally(i, rnd, caught, failure)
        if failure is None:
            return result
        self._fail(i, rnd, failure[0], f"{phase}: {failure[1]}")
        return None

    def _tally(
        self, i: int, rnd: int, caught: list[Any], failure: tuple[str, str] | None
    ) -> tuple[str, str] | None:
        """Count numpy's floating-point warnings of one call, pass the others on; an overflow
        warning is a failure, and a failure's detail quotes the numeric warnings."""
        numeric = set()
        for w in caught:
            if issubclass(w.category, RuntimeWarning) and _FP_WARNING.search(str(w.message)):
                numeric.add(str(w.message))
            else:  # other warnings (deprecations…) are passed on, not failures
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        for message in sorted(numeric):
            tally = self.numeric_warnings.setdefault(
                message, NumericWarning(message, int(i), int(rnd))
            )
            tally.calls += 1
        if failure is None and any("overflow" in m for m in numeric):
            failure = ("overflow", "overflow")
        if failure is not None and numeric:
            failure = (failure[0], f"{failure[1]} (numpy warned: {'; '.join(sorted(numeric))})")
        return failure

    # -- the BatchBandit interface

    def _instances(self, instances: Any) -> np.ndarray:
        if instances is None:
            return np.arange(self.n_instances)
        rows = np.atleast_1d(np.asarray(instances))
        if rows.ndim != 1 or not (np.issubdtype(rows.dtype, np.integer) or rows.size == 0):
            raise ValueError(f"instances must be integers, got {instances!r}")
        rows = rows.astype(np.int64)
        bad = np.flatnonzero((rows < 0) | (rows >= self.n_instances))
        if len(bad):
            raise ValueError(f"instances[{bad[0]}] = {rows[bad[0]]} is out of range")
        if len(np.unique(rows)) != len(rows):
            raise ValueError("instances must not repeat within one call")
        return rows

    def _checked_u(self, u: Any, n: int) -> np.ndarray | None:
        if u is None:
            return None
        u = np.asarray(u, dtype=float)
        if u.shape != (n,) or not ((u >= 0.0) & (u < 1.0)).all():
            raise ValueError(f"u must be {n} real numbers in [0, 1), got {u!r}")
        return u

    def _select_one(self, i: int, ui: float | None) -> tuple[int, float]:
        """Instance i's (arm, prob): its peer's, or uniform once the instance has failed."""
        got = None
        if not self.failed[i]:
            got = self._guard(i, self.n_rounds[i], "select", self._choose, i, ui)
            if got is not None and not (0 <= got[0] < self.n_arms):
                self._fail(i, self.n_rounds[i], "exception", f"select: arm {got[0]!r}")
                got = None
        if got is None:  # uniform fallback
            got = (min(int(self._draw(i, ui) * self.n_arms), self.n_arms - 1), 1 / self.n_arms)
        return got

    def select(self, instances: Any = None, contexts: Any = None, u: Any = None) -> TicketBatch:
        """One arm per chosen instance (all by default); ``u`` is used only where the adapter
        draws itself (see the class docstring)."""
        rows = self._instances(instances)
        n = len(rows)
        if contexts is not None:
            raise ValueError(f"{self.name} is context-free: contexts must be None")
        u = self._checked_u(u, n)
        busy = rows[self._busy[rows]]
        if len(busy):
            raise TicketError(
                f"instance {busy[0]} has an unsettled ticket: peers learn one round at a time"
            )
        self.n_rounds[rows] += 1
        arms = np.empty(n, dtype=np.int64)
        probs = np.empty(n)
        for k, i in enumerate(rows.tolist()):
            arms[k], probs[k] = self._select_one(i, None if u is None else float(u[k]))
        serial = next(self._serials)
        self._open[serial] = np.ones(n, dtype=bool)
        self._busy[rows] = True
        return TicketBatch(
            self.token,
            serial,
            rows,
            self.n_rounds[rows].copy(),
            arms,
            probs,
            probs.copy(),
            np.zeros(n, dtype=np.int64),
            instances is None,
        )

    def _take(self, tickets: Any, where: Any) -> np.ndarray:
        if not isinstance(tickets, TicketBatch):
            raise TicketError(f"expected a TicketBatch, got {tickets!r}")
        if tickets.owner != self.token:
            raise TicketError(f"ticket batch belongs to another bandit, not this {self.name}")
        take = where_mask(where, len(tickets))
        if not take.any():
            return take
        still_open = self._open.get(tickets.serial)
        if still_open is None or (take & ~still_open).any():
            raise TicketError(f"ticket batch {tickets.serial} is already settled")
        return take

    def _settle(self, tickets: TicketBatch, take: np.ndarray) -> None:
        if not take.any():
            return
        still_open = self._open[tickets.serial]
        still_open &= ~take
        self._busy[tickets.instances[take]] = False
        if not still_open.any():
            del self._open[tickets.serial]

    def update(self, tickets: TicketBatch, losses: Any, where: Any = None) -> None:
        """Feed each chosen entry's loss (converted to the peer's convention) to its peer."""
        take = self._take(tickets, where)
        values = checked_losses(losses, take)
        for k in np.flatnonzero(take).tolist():
            i = int(tickets.instances[k])
            self.n_updates[i] += 1
            if not self.failed[i]:
                arm, prob, loss = int(tickets.arms[k]), float(tickets.probs[k]), float(values[k])
                self._guard(i, tickets.rounds[k], "update", self._learn, i, arm, prob, loss)
        self._settle(tickets, take)

    def discard(self, tickets: TicketBatch, where: Any = None) -> None:
        """Forget ticket entries without feedback (the peers never hear of them)."""
        self._settle(tickets, self._take(tickets, where))

    def probabilities(self, instances: Any = None, contexts: Any = None) -> np.ndarray:
        """Selection probabilities (n, M) of the chosen instances, uniform for failed ones;
        ``NotImplementedError`` when the peer does not expose them."""
        if not self.exposes_probabilities:
            raise NotImplementedError(f"{self.name} does not expose its selection probabilities")
        if contexts is not None:
            raise ValueError(f"{self.name} is context-free: contexts must be None")
        rows = self._instances(instances)
        out = uniform_probs(len(rows), self.n_arms)
        for k, i in enumerate(rows.tolist()):
            if not self.failed[i]:
                got = self._guard(i, self.n_rounds[i], "probabilities", self._probs, i)
                if got is not None:
                    out[k] = got
        return out

    def failure_rounds(self) -> dict[int, int]:
        """instance -> round of its (first) failure."""
        out: dict[int, int] = {}
        for f in self.failures:
            out.setdefault(f.instance, f.round)
        return out

    def close(self) -> None:
        """Release the peers' resources now (Vowpal Wabbit workspaces; they also finish
        themselves when garbage-collected)."""
        for peer in self.peers:
            with contextlib.suppress(Exception):
                self._close(peer)
        self.peers = []

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.name!r}: {self.n_instances} instances, "
            f"{self.n_arms} arms, {int(self.failed.sum())} failed>"
        )
