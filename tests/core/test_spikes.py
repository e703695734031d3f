"""The default sees every loss: one-arm spikes and a change of scale between regimes, on
tables its scale rules were not chosen on (``bench/bench_bobw.py``, ``spike_tuning_tables``
chose them; these are seeds and parameters from its held-out list), 10 seeds each."""

import pytest

from arena.lab.baselines import ThompsonNIG
from arena.lab.environments import one_arm_spikes, scale_jump
from arena.runner import Contender, _tsi_fixed, play

SEEDS = 10
ROUNDS = 10_000


def regret(env, variant: str | None) -> float:
    if variant is None:
        player = Contender("Thompson", "baseline", lambda e, n, s: ThompsonNIG(n, e.shape[1], s))
    else:
        player = Contender(variant, "tsi", lambda e, n, s: _tsi_fixed(e, n, s, variant=variant))
    return float(play(env, player, SEEDS, seed=0).regret.mean())


def test_one_arm_spikes_cost_at_most_1_5_thompson_and_less_than_robust():
    """Arm 0 loses 30 one round in ten (mean 3), arm 1 always 1: the table on which the
    worst possible regret is a loss of 2 per round."""
    env = one_arm_spikes(ROUNDS, 2, 17, 0.1, 30.0)
    bobw = regret(env, "bobw")
    assert bobw <= 1.5 * regret(env, None)
    assert bobw <= regret(env, "robust")
    assert bobw <= 0.05 * 2 * ROUNDS  # the worst case: a loss of 2 per round


@pytest.mark.parametrize(
    "env",
    [
        one_arm_spikes(ROUNDS, 2, 19, 0.005, 600.0),  # rare and huge (mean 3 vs 1)
        one_arm_spikes(ROUNDS, 8, 21, 0.03, 20.0, other=0.9),  # the better arm (0.6 vs 0.9)
    ],
    ids=["rare", "better"],
)
def test_other_spikes_cost_less_than_robust(env):
    """Where bobw misses 1.5× Thompson sampling (VARIANTS.md, "Targets missed") it still
    pays less than robust."""
    assert regret(env, "bobw") <= regret(env, "robust")


def test_a_scale_jump_between_regimes_is_followed():
    """×100 from 30% of the run on, with new arm means: robust's range estimate and
    Thompson sampling's all-time means lag; bobw's D follows within a few updates."""
    env = scale_jump(ROUNDS, 4, 19, at=0.3)
    bobw = regret(env, "bobw")
    assert bobw <= 0.5 * regret(env, "robust")
    assert bobw <= 0.5 * regret(env, None)
