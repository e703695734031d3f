"""The default sees every loss: one-arm spikes and a change of scale between regimes, on
tables its scale rules were not chosen on (``bench/bench_bobw.py``, ``spike_tuning_tables``
chose them; these are seeds and parameters from its held-out list), 40 seeds each: with 10
the runs that settle on a worse arm (about one in five on the 4-arm table under the scale
before each arm kept its own mean squared gap) are missed or counted four times over."""

import pytest

from arena.lab.baselines import ThompsonNIG
from arena.lab.environments import one_arm_spikes, scale_jump
from arena.runner import Contender, _tsi_fixed, play

SEEDS = 40
ROUNDS = 10_000


def regret(env, variant: str | None) -> float:
    if variant is None:
        player = Contender("Thompson", "baseline", lambda e, n, s: ThompsonNIG(n, e.shape[1], s))
    else:
        player = Contender(variant, "tsi", lambda e, n, s: _tsi_fixed(e, n, s, variant=variant))
    return float(play(env, player, SEEDS, seed=0).regret.mean())


@pytest.mark.parametrize(
    "env",
    [
        one_arm_spikes(ROUNDS, 2, 17, 0.1, 30.0),  # arm 0 loses 30 one round in ten (mean 3)
        one_arm_spikes(ROUNDS, 2, 18, 0.05, 60.0),
        one_arm_spikes(ROUNDS, 2, 19, 0.005, 600.0),  # rare and huge (mean 3 vs 1)
        one_arm_spikes(ROUNDS, 4, 20, 0.2, 4.0),  # the best arm spikes, the others lose 1
        one_arm_spikes(ROUNDS, 8, 21, 0.03, 20.0, other=0.9),  # the better arm (0.6 vs 0.9)
    ],
    ids=["mild", "larger", "rare", "best-of-4", "better-of-8"],
)
def test_one_arm_spikes_cost_at_most_1_5_thompson_and_less_than_robust(env):
    """Every held-out spike table. On the 4-arm one a scale from every gap at once (D
    shrinking while constant arms are played) paid 7.7× Thompson sampling: runs that
    had seen one spike of the best arm stopped playing it."""
    bobw = regret(env, "bobw")
    assert bobw <= 1.5 * regret(env, None)
    assert bobw <= regret(env, "robust")


def test_a_scale_jump_between_regimes_is_followed():
    """×100 from 30% of the run on, with new arm means: robust's range estimate and
    Thompson sampling's all-time means lag; bobw's D follows within a few updates."""
    env = scale_jump(ROUNDS, 4, 19, at=0.3)
    bobw = regret(env, "bobw")
    assert bobw <= 0.5 * regret(env, "robust")
    assert bobw <= 0.5 * regret(env, None)
