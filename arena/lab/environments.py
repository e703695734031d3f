"""Oblivious loss environments, reproducible by seed, for running many bandits on one table.

Each constructor returns a ``flows.tools.loss_table.LossTable`` (the table, its contexts,
its exact competitors) built for one competitor class.

>>> env = bernoulli(1000, n_arms=3, seed=0)
>>> env.shape, env.kind, env.range
((1000, 3), 'fixed', 1.0)
>>> big = env.affine(1000.0, 1e6)
>>> big.name
'bernoulli ×1000 +1e6'
>>> bool(np.isclose(big.best_fixed_loss(), 1000 * env.best_fixed_loss() + 1000 * 1e6))
True
>>> env.best_switching_loss(3) <= env.best_fixed_loss()
True
>>> [e.name for e in suite(500, seed=1)]  # doctest: +NORMALIZE_WHITESPACE
['bernoulli', 'gaussian', 'heavy_tailed', 'piecewise_stationary', 'ftl_breaker',
 'contextual', 'outlier']
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from flows.tools.loss_table import LossTable
from tsi_core.validate import check_int, check_int_vector, check_real

__all__ = [
    "bernoulli",
    "close_contextual",
    "contextual",
    "delayed_switch",
    "ftl_breaker",
    "gaussian",
    "heavy_tailed",
    "one_arm_spikes",
    "outlier",
    "piecewise_stationary",
    "scale_jump",
    "spiky",
    "suite",
    "suite_seeds",
    "supervised",
]

_REAL = (int, float, np.integer, np.floating)


# --------------------------------------------------------------------------- validation


def _means(values: Any, n_arms: int, low: float, high: float) -> np.ndarray:
    """``n_arms`` finite means in [low, high]."""
    try:
        arr = np.array(values, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"means must be {n_arms} real numbers, got {values!r}") from exc
    if arr.shape != (n_arms,):
        raise ValueError(f"means must be {n_arms} real numbers (n_arms), got shape {arr.shape}")
    bad = np.flatnonzero(~((arr >= low) & (arr <= high)))
    if len(bad):
        raise ValueError(f"means[{bad[0]}] = {arr[bad[0]]!r} is outside [{low}, {high}]")
    return arr


def _common(n_rounds: Any, n_arms: Any, seed: Any, min_arms: int = 2) -> tuple[int, int, int]:
    return (
        check_int("n_rounds", n_rounds, 1),
        check_int("n_arms", n_arms, min_arms),
        check_int("seed", seed, 0),
    )


def _default_means(rng: np.random.Generator, n_arms: int) -> np.ndarray:
    """Best arm 0.3, the others evenly in [0.5, 0.8], in an order drawn from ``rng``."""
    means = np.concatenate(([0.3], np.linspace(0.5, 0.8, n_arms - 1)))
    return rng.permutation(means)


# --------------------------------------------------------------------------- constructors


def bernoulli(n_rounds: int, n_arms: int = 10, seed: int = 0, means: Any = None) -> LossTable:
    """Losses in {0, 1}: arm m loses with probability means[m], independently each round.

    Default means: one arm 0.3, the others evenly spaced in [0.5, 0.8], arms shuffled by
    the seed (so the best arm's index varies with the seed). Competitor: best fixed arm.
    """
    n_rounds, n_arms, seed = _common(n_rounds, n_arms, seed)
    rng = np.random.default_rng(seed)
    mu = _default_means(rng, n_arms) if means is None else _means(means, n_arms, 0.0, 1.0)
    return LossTable("bernoulli", (rng.random((n_rounds, n_arms)) < mu).astype(float))


def gaussian(
    n_rounds: int, n_arms: int = 10, seed: int = 0, means: Any = None, sigma: float = 0.5
) -> LossTable:
    """Losses means[m] + sigma·N(0, 1), independent; default means as in ``bernoulli``."""
    n_rounds, n_arms, seed = _common(n_rounds, n_arms, seed)
    sigma = check_real("sigma", sigma, 0.0, math.inf)
    if not math.isfinite(sigma):
        raise ValueError(f"sigma must be finite, got {sigma!r}")
    rng = np.random.default_rng(seed)
    mu = _default_means(rng, n_arms) if means is None else _means(means, n_arms, -1e300, 1e300)
    return LossTable("gaussian", mu + sigma * rng.standard_normal((n_rounds, n_arms)))


def heavy_tailed(
    n_rounds: int,
    n_arms: int = 10,
    seed: int = 0,
    means: Any = None,
    df: float = 2.5,
    noise_scale: float = 0.5,
) -> LossTable:
    """Losses means[m] + noise_scale·t(df): Student-t noise, default df = 2.5.

    With df = 2.5 the noise has a mean (0) and a finite variance but no finite third or
    fourth moment, so rare rounds have losses far outside [0, 1]: the range D is large
    and unknown in advance. ``df`` must exceed 1 so that ``means`` are the true means.
    Default means as in ``bernoulli``.
    """
    n_rounds, n_arms, seed = _common(n_rounds, n_arms, seed)
    df = check_real("df", df, 1.0, math.inf)
    if df <= 1.0 or not math.isfinite(df):
        raise ValueError(f"df must be a finite number > 1, got {df!r}")
    noise_scale = check_real("noise_scale", noise_scale, 0.0, math.inf)
    if not math.isfinite(noise_scale):
        raise ValueError(f"noise_scale must be finite, got {noise_scale!r}")
    rng = np.random.default_rng(seed)
    mu = _default_means(rng, n_arms) if means is None else _means(means, n_arms, -1e300, 1e300)
    noise = rng.standard_t(df, size=(n_rounds, n_arms))
    return LossTable("heavy_tailed", mu + noise_scale * noise)


def outlier(
    n_rounds: int, n_arms: int = 10, seed: int = 0, factor: float = 1e4, at: int | None = None
) -> LossTable:
    """A ``bernoulli`` table with one outlier round: every arm loses max + factor·range.

    Round ``at`` (default n_rounds // 10) is overwritten with hi + factor·(hi − lo) for
    every arm, hi and lo the table's max and min (range 1 if the table is constant). The
    round is the same for every arm, so it changes no regret, but a range estimator that
    keeps the largest loss seen (D, the running min/max) grows ``factor``-fold there and
    keeps that scale for the rest of the run. Competitor: best fixed arm. Note that the
    arena's normaliser D·sqrt(MT) includes the spike: compare contenders by their ratios.

    >>> env = outlier(1000, 3, seed=0)
    >>> env.shape, env.name, float(env.losses[100, 0]), env.range
    ((1000, 3), 'outlier', 10001.0, 10001.0)
    >>> bool((env.losses[np.arange(1000) != 100] <= 1.0).all())
    True
    """
    n_rounds, n_arms, seed = _common(n_rounds, n_arms, seed)
    factor = check_real("factor", factor, 0.0, math.inf)
    if factor <= 0.0 or not math.isfinite(factor):
        raise ValueError(f"factor must be a finite number > 0, got {factor!r}")
    at = n_rounds // 10 if at is None else check_int("at", at, 0, n_rounds - 1)
    losses = np.array(bernoulli(n_rounds, n_arms, seed).losses)
    hi, lo = float(losses.max()), float(losses.min())
    losses[at] = hi + factor * (hi - lo if hi > lo else 1.0)
    return LossTable("outlier", losses)


def piecewise_stationary(
    n_rounds: int,
    n_arms: int = 10,
    n_switches: int = 4,
    seed: int = 0,
    best_mean: float = 0.2,
    other_mean: float = 0.7,
) -> LossTable:
    """Bernoulli losses whose best arm changes exactly ``n_switches`` times.

    Change points are equally spaced: segment k is rounds [e_k, e_{k+1}) with
    e = floor(linspace(0, T, n_switches + 2)). The best arm (mean ``best_mean``, others
    ``other_mean``) of each segment is drawn by the seed, different from the previous
    segment's. Competitor: the best sequence with at most ``n_switches`` switches.
    """
    n_rounds, n_arms, seed = _common(n_rounds, n_arms, seed)
    n_switches = check_int("n_switches", n_switches, 0, n_rounds - 1)
    best_mean = check_real("best_mean", best_mean, 0.0, 1.0)
    other_mean = check_real("other_mean", other_mean, 0.0, 1.0)
    rng = np.random.default_rng(seed)
    best = [int(rng.integers(n_arms))]
    for _ in range(n_switches):  # a different arm: shift by 1..M−1 modulo M
        best.append((best[-1] + int(rng.integers(1, n_arms))) % n_arms)
    edges = np.linspace(0, n_rounds, n_switches + 2).astype(int)
    means = np.full((n_rounds, n_arms), other_mean)
    for k, arm in enumerate(best):
        means[edges[k] : edges[k + 1], arm] = best_mean
    losses = (rng.random((n_rounds, n_arms)) < means).astype(float)
    return LossTable("piecewise_stationary", losses, n_switches=n_switches)


def ftl_breaker(n_rounds: int, n_arms: int = 2, seed: int = 0) -> LossTable:
    """The classic alternating sequence on which follow-the-leader's regret is about T/2.

    Two arms a, b (drawn by the seed): round 0 gives a loss 1/2 and b loss 0; then b, a,
    b, a, … lose 1 in turn while the other loses 0. After round 0 the cumulative losses
    differ by 1/2, so there is never a tie and the leader is always the arm about to lose:
    follow-the-leader loses 1 every round from round 1 on (≥ T − 1 in total, whatever it
    plays in round 0), while the better fixed arm loses at most T/2 + 1/2. Hence FTL's
    regret is ≥ T/2 − 3/2. Any further arms lose 1 every round and are never the leader.
    """
    n_rounds, n_arms, seed = _common(n_rounds, n_arms, seed)
    rng = np.random.default_rng(seed)
    a, b = (int(x) for x in rng.choice(n_arms, size=2, replace=False))
    losses = np.ones((n_rounds, n_arms))
    losses[:, [a, b]] = 0.0
    losses[0, a] = 0.5
    losses[1::2, b] = 1.0
    losses[2::2, a] = 1.0
    return LossTable("ftl_breaker", losses)


def delayed_switch(n_rounds: int, n_arms: int = 10, seed: int = 0, at: float = 0.6) -> LossTable:
    """Bernoulli losses whose best arm turns worst late in the run: a trap for learners
    that settle on a leader (ε-greedy, Thompson sampling on all-time means).

    Arm a has mean 0.3 until round ``at``·T, then 0.8; arm b has 0.6, then 0.2; the others
    0.7 throughout (a, b drawn by the seed). With the default ``at`` = 0.6 arm b is the
    best fixed arm of the whole run (0.44·T against a's 0.5·T). Competitor: best fixed arm.

    >>> env = delayed_switch(1000, 4, seed=0)
    >>> env.shape, env.kind
    ((1000, 4), 'fixed')
    """
    n_rounds, n_arms, seed = _common(n_rounds, n_arms, seed)
    at = check_real("at", at, 0.0, 1.0)
    rng = np.random.default_rng(seed)
    a, b = (int(x) for x in rng.choice(n_arms, size=2, replace=False))
    cut = int(at * n_rounds)
    means = np.full((n_rounds, n_arms), 0.7)
    means[:cut, a], means[cut:, a] = 0.3, 0.8
    means[:cut, b], means[cut:, b] = 0.6, 0.2
    return LossTable("delayed_switch", (rng.random((n_rounds, n_arms)) < means).astype(float))


def spiky(
    n_rounds: int, n_arms: int = 10, seed: int = 0, rate: float = 0.01, height: float = 50.0
) -> LossTable:
    """A ``bernoulli`` table where each (round, arm) loses ``height`` more with probability
    ``rate``: rare, arm-specific spikes 50 ranges high that move the empirical means (and
    any running range) of whichever arm they hit. Competitor: best fixed arm.

    >>> env = spiky(1000, 3, seed=0)
    >>> bool(env.losses.max() > 50.0), env.kind
    (True, 'fixed')
    """
    n_rounds, n_arms, seed = _common(n_rounds, n_arms, seed)
    rate = check_real("rate", rate, 0.0, 1.0)
    height = check_real("height", height, 0.0, 1e300)
    losses = np.array(bernoulli(n_rounds, n_arms, seed).losses)
    rng = np.random.default_rng([seed, 1])
    losses += height * (rng.random(losses.shape) < rate)
    return LossTable("spiky", losses)


def one_arm_spikes(
    n_rounds: int,
    n_arms: int = 2,
    seed: int = 0,
    rate: float = 0.1,
    height: float = 30.0,
    other: float = 1.0,
) -> LossTable:
    """One arm (drawn by the seed) loses ``height`` with probability ``rate``, else 0; every
    other arm always loses ``other``. The spiking arm's mean is rate·height: a learner that
    treats its rare large losses as outliers takes it for the best arm whatever its mean.
    Competitor: best fixed arm.

    >>> env = one_arm_spikes(1000, seed=0)
    >>> sorted(np.unique(env.losses).tolist()), env.kind
    ([0.0, 1.0, 30.0], 'fixed')
    """
    n_rounds, n_arms, seed = _common(n_rounds, n_arms, seed)
    rate = check_real("rate", rate, 0.0, 1.0)
    height = check_real("height", height, 0.0, 1e300)
    other = check_real("other", other, -1e300, 1e300)
    rng = np.random.default_rng(seed)
    spiking = int(rng.integers(n_arms))
    losses = np.full((n_rounds, n_arms), other)
    losses[:, spiking] = height * (rng.random(n_rounds) < rate)
    return LossTable("one_arm_spikes", losses)


def scale_jump(
    n_rounds: int, n_arms: int = 8, seed: int = 0, factor: float = 100.0, at: float = 0.5
) -> LossTable:
    """Two regimes of Gaussian losses (means uniform in [0, 1], σ = 0.3, drawn per regime,
    so the best arm usually changes); from round ``at``·T on every loss is ``factor``
    times larger. A scale learned in the first regime is wrong by ``factor`` in the
    second. Competitor: best fixed arm (in practice the second regime's best).

    >>> env = scale_jump(1000, 4, seed=0)
    >>> bool(abs(env.losses[500:]).mean() > 20 * abs(env.losses[:500]).mean()), env.kind
    (True, 'fixed')
    """
    n_rounds, n_arms, seed = _common(n_rounds, n_arms, seed)
    factor = check_real("factor", factor, 0.0, 1e300)
    if factor <= 0.0:
        raise ValueError(f"factor must be a number > 0, got {factor!r}")
    at = check_real("at", at, 0.0, 1.0)
    rng = np.random.default_rng(seed)
    cut = int(at * n_rounds)
    means = np.empty((n_rounds, n_arms))
    means[:cut], means[cut:] = rng.random(n_arms), rng.random(n_arms)
    losses = means + 0.3 * rng.standard_normal((n_rounds, n_arms))
    losses[cut:] *= factor
    return LossTable("scale_jump", losses)


def close_contextual(
    n_rounds: int, n_arms: int = 10, n_contexts: int = 4, seed: int = 0, gap: float = 0.05
) -> LossTable:
    """``contextual`` with close arms: each context's best arm has mean 0.5, the others
    means uniform in [0.5 + ``gap``, 0.5 + 3·``gap``]. Competitor: best map context → arm.

    >>> env = close_contextual(1000, 4, 2, seed=0)
    >>> env.kind, env.n_contexts
    ('contextual', 2)
    """
    n_rounds, n_arms, seed = _common(n_rounds, n_arms, seed)
    n_contexts = check_int("n_contexts", n_contexts, 1)
    gap = check_real("gap", gap, 0.0, 1.0 / 6.0)
    rng = np.random.default_rng(seed)
    means = rng.uniform(0.5 + gap, 0.5 + 3.0 * gap, size=(n_contexts, n_arms))
    order = rng.permutation(n_arms)
    means[np.arange(n_contexts), order[np.arange(n_contexts) % n_arms]] = 0.5
    ctx = rng.integers(n_contexts, size=n_rounds)
    losses = (rng.random((n_rounds, n_arms)) < means[ctx]).astype(float)
    return LossTable("close_contextual", losses, ctx, n_contexts)


def follow_the_leader_loss(losses: np.ndarray) -> float:
    """The loss of follow-the-leader (the arm with the least cumulative loss so far, ties
    to the lowest index) on a T×M table: the reference ``ftl_breaker`` defeats.

    >>> follow_the_leader_loss(ftl_breaker(10).losses) >= 9
    True
    """
    table = np.asarray(losses, dtype=float)
    totals, loss = np.zeros(table.shape[1]), 0.0
    for row in table:
        loss += row[int(np.argmin(totals))]
        totals += row
    return float(loss)


def contextual(n_rounds: int, n_arms: int = 10, n_contexts: int = 4, seed: int = 0) -> LossTable:
    """Bernoulli losses whose means depend on (context, arm); contexts uniform each round.

    Each context has its own best arm (mean 0.2; distinct across contexts while
    n_contexts ≤ n_arms); the other arms' means are drawn uniformly in [0.5, 0.9] per
    (context, arm). Competitor: the best map context → arm.
    """
    n_rounds, n_arms, seed = _common(n_rounds, n_arms, seed)
    n_contexts = check_int("n_contexts", n_contexts, 1)
    rng = np.random.default_rng(seed)
    means = rng.uniform(0.5, 0.9, size=(n_contexts, n_arms))
    order = rng.permutation(n_arms)
    means[np.arange(n_contexts), order[np.arange(n_contexts) % n_arms]] = 0.2
    ctx = rng.integers(n_contexts, size=n_rounds)
    losses = (rng.random((n_rounds, n_arms)) < means[ctx]).astype(float)
    return LossTable("contextual", losses, ctx, n_contexts)


def supervised(
    labels: Any,
    n_rounds: int | None = None,
    seed: int = 0,
    contexts: Any = None,
    name: str = "supervised",
    n_classes: int | None = None,
) -> LossTable:
    """Bandit feedback from a labelled data set: arm = predicted class, loss 0 iff correct.

    ``labels`` are the samples' classes (integers ≥ 0); M = ``n_classes`` (default
    max label + 1, at least 2). The rounds visit the samples in a seeded random order;
    when ``n_rounds`` exceeds the number of samples (default: one pass) further independent
    permutations follow. ``contexts`` (optional, one integer ≥ 0 per sample, e.g. a cluster
    id the caller computed from the features) travel with their samples; the competitor
    is then the best map context → arm, else the best fixed arm (the majority class).
    """
    labels = check_int_vector("labels", labels, None, 0, math.inf)
    n_samples = len(labels)
    if n_samples == 0:
        raise ValueError("labels must not be empty, got 0 samples")
    if n_classes is None:
        n_classes = max(2, int(labels.max()) + 1)
    n_classes = check_int("n_classes", n_classes, 2)
    if labels.max() >= n_classes:
        raise ValueError(f"label {int(labels.max())} is not below n_classes = {n_classes}")
    n_rounds = n_samples if n_rounds is None else check_int("n_rounds", n_rounds, 1)
    seed = check_int("seed", seed, 0)
    if not isinstance(name, str):
        raise ValueError(f"name must be a string, got {name!r}")
    ctx = (
        None if contexts is None else check_int_vector("contexts", contexts, n_samples, 0, math.inf)
    )
    rng = np.random.default_rng(seed)
    passes = -(-n_rounds // n_samples)
    order = np.concatenate([rng.permutation(n_samples) for _ in range(passes)])[:n_rounds]
    losses = np.ones((n_rounds, n_classes))
    losses[np.arange(n_rounds), labels[order]] = 0.0
    if ctx is None:
        return LossTable(name, losses)
    return LossTable(name, losses, ctx[order], int(ctx.max()) + 1)


def suite_seeds(seed: int = 0) -> list[int]:
    """The table seeds ``suite(n_rounds, seed)`` gives its seven environments, in order.

    >>> suite_seeds(0) == suite_seeds(0) != suite_seeds(1)
    True
    """
    seed = check_int("seed", seed, 0)
    return [int(np.random.SeedSequence([seed, k]).generate_state(1)[0]) for k in range(7)]


def suite(n_rounds: int, seed: int = 0) -> list[LossTable]:
    """The arena's standard environments (all but ``supervised``, which needs data).

    M = 10 arms except ``ftl_breaker`` (2); ``piecewise_stationary`` switches
    min(4, T − 1) times; ``contextual`` has 4 contexts; ``outlier`` has its spike at
    round T // 10, 10^4 ranges above the rest. Each environment gets its own seed derived
    from ``seed``.
    """
    n_rounds = check_int("n_rounds", n_rounds, 1)
    seeds = suite_seeds(seed)
    return [
        bernoulli(n_rounds, 10, seeds[0]),
        gaussian(n_rounds, 10, seeds[1]),
        heavy_tailed(n_rounds, 10, seeds[2]),
        piecewise_stationary(n_rounds, 10, min(4, n_rounds - 1), seeds[3]),
        ftl_breaker(n_rounds, 2, seeds[4]),
        contextual(n_rounds, 10, 4, seeds[5]),
        outlier(n_rounds, 10, seeds[6]),
    ]
