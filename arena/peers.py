"""Peer libraries' bandit algorithms behind the ``BatchBandit`` interface, for the arena.

Each adapter runs N independent instances, one peer object per instance, looping in Python,
and answers the calls the arena makes on ``tsi_core.batch.BatchBandit``:

- ``select(instances=None, contexts=None, u=None) -> TicketBatch``
- ``update(tickets, losses, where=None)`` and ``discard(tickets, where=None)``
- ``probabilities(instances=None, contexts=None) -> (n, M)``, for the peers that expose their
  selection probabilities (``exposes_probabilities``); the others raise ``NotImplementedError``.

Losses and rewards
    The arena hands out losses of any sign and scale. River, SMPyBandits and MABWiser maximise
    rewards and get ``reward = -loss``: what a practitioner does who does not know the range
    of the losses (these libraries assume rewards in [0, 1] or do not say). Constructed with
    ``loss_range=(lo, hi)`` they get the range-aware ``reward = (hi - loss) / (hi - lo)`` in
    [0, 1] instead. Vowpal Wabbit minimises costs and gets ``cost = loss`` (with ``loss_range``:
    ``(loss - lo) / (hi - lo)``).

Randomness
    Every instance gets its own seed (``numpy.random.SeedSequence(seed).spawn``): the same
    ``seed`` gives the same arms, whatever the other instances do. The peers draw arms with
    their own generators, so ``u`` is ignored by river, SMPyBandits and MABWiser (after its
    cold start); it is used where the adapter itself draws from a distribution (Vowpal Wabbit,
    which returns a probability mass function, MABWiser's first round, and the uniform fallback).
    SMPyBandits draws through ``numpy.random``'s legacy functions; the adapter points them at a
    private ``RandomState`` per instance around every call (not thread safe).

Probabilities
    ``TicketBatch.probs`` is the probability the peer assigns to the chosen arm (the one it
    uses for importance weighting), or NaN where the peer does not expose one (MABWiser).
    ``TicketBatch.p`` repeats ``probs``: peers have no separate exploration-free distribution.

Failures are results
    Every peer call runs inside ``np.errstate``/``warnings.catch_warnings``. When a peer raises,
    makes numpy warn of an overflow, or leaves non-finite or collapsed state or probabilities
    (NaN, inf, all weights zero or subnormal, probabilities not summing to one: checked after
    every call),
    a ``Failure`` is appended to ``failures`` and that instance plays uniformly at random from
    then on (its peer object is no longer called). The arena never sees the exception.
    Invalid-value and divide-by-zero warnings alone are not failures (SMPyBandits' TsallisInf
    raises them in its root search every round and cleans up after them): they are tallied in
    ``numeric_warnings`` and quoted in the detail of a failure of the same call.

Peers learn one round at a time: an instance with an unsettled ticket entry cannot be selected
again (``TicketError``). Contexts are not supported (every peer here is context-free).
"""

from __future__ import annotations

import contextlib
import functools
import io
import itertools
import math
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np

from tsi_core.bandit import TicketError
from tsi_core.batch import TicketBatch, checked_losses, where_mask
from tsi_core.validate import check_int

INSTALL_HINT = "pip install -e '.[bench]'"
KINDS = ("exception", "nan", "overflow", "collapse")

_TINY = np.finfo(float).tiny  # weights summing to less have lost their precision (subnormal)
# numpy's floating-point warnings ("overflow encountered in exp", "invalid value encountered
# in divide", "divide by zero encountered in log"); underflow is left at numpy's default (ignored)
_FP_WARNING = re.compile(r"(overflow|invalid value|divide by zero) encountered")


@dataclass(frozen=True)
class Failure:
    """One peer failure: the instance, its round (1-based), the kind and what happened.

    ``kind`` is one of ``KINDS``: "exception" (the peer raised), "nan" (NaN in its state or
    probabilities), "overflow" (numpy warned of an overflow, ``OverflowError``, or infinite
    state), "collapse" (finite but degenerate: all weights zero or subnormal, i.e. without
    precision, or probabilities not summing to one). ``detail`` starts with the phase
    ("select", "update" or "probabilities") and quotes numpy's warnings in the same call.
    """

    instance: int
    round: int
    kind: str
    detail: str


@dataclass
class NumericWarning:
    """A numpy floating-point warning seen in peer calls: its first instance and round, and
    the number of calls that raised it (not failures by themselves unless about overflow)."""

    message: str
    instance: int
    round: int
    calls: int = 0


class PeerFaultError(Exception):
    """Raised by an adapter's own checks on a peer's state; recorded as a ``Failure``."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


# --- importing the libraries -------------------------------------------------------------


@contextlib.contextmanager
def _quiet_import() -> Iterator[io.StringIO]:
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


@functools.cache
def _river() -> Any:
    with _quiet_import():
        from river import bandit
    return bandit


def _btdtri(a: Any, b: Any, p: Any) -> Any:
    """The p-quantile of Beta(a, b): what ``scipy.special.btdtri`` (removed in SciPy 1.14)
    computed, as ``betaincinv``."""
    import scipy.special

    return scipy.special.betaincinv(a, b, p)


@functools.cache
def _smpybandits() -> Any:
    """SMPyBandits' policies. Its ``Policies.Posterior.Beta`` does ``from scipy.special import
    btdtri``, which SciPy >= 1.14 no longer has: the shim above is put into
    ``scipy.special`` for the import only (Beta binds it then) and taken out again. Its import
    prints notes about numba, pykov and tqdm: they are kept in ``import_log``."""
    import scipy.special

    shim = not hasattr(scipy.special, "btdtri")
    if shim:
        scipy.special.btdtri = _btdtri
    try:
        with _quiet_import() as out:
            from SMPyBandits.Policies import Exp3, Exp3S, TsallisInf
    finally:
        if shim:
            del scipy.special.btdtri
    return SimpleNamespace(
        Exp3=Exp3, Exp3S=Exp3S, TsallisInf=TsallisInf, import_log=out.getvalue(), shim=shim
    )


@functools.cache
def _vowpalwabbit() -> Any:
    with _quiet_import():
        from vowpalwabbit import Workspace
    return Workspace


@functools.cache
def _mabwiser() -> Any:
    with _quiet_import():
        from mabwiser.mab import MAB, LearningPolicy
    return SimpleNamespace(MAB=MAB, LearningPolicy=LearningPolicy)


# --- the adapter base ---------------------------------------------------------------------


def _uniform_probs(n: int, m: int) -> np.ndarray:
    return np.full((n, m), 1.0 / m)


def _check_vector(name: str, v: np.ndarray, normalised: bool) -> None:
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
    peer's constructor (see each adapter's ``_make``).
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
        if failure is None:
            return result
        self._fail(i, rnd, failure[0], f"{phase}: {failure[1]}")
        return None

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

    def select(self, instances: Any = None, contexts: Any = None, u: Any = None) -> TicketBatch:
        """One arm per chosen instance (all by default); ``u`` is used only where the adapter
        draws itself (see the module docstring)."""
        rows = self._instances(instances)
        n = len(rows)
        if contexts is not None:
            raise ValueError(f"{self.name} is context-free: contexts must be None")
        if u is not None:
            u = np.asarray(u, dtype=float)
            if u.shape != (n,) or not ((u >= 0.0) & (u < 1.0)).all():
                raise ValueError(f"u must be {n} real numbers in [0, 1), got {u!r}")
        busy = rows[self._busy[rows]]
        if len(busy):
            raise TicketError(
                f"instance {busy[0]} has an unsettled ticket: peers learn one round at a time"
            )
        self.n_rounds[rows] += 1
        arms = np.empty(n, dtype=np.int64)
        probs = np.empty(n)
        for k, i in enumerate(rows.tolist()):
            ui = None if u is None else float(u[k])
            got = None
            if not self.failed[i]:
                got = self._guard(i, self.n_rounds[i], "select", self._choose, i, ui)
                if got is not None and not (0 <= got[0] < self.n_arms):
                    self._fail(i, self.n_rounds[i], "exception", f"select: arm {got[0]!r}")
                    got = None
            if got is None:  # uniform fallback
                got = (min(int(self._draw(i, ui) * self.n_arms), self.n_arms - 1), 1 / self.n_arms)
            arms[k], probs[k] = got
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
        out = _uniform_probs(len(rows), self.n_arms)
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


# --- river -------------------------------------------------------------------------------


class RiverExp3(PeerBatch):
    """``river.bandit.Exp3`` (river 0.26).

    ``pull(arm_ids)`` draws with p = (1 - γ) w / Σw + γ / K (Python's ``random.Random(seed)``);
    ``update(arm, reward)`` multiplies w[arm] by exp(γ · reward / p[arm] / K). Weights are
    never normalised, so reward = -loss shrinks them towards 0: with large losses they
    underflow to 0 and the next ``pull`` divides by zero. river documents no reward range; its
    ``reward_scaler`` only feeds the reward statistic, not the Exp3 weights. ``gamma`` has no
    default in river; 0.1 here (≈ the EXP3 tuning √(K ln K / ((e - 1) T)) for K = 5, T = 500).
    Probabilities come from river's own formula applied to ``_weights`` (private attribute).
    """

    name = "river Exp3"
    library = "river"
    exposes_probabilities = True

    @classmethod
    def _load(cls) -> Any:
        return _river()

    def _make(self, i: int, seed: int, gamma: float = 0.1) -> Any:
        self._arm_ids = list(range(self.n_arms))
        return self.lib.Exp3(gamma=gamma, seed=seed)

    def _weights(self, peer: Any) -> np.ndarray:
        return np.array([peer._weights[a] for a in self._arm_ids], dtype=float)

    def _choose(self, i: int, u: float | None) -> tuple[int, float]:
        peer = self.peers[i]
        arm = peer.pull(self._arm_ids)
        return int(arm), float(peer._probabilities[arm])

    def _learn(self, i: int, arm: int, prob: float, loss: float) -> None:
        peer = self.peers[i]
        peer.update(arm, self.reward(loss))
        _check_vector("weights", self._weights(peer), normalised=False)

    def _probs(self, i: int) -> np.ndarray:
        peer = self.peers[i]
        w = self._weights(peer)
        p = (1 - peer.gamma) * (w / w.sum()) + peer.gamma / self.n_arms
        _check_vector("probabilities", p, normalised=True)
        return p


# --- SMPyBandits -------------------------------------------------------------------------


class _PrivateRandom:
    """Runs SMPyBandits code with a private ``numpy.random.RandomState``.

    SMPyBandits' Exp3 family draws through the module global ``rn`` (``import numpy.random as
    rn``) of the modules that define it; around each call the adapter points those globals at
    the instance's own ``RandomState`` and back (cheaper than swapping numpy's global state
    with get_state/set_state, and numpy's global generator is left alone). Not thread safe.
    """

    def __init__(self, seed: int, modules: list[Any]) -> None:
        self.random = np.random.RandomState(seed)
        self.modules = modules

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        for module in self.modules:
            module.rn = self.random
        try:
            yield
        finally:
            for module in self.modules:
                module.rn = np.random


class _SMPyBatch(PeerBatch):
    """SMPyBandits 0.9.7 policies: ``startGame()``, ``choice()``, ``getReward(arm, reward)``.

    SMPyBandits assumes rewards in [lower, lower + amplitude] = [0, 1] by default. The
    adapters keep the defaults (a practitioner without range knowledge), so reward = -loss is
    outside that interval; with ``loss_range`` the reward is mapped into [0, 1] by the adapter.
    (Passing ``lower``/``amplitude`` instead would not help ``Exp3``: its weight update uses
    the raw reward and only its statistics are normalised.) ``probs`` is ``trusts[arm]``,
    the distribution the policy draws from and importance-weights with; during the first K
    rounds Exp3 and its subclasses play a random permutation of the arms instead.
    """

    library = "SMPyBandits"
    exposes_probabilities = True
    policy: ClassVar[str] = ""

    @classmethod
    def _load(cls) -> Any:
        return _smpybandits()

    def _make(self, i: int, seed: int, **params: Any) -> Any:
        cls = getattr(self.lib, self.policy)
        modules = [sys.modules[c.__module__] for c in cls.__mro__]
        rng = _PrivateRandom(seed, [m for m in modules if getattr(m, "rn", None) is np.random])
        with rng.active(), _quiet_import():  # Exp3S prints its tuning; Exp3 permutes the arms
            policy = cls(self.n_arms, **params)
            policy.startGame()
        return SimpleNamespace(policy=policy, rng=rng)

    def _choose(self, i: int, u: float | None) -> tuple[int, float]:
        peer = self.peers[i]
        with peer.rng.active():
            arm = int(peer.policy.choice())
        trusts = np.asarray(peer.policy.trusts, dtype=float)
        _check_vector("trusts", trusts, normalised=True)
        return arm, float(trusts[arm])

    def _learn(self, i: int, arm: int, prob: float, loss: float) -> None:
        peer = self.peers[i]
        with peer.rng.active():
            peer.policy.getReward(arm, self.reward(loss))
        _check_vector("weights", np.asarray(peer.policy.weights, dtype=float), normalised=False)

    def _probs(self, i: int) -> np.ndarray:
        trusts = np.asarray(self.peers[i].policy.trusts, dtype=float)
        _check_vector("trusts", trusts, normalised=True)
        return trusts.copy()


class SMPyExp3(_SMPyBatch):
    """``SMPyBandits.Policies.Exp3`` with its default γ = 0.01 (unbiased estimates)."""

    name = "SMPyBandits Exp3"
    policy = "Exp3"


class SMPyExp3S(_SMPyBatch):
    """``SMPyBandits.Policies.Exp3S`` (Exp3.S of Auer et al. 2002) with its defaults for an
    unknown horizon: γ = √(ln K / K), α = 0.001."""

    name = "SMPyBandits Exp3S"
    policy = "Exp3S"


class SMPyTsallisInf(_SMPyBatch):
    """``SMPyBandits.Policies.TsallisInf`` (1/2-Tsallis-INF, Zimmert & Seldin), η_t = 1/√t;
    it turns the reward back into a loss 1 - reward."""

    name = "SMPyBandits TsallisInf"
    policy = "TsallisInf"


# --- Vowpal Wabbit -----------------------------------------------------------------------


class VWCbExplore(PeerBatch):
    """Vowpal Wabbit ``--cb_explore M`` (default exploration: ε-greedy, ε = 0.05) with one
    constant feature. ``predict`` returns a probability mass function; the adapter draws the
    arm from it with ``u`` (or its per-instance generator) and learns with the label
    ``action:cost:probability`` (1-based action), cost = loss. ``args`` adds VW options.

    Memory: VW's default 18-bit weight table costs about 9 MiB per instance (``cb_explore``;
    about 3 MiB for ``cb_explore_adf``). ``args="-b 12"`` gave the same arms on the 5-arm
    tables of the tests with about 70 KiB per instance (``-b 8`` did not).
    """

    name = "VW cb_explore"
    library = "vowpalwabbit"
    exposes_probabilities = True

    @classmethod
    def _load(cls) -> Any:
        return _vowpalwabbit()

    def _options(self, seed: int, args: str) -> str:
        return f"--cb_explore {self.n_arms} --quiet --random_seed {seed} {args}".strip()

    def _make(self, i: int, seed: int, args: str = "") -> Any:
        return self.lib(self._options(seed, args))

    def _example(self, label: tuple[int, float, float] | None = None) -> Any:
        if label is None:
            return "| c"
        arm, cost, prob = label
        return f"{arm + 1}:{cost!r}:{prob!r} | c"

    def _pmf(self, i: int) -> np.ndarray:
        pmf = np.asarray(self.peers[i].predict(self._example()), dtype=float)
        if pmf.shape != (self.n_arms,):
            raise PeerFaultError("collapse", f"pmf has shape {pmf.shape}, not ({self.n_arms},)")
        _check_vector("pmf", pmf, normalised=False)
        if abs(pmf.sum() - 1.0) > 1e-4:  # VW computes in float32
            raise PeerFaultError("collapse", f"pmf sums to {pmf.sum()!r}: {pmf.tolist()}")
        return pmf / pmf.sum()

    def _choose(self, i: int, u: float | None) -> tuple[int, float]:
        pmf = self._pmf(i)
        arm = self._from_pmf(i, pmf, u)
        return arm, float(pmf[arm])

    def _learn(self, i: int, arm: int, prob: float, loss: float) -> None:
        self.peers[i].learn(self._example((arm, self.cost(loss), prob)))

    def _probs(self, i: int) -> np.ndarray:
        return self._pmf(i)

    def _close(self, peer: Any) -> None:
        peer.finish()


class VWCbExploreADF(VWCbExplore):
    """Vowpal Wabbit ``--cb_explore_adf`` (action-dependent features, ε = 0.05): a shared
    constant feature and one indicator feature per action; label ``0:cost:probability`` on
    the chosen action's line."""

    name = "VW cb_explore_adf"

    def _options(self, seed: int, args: str) -> str:
        return f"--cb_explore_adf --quiet --random_seed {seed} {args}".strip()

    def _example(self, label: tuple[int, float, float] | None = None) -> Any:
        lines = ["shared |s c"] + [f"|a a{k}" for k in range(self.n_arms)]
        if label is not None:
            arm, cost, prob = label
            lines[arm + 1] = f"0:{cost!r}:{prob!r} {lines[arm + 1]}"
        return lines


# --- MABWiser ----------------------------------------------------------------------------


class _MABWiserBatch(PeerBatch):
    """MABWiser 2.7 ``MAB(arms, learning_policy, seed=…)``, adapted round by round with
    ``partial_fit(decisions=[arm], rewards=[reward])`` and ``predict()``.

    MABWiser is batch-fit oriented: it refuses to ``predict`` before any fit, so an instance's
    first arm is drawn uniformly by the adapter (from ``u`` or its generator). It exposes no
    selection probabilities (``probs`` is NaN, ``probabilities()`` raises). Health checks read
    the private ``_imp.arm_to_expectation``. It documents no reward range; untried arms have
    expectation 0, so with reward = -loss every untried arm looks better than any tried one.
    """

    library = "mabwiser"

    @classmethod
    def _load(cls) -> Any:
        return _mabwiser()

    def _policy(self, **params: Any) -> Any:
        raise NotImplementedError

    def _make(self, i: int, seed: int, **params: Any) -> Any:
        mab = self.lib.MAB(
            arms=list(range(self.n_arms)), learning_policy=self._policy(**params), seed=seed
        )
        return SimpleNamespace(mab=mab, fitted=False)

    def _choose(self, i: int, u: float | None) -> tuple[int, float]:
        peer = self.peers[i]
        if not peer.fitted:
            return min(int(self._draw(i, u) * self.n_arms), self.n_arms - 1), 1 / self.n_arms
        return int(peer.mab.predict()), math.nan

    def _learn(self, i: int, arm: int, prob: float, loss: float) -> None:
        peer = self.peers[i]
        peer.mab.partial_fit(decisions=[arm], rewards=[self.reward(loss)])
        peer.fitted = True
        values = np.array(list(peer.mab._imp.arm_to_expectation.values()), dtype=float)
        if not np.isfinite(values).all():
            kind = "nan" if np.isnan(values).any() else "overflow"
            raise PeerFaultError(kind, f"arm expectations are not finite: {values.tolist()}")


class MABWiserSoftmax(_MABWiserBatch):
    """``LearningPolicy.Softmax(tau=1)``: the closest MABWiser has to exponential weights
    (Boltzmann exploration on empirical mean rewards, a stochastic-bandit heuristic, not EXP3:
    ``predict`` takes the argmax of a Dirichlet draw around the softmax)."""

    name = "MABWiser Softmax"

    def _policy(self, tau: float = 1.0) -> Any:
        return self.lib.LearningPolicy.Softmax(tau=tau)


class MABWiserEpsilonGreedy(_MABWiserBatch):
    """``LearningPolicy.EpsilonGreedy(epsilon=0.1)``."""

    name = "MABWiser EpsilonGreedy"

    def _policy(self, epsilon: float = 0.1) -> Any:
        return self.lib.LearningPolicy.EpsilonGreedy(epsilon=epsilon)


class MABWiserUCB1(_MABWiserBatch):
    """``LearningPolicy.UCB1(alpha=1)``: mean + α √(2 ln N / n); the bonus does not scale
    with the rewards."""

    name = "MABWiser UCB1"

    def _policy(self, alpha: float = 1.0) -> Any:
        return self.lib.LearningPolicy.UCB1(alpha=alpha)


# --- registry ----------------------------------------------------------------------------

PEERS: tuple[type[PeerBatch], ...] = (
    RiverExp3,
    SMPyExp3,
    SMPyExp3S,
    SMPyTsallisInf,
    VWCbExplore,
    VWCbExploreADF,
    MABWiserSoftmax,
    MABWiserEpsilonGreedy,
    MABWiserUCB1,
)


def _import_errors() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for cls in PEERS:
        try:
            cls._load()
            out[cls.name] = None
        except Exception as exc:
            out[cls.name] = f"{type(exc).__name__}: {exc}"
    return out


def available_peers() -> dict[str, type[PeerBatch]]:
    """name -> adapter class, for the peers whose library imports."""
    errors = _import_errors()
    return {cls.name: cls for cls in PEERS if errors[cls.name] is None}


def missing_peers() -> dict[str, str]:
    """name -> import error text, for the peers whose library does not import."""
    return {name: err for name, err in _import_errors().items() if err is not None}
