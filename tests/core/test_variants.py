"""The algorithm's variants (``tsi_core.variant``): chosen by name, kept in snapshots, refused
with a clear error when malformed, and each change doing what it is for: the growth bound
keeps one outlier from setting the learning rate, the mean baseline keeps the Switching
class's decisions under a map that rounds. Invariance and Bandit ≡ BatchBandit for every
variant: ``test_invariance.py`` and ``test_long_horizon.py``."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arena.lab.environments import bernoulli
from arena.runner import Contender, play
from flows.tools.loss_table import LossTable
from tsi_core import VARIANTS, Bandit, BatchBandit, Switching, Variant, migrate
from tsi_core.variant import DEFAULT_VARIANT, variant_of


def trained(variant, rounds=200, seed=3):
    b = Bandit(3, instance_id="x", variant=variant)
    rng = np.random.default_rng(seed)
    for _ in range(rounds):
        t = b.select(u=float(rng.random()))
        b.update(t, float(1e3 * rng.standard_t(2.0) + 10.0 * t.arm))
    return b


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: variant_of("fast"), "variant must be one of"),
        (lambda: variant_of(3), "got 3"),
        (lambda: Variant("x", baseline="median"), "baseline must be one of"),
        (lambda: Variant("x", adaptive_gamma=1), "adaptive_gamma must be true or false, got 1"),
        (lambda: Variant("x", step_cap=0.0), "step_cap must be a finite number > 0"),
        (lambda: Variant("x", step_cap=math.inf), "got inf"),
        (lambda: Variant("x", growth=0), "growth must be an integer in [1, 64]"),
        (lambda: Variant("x", growth=1.5), "got 1.5"),
        (lambda: Variant("x", gamma_scale=-1.0), "gamma_scale must be a number in"),
        (lambda: Variant(""), "name must be a non-empty string"),
        (lambda: Variant.from_dict({"name": "x", "speed": 2}), "not a variant"),
        (lambda: Bandit(3, variant="exp3"), "'exp3'"),
        (lambda: BatchBandit(2, 3, variant="exp3"), "'exp3'"),
    ],
)
def test_a_bad_variant_is_refused_naming_the_value(make, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        make()


def test_the_default_is_a_named_preset_and_the_paper_is_exactly_algorithm_1():
    assert Bandit(3).variant == VARIANTS[DEFAULT_VARIANT]
    assert VARIANTS["paper"].is_paper and not VARIANTS[DEFAULT_VARIANT].is_paper
    assert Variant("custom").is_paper  # the field defaults are the paper's


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_snapshots_and_packed_bytes_keep_the_variant(variant):
    b = trained(variant)
    again = Bandit.from_dict(b.to_dict())
    assert again.variant == b.variant and again.to_dict() == b.to_dict()
    unpacked = Bandit.unpack(b.pack(), Bandit(3, variant=variant), "x")
    assert unpacked.to_dict() == b.to_dict()
    t1, t2 = b.select(u=0.3), again.select(u=0.3)
    b.update(t1, 5.0)
    again.update(t2, 5.0)
    assert again.to_dict() == b.to_dict()


def test_a_snapshot_from_before_variants_is_the_papers():
    data = trained("paper").to_dict()
    del data["variant"]
    assert Bandit.from_dict(data).variant == VARIANTS["paper"]


def test_migrating_to_another_variant_keeps_the_statistics_and_the_state():
    b = trained("paper")
    moved = migrate(b, [0, 1, 2], variant="robust").bandit
    assert moved.variant == VARIANTS["robust"]
    assert (moved.n_updates, moved.n_rounds, moved._vn) == (b.n_updates, b.n_rounds, b._vn)
    assert moved.baseline == b.psi  # the running minimum stands for the mean
    assert np.array_equal(moved._state, b._state)  # the loss history, as for a changed γ
    back = migrate(moved, [0, 1, 2], variant="paper").bandit
    assert back.psi == moved.baseline and back.variant.is_paper
    fresh = migrate(Bandit(3, variant="paper"), [0, 1, 2], variant="robust").bandit
    assert fresh.baseline == math.inf and fresh.n_updates == 0


@settings(max_examples=40, deadline=None)
@given(
    losses=st.lists(st.floats(-1e12, 1e12), min_size=2, max_size=60),
    growth=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_growth_bounds_how_much_the_range_estimate_rises_per_update(losses, growth, seed):
    b = Bandit(3, seed=seed, variant=Variant("g", baseline="mean", growth=growth))
    for loss in losses:
        before = b.D
        b.update(b.select(), loss)
        if before > 0:
            assert 2**growth * before >= b.D


def test_the_mean_moves_little_on_a_loss_the_growth_bound_cuts():
    b = trained("robust", rounds=500)
    mean, d = b.baseline, b.D
    b.update(b.select(u=0.5), 1e12)  # an outlier a billion times the range
    assert abs(b.baseline - mean) <= 2 * d / b.n_updates
    assert 2 * d >= b.D


def regret(env: LossTable, variant: str) -> float:
    def build(e, n, s):
        return BatchBandit(n, e.shape[1], seed=s, variant=variant)

    return float(play(env, Contender(variant, "tsi", build), n_seeds=6, seed=0).regret.mean())


def test_one_outlier_multiplies_the_papers_regret_but_not_the_robust_variants():
    env = bernoulli(5000, 10, seed=4)
    spiked = env.losses.copy()
    spiked[500] = spiked.max() + 1e4  # every arm, once: the best arm does not change
    outlier = LossTable("outlier", spiked)
    assert regret(outlier, "paper") > 3 * regret(env, "paper")
    assert regret(outlier, "robust") < 2 * regret(env, "robust")


@pytest.mark.parametrize("variant", ["mean", "robust"])
def test_the_mean_baseline_keeps_switching_decisions_under_a_rounding_map(variant):
    """The issue's chaos: the paper's Switching class changes a thousand of 4,000 heavy-tailed
    selections under l -> 1000·l + 10^6 (checked as a control); the mean baseline none."""
    rng = np.random.default_rng(5)
    best = (np.arange(4000)[:, None] // 1000) % 4
    table = np.round(1e3 * rng.standard_t(1.5, (4000, 4)) + (np.arange(4) != best) * 3e3)
    draws = rng.random(4000)

    def arms(name, transform):
        b = Bandit(4, Switching(), seed=0, instance_id="x", variant=name)
        chosen = []
        for t in range(4000):
            ticket = b.select(u=float(draws[t]))
            chosen.append(ticket.arm)
            b.update(ticket, transform(float(table[t, ticket.arm])))
        return np.array(chosen)

    def changed(name):
        return int((arms(name, float) != arms(name, lambda x: 1000.0 * x + 1e6)).sum())

    assert changed("paper") > 100
    assert changed(variant) == 0
