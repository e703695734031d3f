"""Run bandit algorithms side by side on the same loss tables: regret, failures, speed.

Every contender plays N independent instances (one per seed) on an oblivious
``LossTable``; all see the same losses. Regret is the expected loss Σ q_t·l_t (the
realised loss where an algorithm does not expose q) minus the loss of the competitor class
the environment is built for, normalised by D·sqrt(M·T) with D the table's range: the
figure the paper bounds, and one that is the same for any affine transform of the losses.

>>> from arena.lab.environments import bernoulli
>>> env = bernoulli(300, 3, seed=1)
>>> out = play(env, tsi_contenders()[0], n_seeds=4, seed=0)
>>> out.normalised.shape, out.failures
((4,), ())
"""

from __future__ import annotations

import math
import statistics
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np

from arena.lab.baselines import AHB, EpsilonGreedy, Exp3, Exp3IX, Exp3S, ThompsonNIG, TsallisInf
from arena.peers import INSTALL_HINT, PEERS, Failure, available_peers, missing_peers
from flows.tools.loss_table import LossTable
from tsi_core import VARIANTS, Bandit, BatchBandit, Contextual, Fixed, Switching

Build = Callable[[LossTable, int, int], Any]  # (environment, instances, seed) -> policy

TRANSFORMS: tuple[tuple[str, float, float], ...] = (
    ("identity", 1.0, 0.0),
    ("×1000 +1e6", 1000.0, 1e6),
    ("×1e-4 −3", 1e-4, -3.0),
)


@dataclass(frozen=True)
class Contender:
    """An algorithm as the arena runs it.

    ``build(env, n, seed)`` returns a policy with the ``BatchBandit`` calling convention;
    ``knows_range`` marks oracles given the true loss range, ``contextual`` policies
    take the round's context (the others are run as one copy per context); ``variant``
    names tsi's preset.
    """

    name: str
    family: str  # "tsi", "baseline" or "peer"
    build: Build
    knows_range: bool = False
    contextual: bool = False
    variant: str | None = None  # tsi's preset (``tsi_core.VARIANTS``)


#: the two competition classes every tsi variant is run with
TSI_CLASSES = ("fixed", "matched class")


def tsi_name(variant: str, kind: str) -> str:
    """A tsi contender's name: "tsi (fixed)" for the paper's Algorithm 1, "tsi robust
    (matched class)" for a variant.

    >>> tsi_name("paper", "fixed"), tsi_name("robust", "matched class")
    ('tsi (fixed)', 'tsi robust (matched class)')
    """
    return f"tsi ({kind})" if variant == "paper" else f"tsi {variant} ({kind})"


def _tsi_fixed(env: LossTable, n: int, seed: int, variant: str = "paper") -> BatchBandit:
    """tsi competing with fixed arms (no knowledge at all)."""
    return BatchBandit(n, env.shape[1], seed=seed, variant=variant)


def _tsi_matched(env: LossTable, n: int, seed: int, variant: str = "paper") -> BatchBandit:
    """tsi with the competition class the environment is built for."""
    t, m = env.shape
    if env.kind == "contextual":
        competition: Any = Contextual(env.n_contexts)
    elif env.kind == "switching":
        competition = Switching(rate=None, switches=env.n_switches, horizon=t)
    else:
        competition = Fixed()
    return BatchBandit(n, m, competition, seed=seed, variant=variant)


def tsi_contenders(variants: Sequence[str] | None = None) -> list[Contender]:
    """For every preset of ``VARIANTS`` (the paper's first), tsi competing with fixed arms
    and tsi with the matched class: ``[paper fixed, paper matched, v fixed, v matched, …]``.

    >>> [c.name for c in tsi_contenders(["paper", "robust"])]
    ['tsi (fixed)', 'tsi (matched class)', 'tsi robust (fixed)', 'tsi robust (matched class)']
    """
    chosen = list(VARIANTS) if variants is None else list(variants)
    unknown = [v for v in chosen if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variants {unknown}; known: {sorted(VARIANTS)}")
    ordered = sorted(dict.fromkeys(chosen), key=lambda v: v != "paper")  # stable: paper first
    out = []
    for v in ordered:
        out.append(
            Contender(tsi_name(v, "fixed"), "tsi", partial(_tsi_fixed, variant=v), variant=v)
        )
        out.append(
            Contender(
                tsi_name(v, "matched class"),
                "tsi",
                partial(_tsi_matched, variant=v),
                contextual=True,
                variant=v,
            )
        )
    return out


def _true_range(env: LossTable) -> tuple[float, float]:
    return float(env.losses.min()), float(env.losses.max())


def baseline_contenders() -> list[Contender]:
    """The baselines of ``arena.lab.baselines``; only the oracle is told the loss range."""

    def horizon(env: LossTable) -> int:
        return env.shape[0]

    return [
        Contender(
            "EXP3 (oracle)",
            "baseline",
            lambda env, n, seed: Exp3.oracle(
                n, env.shape[1], horizon(env), _true_range(env), seed=seed
            ),
            knows_range=True,
        ),
        Contender(
            "EXP3 (raw)",
            "baseline",
            lambda env, n, seed: Exp3.raw(n, env.shape[1], horizon(env), seed=seed),
        ),
        Contender(
            "EXP3 (running min/max)",
            "baseline",
            lambda env, n, seed: Exp3.running(n, env.shape[1], horizon(env), seed=seed),
        ),
        Contender(
            "EXP3-IX",
            "baseline",
            lambda env, n, seed: Exp3IX(n, env.shape[1], seed, horizon=horizon(env)),
        ),
        Contender(
            "EXP3.S",
            "baseline",
            lambda env, n, seed: Exp3S(
                n, env.shape[1], seed, horizon=horizon(env), switches=max(1, env.n_switches)
            ),
        ),
        Contender(
            "Tsallis-INF", "baseline", lambda env, n, seed: TsallisInf(n, env.shape[1], seed)
        ),
        Contender("AHB", "baseline", lambda env, n, seed: AHB(n, env.shape[1], seed)),
        Contender(
            "ε-greedy (range-free)",
            "baseline",
            lambda env, n, seed: EpsilonGreedy(n, env.shape[1], seed),
        ),
        Contender(
            "Thompson (NIG)",
            "baseline",
            lambda env, n, seed: ThompsonNIG(n, env.shape[1], seed),
        ),
    ]


# the peers the arena runs by default: one per library and algorithm family compared
DEFAULT_PEERS = (
    "river Exp3",
    "SMPyBandits Exp3",
    "SMPyBandits Exp3S",
    "SMPyBandits TsallisInf",
    "VW cb_explore",
    "MABWiser EpsilonGreedy",
)


def peer_contenders(names: Sequence[str] | None = DEFAULT_PEERS) -> list[Contender]:
    """Peer libraries' algorithms (see ``arena.peers``); ``None`` for every adapter.

    A requested peer whose library does not import raises ``RuntimeError`` naming the
    install command: a missing peer is never silently left out of a comparison.
    """
    wanted = [cls.name for cls in PEERS] if names is None else list(names)
    found, missing = available_peers(), missing_peers()
    unknown = [n for n in wanted if n not in found and n not in missing]
    if unknown:
        raise ValueError(f"unknown peers {unknown}; known: {[cls.name for cls in PEERS]}")
    absent = {n: missing[n] for n in wanted if n in missing}
    if absent:
        raise RuntimeError(f"peer libraries do not import: {absent}; run {INSTALL_HINT}")
    return [
        Contender(n, "peer", lambda env, k, seed, cls=found[n]: cls(k, env.shape[1], seed=seed))
        for n in wanted
    ]


# ---------------------------------------------------------------------------- playing
@dataclass(frozen=True)
class Outcome:
    """One contender on one environment, over ``n_seeds`` instances."""

    contender: str
    family: str
    environment: str
    regret: np.ndarray  # per instance, in loss units
    normalised: np.ndarray  # regret / (D·sqrt(M·T))
    curve: np.ndarray  # (checkpoints, instances) regret against the best fixed arm so far
    checkpoints: np.ndarray
    expected: bool  # regret from q·l (True) or from realised losses
    failures: tuple[Failure, ...] = ()
    seconds: float = 0.0
    notes: tuple[str, ...] = ()
    transform: str = "identity"

    @property
    def mean(self) -> float:
        return float(np.mean(self.normalised))

    @property
    def spread(self) -> float:
        """Standard deviation of the normalised regret over instances."""
        return float(np.std(self.normalised, ddof=1)) if len(self.normalised) > 1 else 0.0


class _PerContext:
    """A context-free policy run as one independent copy per context."""

    def __init__(self, make: Callable[[int], Any], n_contexts: int) -> None:
        self.copies = [make(k) for k in range(n_contexts)]

    def probabilities(self, context: int) -> np.ndarray:
        return self.copies[context].probabilities()

    def select(self, context: int) -> Any:
        return self.copies[context].select()

    def update(self, context: int, tickets: Any, losses: np.ndarray) -> None:
        self.copies[context].update(tickets, losses)


class _Single:
    """A policy that sees every round (with its context when it takes one)."""

    def __init__(self, policy: Any, n: int, contextual: bool) -> None:
        self.policy, self.n, self.contextual = policy, n, contextual

    def _ctx(self, context: int | None) -> Any:
        return None if context is None or not self.contextual else np.full(self.n, context)

    def probabilities(self, context: int | None) -> np.ndarray:
        ctx = self._ctx(context)
        return (
            self.policy.probabilities() if ctx is None else self.policy.probabilities(contexts=ctx)
        )

    def select(self, context: int | None) -> Any:
        ctx = self._ctx(context)
        return self.policy.select() if ctx is None else self.policy.select(contexts=ctx)

    def update(self, context: int | None, tickets: Any, losses: np.ndarray) -> None:
        self.policy.update(tickets, losses)


def _player(contender: Contender, env: LossTable, n: int, seed: int) -> tuple[Any, list[Any]]:
    """The object the loop drives, and the underlying policies (for their failure logs)."""
    if env.contexts is not None and not contender.contextual:
        player = _PerContext(
            lambda k: contender.build(env, n, seed * 1_000_003 + k), env.n_contexts
        )
        return player, player.copies
    policy = contender.build(env, n, seed)
    return _Single(policy, n, contender.contextual), [policy]


def play(
    env: LossTable, contender: Contender, n_seeds: int, seed: int, checkpoints: int = 50
) -> Outcome:
    """Run ``contender`` on ``env`` with ``n_seeds`` independent instances."""
    t_rounds, m = env.shape
    floor = float(env.losses.min())
    centred = env.losses - floor  # regret is shift-free; summing centred losses avoids cancellation
    best_arm = int(np.argmin(centred.sum(axis=0)))
    marks = np.unique(np.linspace(1, t_rounds, checkpoints).astype(int))
    player, policies = _player(contender, env, n_seeds, seed)
    total = np.zeros(n_seeds)
    best_so_far = 0.0
    curve = np.zeros((len(marks), n_seeds))
    failures: list[Failure] = []
    expected, k = True, 0
    rows = np.arange(n_seeds)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numerical trouble is detected below, by its result
        for t in range(t_rounds):
            ctx = None if env.contexts is None else int(env.contexts[t])
            q = _probabilities(player, ctx) if expected else None
            if q is None:
                expected = False
            elif not np.isfinite(q).all():
                bad = int(np.flatnonzero(~np.isfinite(q).all(axis=1))[0])
                failures.append(Failure(bad, t + 1, "nan", "non-finite probabilities"))
                q = np.nan_to_num(q, nan=1.0 / m)
            tickets = player.select(ctx)
            arms = np.asarray(tickets.arms)
            player.update(ctx, tickets, env.losses[t, arms])
            total += q @ centred[t] if q is not None and expected else centred[t, arms[rows]]
            best_so_far += centred[t, best_arm]
            if k < len(marks) and t + 1 == marks[k]:
                curve[k] = total - best_so_far
                k += 1
    seconds = time.perf_counter() - start
    for policy in policies:
        for f in getattr(policy, "failures", ()):
            failures.append(Failure(f.instance, f.round, f.kind, f.detail))
    competitor = env.competitor_loss() - t_rounds * floor
    regret = total - competitor
    scale = env.range * math.sqrt(m * t_rounds) if env.range > 0 else 1.0
    return Outcome(
        contender.name,
        contender.family,
        env.name,
        regret,
        regret / scale,
        curve / scale,
        marks,
        expected,
        tuple(sorted(failures, key=lambda f: (f.round, f.instance))),
        seconds,
        _degradation(player, env, ctx_last=None if env.contexts is None else int(env.contexts[-1])),
    )


def _probabilities(player: Any, context: int | None) -> np.ndarray | None:
    try:
        return np.asarray(player.probabilities(context), dtype=float)
    except NotImplementedError:
        return None


def _degradation(player: Any, env: LossTable, ctx_last: int | None) -> tuple[str, ...]:
    """Silent degradation seen in the final distribution: uniform play, or all on one arm."""
    q = _probabilities(player, ctx_last)
    if q is None or env.kind != "fixed":
        return ()
    m = q.shape[1]
    best = int(np.argmin(env.losses.sum(axis=0)))
    notes = []
    if np.abs(q - 1.0 / m).max() < 0.01:
        notes.append("still uniform at the end")
    elif (q.max(axis=1) > 0.99).all() and (q.argmax(axis=1) != best).mean() > 0.5:
        notes.append("collapsed onto a wrong arm")
    return tuple(notes)


# ------------------------------------------------------------------------------ speed
@dataclass(frozen=True)
class Speed:
    contender: str
    n_arms: int
    rounds_per_s: float
    repeats: tuple[float, ...]


def single_instance_speed(
    contender: Contender, n_arms: int, rounds: int, repeats: int = 3, seed: int = 0
) -> Speed:
    """Rounds per second of one instance (select + update), median over ``repeats``.

    tsi's single-instance object (``Bandit``, with the contender's variant) stands for
    tsi; every other contender runs its policy with one instance.
    """
    rng = np.random.default_rng(seed)
    losses = rng.random((rounds, n_arms))
    env = LossTable("speed", losses)
    rates = []
    for r in range(repeats):
        if contender.family == "tsi":
            bandit = Bandit(n_arms, seed=seed + r, variant=contender.variant)
            start = time.perf_counter()
            for t in range(rounds):
                ticket = bandit.select()
                bandit.update(ticket, float(losses[t, ticket.arm]))
        else:
            policy = contender.build(env, 1, seed + r)
            start = time.perf_counter()
            for t in range(rounds):
                tickets = policy.select()
                policy.update(tickets, losses[t, tickets.arms])
        rates.append(rounds / (time.perf_counter() - start))
    return Speed(contender.name, n_arms, statistics.median(rates), tuple(rates))


def merge(outcomes: Sequence[Outcome]) -> Outcome:
    """One outcome from a contender's outcomes on several draws of a family (same rounds):
    their instances side by side, a failure's instance numbered across the draws.

    >>> from arena.lab.environments import bernoulli
    >>> c = tsi_contenders(["paper"])[0]
    >>> both = merge([play(bernoulli(200, 3, s), c, 2, s) for s in (1, 2)])
    >>> both.normalised.shape, both.curve.shape[1]
    ((4,), 4)
    """
    if not outcomes:
        raise ValueError("merge needs at least one outcome, got none")
    first = outcomes[0]
    offsets = np.cumsum([0, *(len(o.normalised) for o in outcomes[:-1])])
    failures = tuple(
        replace(f, instance=f.instance + int(off))
        for o, off in zip(outcomes, offsets, strict=True)
        for f in o.failures
    )
    return replace(
        first,
        regret=np.concatenate([o.regret for o in outcomes]),
        normalised=np.concatenate([o.normalised for o in outcomes]),
        curve=np.concatenate([o.curve for o in outcomes], axis=1),
        expected=all(o.expected for o in outcomes),
        failures=failures,
        seconds=sum(o.seconds for o in outcomes),
        notes=tuple(dict.fromkeys(n for o in outcomes for n in o.notes)),
    )


def run_arena(
    families: Mapping[str, Sequence[LossTable]],
    contenders: Sequence[Contender],
    n_seeds: int,
    seed: int = 0,
    transforms: Sequence[tuple[str, float, float]] = TRANSFORMS,
    progress: Callable[[str], None] | None = None,
) -> list[Outcome]:
    """Every contender on every family: with the raw losses on each of the family's draws
    (``n_seeds`` instances each, algorithm seed ``seed`` + draw index), merged into one
    outcome; under the other transforms on its first draw only (what they show is
    invariance, or its lack, which one draw shows)."""
    outcomes = []
    for family, draws in families.items():
        if not draws:
            raise ValueError(f"family {family!r} has no draws")
        for label, scale, shift in transforms:
            identity = (scale, shift) == (1.0, 0.0)
            for contender in contenders:
                if progress is not None:
                    progress(f"{family} {label}: {contender.name}")
                shown = draws if identity else [draws[0].affine(scale, shift)]
                played = [play(env, contender, n_seeds, seed + k) for k, env in enumerate(shown)]
                outcomes.append(replace(merge(played), environment=family, transform=label))
    return outcomes
