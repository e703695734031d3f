"""SMPyBandits' Exp3, Exp3S and TsallisInf behind ``PeerBatch``.

SMPyBandits draws through ``numpy.random``'s legacy functions; the adapters point them at a
private ``RandomState`` per instance around every call (not thread safe), so ``u`` is
ignored. On SciPy >= 1.14 its import needs a shim for ``scipy.special.btdtri``.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np

from arena.peers.base import PeerBatch, check_vector, quiet_import


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
        with quiet_import() as out:
            from SMPyBandits.Policies import Exp3, Exp3S, TsallisInf
    finally:
        if shim:
            del scipy.special.btdtri
    return SimpleNamespace(
        Exp3=Exp3, Exp3S=Exp3S, TsallisInf=TsallisInf, import_log=out.getvalue(), shim=shim
    )


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
        with rng.active(), quiet_import():  # Exp3S prints its tuning; Exp3 permutes the arms
            policy = cls(self.n_arms, **params)
            policy.startGame()
        return SimpleNamespace(policy=policy, rng=rng)

    def _choose(self, i: int, u: float | None) -> tuple[int, float]:
        peer = self.peers[i]
        with peer.rng.active():
            arm = int(peer.policy.choice())
        trusts = np.asarray(peer.policy.trusts, dtype=float)
        check_vector("trusts", trusts, normalised=True)
        return arm, float(trusts[arm])

    def _learn(self, i: int, arm: int, prob: float, loss: float) -> None:
        peer = self.peers[i]
        with peer.rng.active():
            peer.policy.getReward(arm, self.reward(loss))
        check_vector("weights", np.asarray(peer.policy.weights, dtype=float), normalised=False)

    def _probs(self, i: int) -> np.ndarray:
        trusts = np.asarray(self.peers[i].policy.trusts, dtype=float)
        check_vector("trusts", trusts, normalised=True)
        return trusts.copy()


class SMPyExp3(_SMPyBatch):
    """``SMPyBandits.Policies.Exp3`` with its default γ = 0.01 (unbiased estimates).

    Example (needs SMPyBandits)::

        bandit = SMPyExp3(3, 5, seed=0)                 # or SMPyExp3(3, 5, gamma=0.1)
        tickets = bandit.select()
        bandit.update(tickets, losses[tickets.arms])    # reward -loss
        bandit.probabilities()                          # the policies' trusts, (3, 5)
    """

    name = "SMPyBandits Exp3"
    policy = "Exp3"


class SMPyExp3S(_SMPyBatch):
    """``SMPyBandits.Policies.Exp3S`` (Exp3.S of Auer et al. 2002) with its defaults for an
    unknown horizon: γ = √(ln K / K), α = 0.001.

    Example (needs SMPyBandits)::

        bandit = SMPyExp3S(3, 5, seed=0, loss_range=(0.0, 1.0))  # rewards 1 - loss
        tickets = bandit.select()
        bandit.update(tickets, losses[tickets.arms])
    """

    name = "SMPyBandits Exp3S"
    policy = "Exp3S"


class SMPyTsallisInf(_SMPyBatch):
    """``SMPyBandits.Policies.TsallisInf`` (1/2-Tsallis-INF, Zimmert & Seldin), η_t = 1/√t;
    it turns the reward back into a loss 1 - reward.

    Example (needs SMPyBandits)::

        bandit = SMPyTsallisInf(3, 5, seed=0)
        tickets = bandit.select()
        bandit.update(tickets, losses[tickets.arms])
        bandit.numeric_warnings   # its root search warns every round: tallied, not failures
    """

    name = "SMPyBandits TsallisInf"
    policy = "TsallisInf"
