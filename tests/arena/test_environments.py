"""Oblivious loss environments: reproducible, exact competitors, affine-equivariant."""

import itertools

import numpy as np
import pytest

from arena.lab.environments import (
    bernoulli,
    contextual,
    follow_the_leader_loss,
    ftl_breaker,
    gaussian,
    heavy_tailed,
    outlier,
    piecewise_stationary,
    suite,
    supervised,
)
from flows.tools.loss_table import LossTable

T = 600
CONSTRUCTORS = {
    "bernoulli": lambda seed: bernoulli(T, 5, seed),
    "gaussian": lambda seed: gaussian(T, 5, seed),
    "heavy_tailed": lambda seed: heavy_tailed(T, 5, seed),
    "piecewise_stationary": lambda seed: piecewise_stationary(T, 5, 3, seed),
    "ftl_breaker": lambda seed: ftl_breaker(T, 4, seed),
    "contextual": lambda seed: contextual(T, 5, 3, seed),
    "outlier": lambda seed: outlier(T, 5, seed),
    "supervised": lambda seed: supervised(np.arange(T) % 7, seed=seed),
}


def brute_force_switching(losses, n_switches):
    """Enumerate every arm sequence with at most n_switches switches."""
    t, m = losses.shape
    best = np.inf
    for seq in itertools.product(range(m), repeat=t):
        if sum(a != b for a, b in itertools.pairwise(seq)) <= n_switches:
            best = min(best, losses[np.arange(t), list(seq)].sum())
    return best


# --------------------------------------------------------------------------- reproducibility


@pytest.mark.parametrize("kind", CONSTRUCTORS)
def test_same_seed_same_table_and_different_seed_different_table(kind):
    make = CONSTRUCTORS[kind]
    a, b, c = make(3), make(3), make(4)
    assert np.array_equal(a.losses, b.losses)
    assert (a.contexts is None) == (b.contexts is None)
    if a.contexts is not None:
        assert np.array_equal(a.contexts, b.contexts)
    differs = not np.array_equal(a.losses, c.losses)
    if a.contexts is not None:
        differs = differs or not np.array_equal(a.contexts, c.contexts)
    assert differs


@pytest.mark.parametrize("kind", CONSTRUCTORS)
def test_shapes_dtypes_and_read_only_arrays(kind):
    env = CONSTRUCTORS[kind](0)
    t, m = env.shape
    assert t == T and env.losses.shape == (t, m) and env.losses.dtype == np.float64
    assert np.isfinite(env.losses).all()
    assert env.range == pytest.approx(env.losses.max() - env.losses.min())
    with pytest.raises(ValueError):
        env.losses[0, 0] = 1.0
    if env.contexts is None:
        assert env.n_contexts == 1
    else:
        assert env.contexts.shape == (t,) and np.issubdtype(env.contexts.dtype, np.integer)
        assert env.contexts.min() >= 0 and env.contexts.max() < env.n_contexts


def test_suite_has_distinct_names_and_ten_arms_where_sensible():
    envs = suite(300, seed=5)
    names = [e.name for e in envs]
    assert len(set(names)) == len(names) == 7
    assert all(e.shape[0] == 300 for e in envs)
    assert [e.shape[1] for e in envs if e.name != "ftl_breaker"] == [10] * 6
    assert {e.kind for e in envs} == {"fixed", "switching", "contextual"}
    other = suite(300, seed=6)  # (ftl_breaker on 2 arms has only two variants)
    pairs = [(a, b) for a, b in zip(envs, other, strict=True) if a.name != "ftl_breaker"]
    assert all(not np.array_equal(a.losses, b.losses) for a, b in pairs)


# --------------------------------------------------------------------------- affine


@pytest.mark.parametrize("kind", CONSTRUCTORS)
@pytest.mark.parametrize("scale, shift", [(1000.0, 1e6), (1e-7, -3.5), (3.0, 0.0)])
def test_affine_transforms_losses_and_every_competitor(kind, scale, shift):
    env = CONSTRUCTORS[kind](1)
    moved = env.affine(scale, shift)
    assert np.array_equal(moved.losses, scale * env.losses + shift)
    assert moved.range == pytest.approx(scale * env.range, rel=1e-9)
    assert moved.kind == env.kind and moved.n_switches == env.n_switches
    assert env.name in moved.name and moved.name != env.name
    t = env.shape[0]
    # the absolute error is a few ulps of the largest partial sum, T·max|loss|
    tol = 1e-12 * t * np.abs(moved.losses).max()
    for f in ("best_fixed_loss", "best_contextual_loss", "competitor_loss"):
        expect = scale * getattr(env, f)() + t * shift
        assert getattr(moved, f)() == pytest.approx(expect, abs=tol)
    for s in (1, 5):
        expect = scale * env.best_switching_loss(s) + t * shift
        assert moved.best_switching_loss(s) == pytest.approx(expect, abs=tol)


def test_affine_name_records_the_transform():
    env = bernoulli(50, 3, 0)
    assert env.affine(1000.0, 1e6).name == "bernoulli ×1000 +1e6"
    assert env.affine(0.5, -2.0).name == "bernoulli ×0.5 -2"


@pytest.mark.parametrize(
    "scale, shift, word",
    [
        (0.0, 0.0, "0.0"),
        (-1.0, 0.0, "-1.0"),
        (float("nan"), 0.0, "nan"),
        (float("inf"), 0.0, "inf"),
        (1.0, float("inf"), "inf"),
        (1.0, float("nan"), "nan"),
        (True, 0.0, "True"),
        (1e308, 1e308, "overflow"),
    ],
)
def test_affine_refuses_bad_scale_or_shift(scale, shift, word):
    with pytest.raises(ValueError, match=word):
        bernoulli(20, 2, 0).affine(scale, shift)


# --------------------------------------------------------------------------- competitors


@pytest.mark.parametrize("trial", range(12))
def test_best_switching_loss_equals_brute_force(trial):
    rng = np.random.default_rng(trial)
    t, m = int(rng.integers(1, 9)), int(rng.integers(1, 4))
    losses = rng.normal(size=(t, m)) * 10.0 ** rng.integers(-3, 4)
    if trial % 3 == 0:
        losses = np.round(losses)  # ties
    env = LossTable("random", losses)
    for s in range(4):
        assert env.best_switching_loss(s) == pytest.approx(
            brute_force_switching(losses, s), rel=1e-12, abs=1e-12
        )


@pytest.mark.parametrize("kind", CONSTRUCTORS)
def test_best_switching_loss_starts_at_best_fixed_and_never_increases(kind):
    env = CONSTRUCTORS[kind](2)
    values = [env.best_switching_loss(s) for s in range(8)]
    assert values[0] == env.best_fixed_loss()
    tol = 1e-12 * env.shape[0] * np.abs(env.losses).max()
    assert all(b <= a + tol for a, b in itertools.pairwise(values))
    assert env.best_switching_loss(env.shape[0]) == pytest.approx(
        env.losses.min(axis=1).sum(), abs=tol
    )


def test_best_switching_loss_is_exact_not_equal_segments():
    # the best arm changes at rounds 1 and 4 of 9: equal thirds would miss both
    losses = np.ones((9, 2))
    losses[[0, 4, 5, 6, 7, 8], 0] = 0.0
    losses[[1, 2, 3], 1] = 0.0
    env = LossTable("uneven", losses)
    assert env.best_switching_loss(2) == 0.0
    assert env.best_switching_loss(1) == 1.0
    assert env.best_fixed_loss() == 3.0


@pytest.mark.parametrize("seed", range(4))
def test_best_contextual_loss_at_most_fixed_equal_with_one_context(seed):
    env = contextual(2000, 6, 5, seed)
    assert env.kind == "contextual"
    assert env.competitor_loss() == env.best_contextual_loss()
    assert env.best_contextual_loss() < env.best_fixed_loss() - 0.05 * 2000
    one = contextual(2000, 6, 1, seed)
    assert one.best_contextual_loss() == pytest.approx(one.best_fixed_loss(), abs=1e-9)
    # a hand-made check: the per-context best arms
    for c in range(env.n_contexts):
        rows = env.losses[env.contexts == c]
        assert rows.sum(axis=0).min() <= rows.sum(axis=0).mean()


def test_best_contextual_loss_by_hand():
    losses = np.array([[0.0, 1.0], [1.0, 0.0], [0.0, 2.0], [3.0, 0.5]])
    env = LossTable("hand", losses, np.array([0, 1, 0, 1]), 2)
    assert env.best_contextual_loss() == 0.5
    assert env.best_fixed_loss() == 3.5
    assert LossTable("hand", losses).best_contextual_loss() == 3.5


# --------------------------------------------------------------------------- constructors


@pytest.mark.parametrize("n_arms", [2, 3, 7])
@pytest.mark.parametrize("seed", range(3))
def test_ftl_breaker_gives_follow_the_leader_linear_regret(n_arms, seed):
    n = 1001
    env = ftl_breaker(n, n_arms, seed)
    best = env.best_fixed_loss()
    regret = follow_the_leader_loss(env.losses) - best
    assert regret >= n / 2 - 1.5  # the bound proved in the docstring
    assert regret >= 0.45 * n
    assert best <= n / 2 + 0.5
    moved = env.affine(1e4, -7.0)  # FTL is affine-invariant, so is its regret in units of D
    assert follow_the_leader_loss(moved.losses) - moved.best_fixed_loss() == pytest.approx(
        1e4 * regret, rel=1e-9
    )


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("n_switches", [1, 3, 6])
def test_piecewise_stationary_best_arm_changes_n_switches_times(seed, n_switches):
    n, m = 7000, 5
    env = piecewise_stationary(n, m, n_switches, seed)
    assert env.kind == "switching" and env.n_switches == n_switches
    edges = np.linspace(0, n, n_switches + 2).astype(int)
    best = [int(env.losses[a:b].sum(axis=0).argmin()) for a, b in itertools.pairwise(edges)]
    assert sum(a != b for a, b in itertools.pairwise(best)) == n_switches
    assert env.competitor_loss() == env.best_switching_loss(n_switches)
    assert env.competitor_loss() < env.best_fixed_loss() - 0.1 * n
    assert env.best_switching_loss(n_switches - 1) > env.competitor_loss()


def test_piecewise_stationary_without_switches_is_fixed():
    env = piecewise_stationary(200, 3, 0, 1)
    assert env.kind == "fixed" and env.competitor_loss() == env.best_fixed_loss()


def test_bernoulli_default_best_arm_is_clearly_better_and_moves_with_the_seed():
    best_arms = set()
    for seed in range(6):
        env = bernoulli(4000, 10, seed)
        assert set(np.unique(env.losses)) <= {0.0, 1.0}
        means = np.sort(env.losses.mean(axis=0))
        assert means[1] - means[0] >= 0.1
        best_arms.add(int(env.losses.mean(axis=0).argmin()))
    assert len(best_arms) > 1


def test_given_means_are_respected():
    mu = [0.1, 0.5, 0.9]
    env = bernoulli(20000, 3, 0, means=mu)
    np.testing.assert_allclose(env.losses.mean(axis=0), mu, atol=0.02)
    env = gaussian(20000, 3, 0, means=[5.0, -1.0, 2.0], sigma=2.0)
    np.testing.assert_allclose(env.losses.mean(axis=0), [5.0, -1.0, 2.0], atol=0.1)
    np.testing.assert_allclose(env.losses.std(axis=0), 2.0, rtol=0.05)


def test_heavy_tailed_is_finite_and_heavier_than_gaussian():
    heavy = heavy_tailed(20000, 5, 0)
    light = gaussian(20000, 5, 0, sigma=0.5)
    assert np.isfinite(heavy.losses).all()

    def tail_ratio(env):
        noise = env.losses - env.losses.mean(axis=0)
        return np.abs(noise).max() / noise.std()

    assert tail_ratio(heavy) > 3 * tail_ratio(light)
    assert heavy.range > 5 * light.range


@pytest.mark.parametrize("seed", range(3))
def test_outlier_has_one_spike_row_factor_ranges_above_an_unchanged_bernoulli_table(seed):
    env = outlier(2000, 6, seed)
    base = bernoulli(2000, 6, seed)
    assert env.shape == (2000, 6) and env.kind == "fixed" and env.name == "outlier"
    spikes = np.argwhere(env.losses > 1.0)
    assert sorted({int(t) for t, _ in spikes}) == [200] and len(spikes) == 6  # round T // 10
    assert (env.losses[200] == 1.0 + 1e4).all()  # max + 10^4 · range, every arm
    rest = np.arange(2000) != 200
    assert np.array_equal(env.losses[rest], base.losses[rest])
    assert env.range == pytest.approx(1e4 * base.range + base.range)
    # the same row for every arm: the competitor pays it too, so no regret changes
    assert env.best_fixed_loss() == base.losses[rest].sum(axis=0).min() + 1e4 + 1.0
    moved = outlier(50, 3, seed, factor=7.5, at=0)
    assert (moved.losses[0] == 1.0 + 7.5).all() and (moved.losses[1:] <= 1.0).all()


def test_supervised_loss_is_zero_exactly_at_the_label():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 6, size=50)
    env = supervised(labels, n_rounds=130, seed=3, contexts=labels)
    assert env.shape == (130, 6)
    # contexts travel with their samples, so the context is the label here
    t = np.arange(130)
    assert (env.losses[t, env.contexts] == 0.0).all()
    assert env.losses.sum(axis=1).tolist() == [5.0] * 130
    assert env.competitor_loss() == 0.0 and env.best_fixed_loss() > 0
    # each pass over the data is a permutation of the samples
    plain = supervised(labels, n_rounds=130, seed=3)
    seen = plain.losses.argmin(axis=1)
    assert np.array_equal(seen, env.contexts)
    for a in (0, 50):
        assert sorted(seen[a : a + 50]) == sorted(labels)
    assert plain.contexts is None and plain.kind == "fixed"
    majority = np.bincount(labels).max()
    assert supervised(labels, seed=1).best_fixed_loss() == 50 - majority


def test_supervised_with_cluster_contexts_and_extra_classes():
    labels = np.array([0, 0, 1, 1, 2, 2])
    clusters = np.array([0, 0, 0, 1, 1, 1])
    env = supervised(labels, seed=0, contexts=clusters, n_classes=5, name="toy")
    assert env.name == "toy" and env.shape == (6, 5) and env.n_contexts == 2
    assert env.best_contextual_loss() == 2.0  # each cluster mislabels one sample
    assert env.best_fixed_loss() == 4.0


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "call, word",
    [
        (lambda: bernoulli(0), "n_rounds"),
        (lambda: bernoulli(10, 1), "n_arms"),
        (lambda: bernoulli(10, 3, -1), "seed"),
        (lambda: bernoulli(10, 3, 1.5), "seed"),
        (lambda: bernoulli(10, 2, means=[0.2, 1.5]), "1.5"),
        (lambda: bernoulli(10, 3, means=[0.2, 0.5]), "means"),
        (lambda: gaussian(10, sigma=-1.0), "sigma"),
        (lambda: gaussian(10, means=[np.nan] * 10), "nan"),
        (lambda: heavy_tailed(10, df=1.0), "df"),
        (lambda: heavy_tailed(10, df=float("inf")), "df"),
        (lambda: piecewise_stationary(10, 3, 10, 0), "n_switches"),
        (lambda: piecewise_stationary(10, 3, -1, 0), "n_switches"),
        (lambda: ftl_breaker(10, 1), "n_arms"),
        (lambda: contextual(10, 3, 0), "n_contexts"),
        (lambda: supervised(np.array([0.5, 1.0])), "labels"),
        (lambda: supervised(np.array([0, -2])), "-2"),
        (lambda: supervised(np.array([], dtype=int)), "labels"),
        (lambda: supervised(np.array([0, 3]), n_classes=3), "n_classes"),
        (lambda: supervised(np.array([0, 1]), contexts=np.array([0])), "contexts"),
        (lambda: supervised(np.array([0, 1]), n_rounds=0), "n_rounds"),
        (lambda: LossTable("x", np.array([[0.0, np.inf]])), "inf"),
        (lambda: LossTable("x", np.zeros(3)), "shape"),
        (lambda: LossTable("x", np.zeros((2, 2)), np.array([0, 2]), 2), "contexts"),
        (lambda: LossTable("x", np.zeros((2, 2)), n_contexts=3), "n_contexts"),
        (lambda: LossTable("x", np.zeros((2, 2)), np.array([0, 1]), 2, 1), "n_switches"),
        (lambda: LossTable("x", np.zeros((2, 2))).best_switching_loss(-1), "n_switches"),
        (lambda: suite(0), "n_rounds"),
        (lambda: outlier(10, factor=0.0), "factor"),
        (lambda: outlier(10, factor=float("nan")), "factor"),
        (lambda: outlier(10, at=10), "at"),
        (lambda: outlier(10, at=-1), "at"),
    ],
)
def test_bad_arguments_raise_value_error_naming_the_value(call, word):
    with pytest.raises(ValueError, match=word):
        call()
