"""The Tsallis learner's clock per context: each context of a ``Contextual`` bobw bandit
runs on its own learning rate γ/sqrt(1 + S_c), S_c = Σ(1 - q) of that context's updates;
data written before the clocks (packed bytes, version-2 snapshots, a migration from one
shared clock) keep the rate each context had."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arena.lab.baselines import ThompsonNIG
from arena.lab.datasets import breast_cancer
from arena.lab.environments import close_contextual
from arena.runner import Contender, _tsi_matched, play
from tests.core.bobw_reference import BobwReference
from tests.core.packed_layout import columns_of, compact_of
from tsi_core import Bandit, Contextual, migrate
from tsi_core._kernel import Kernel
from tsi_core.variant import TSALLIS_SCALE


def trained(n_contexts: int = 3, rounds: int = 300, seed: int = 0) -> Bandit:
    rng = np.random.default_rng(seed)
    b = Bandit(4, Contextual(n_contexts), variant="bobw", instance_id="u")
    for _ in range(rounds):
        ctx = int(rng.integers(n_contexts))
        t = b.select(context=ctx, u=float(rng.random()))
        b.update(t, float(rng.standard_t(3.0)) + 0.5 * t.arm * (ctx + 1))
    return b


@settings(max_examples=30, deadline=None)
@given(
    n_contexts=st.integers(2, 5),
    plays=st.lists(st.tuples(st.integers(0, 4), st.floats(-1e6, 1e6)), max_size=60),
)
def test_each_clock_is_the_sum_of_its_own_contexts_one_minus_q(n_contexts, plays):
    b = Bandit(3, Contextual(n_contexts), seed=1, variant="bobw")
    expected = [0.0] * n_contexts
    for ctx, loss in plays:
        ctx %= n_contexts
        t = b.select(context=ctx)
        expected[ctx] += 1.0 - t.prob  # the kernel's order of additions: the same bits
        b.update(t, loss)
    assert b._clocks.tolist() == expected
    assert b._vn == pytest.approx(sum(expected), rel=1e-12, abs=1e-12)


def test_one_context_and_other_learners_have_no_clock():
    assert Bandit(4, variant="bobw")._clocks.size == 0
    assert Bandit(4, Contextual(3), variant="robust")._clocks.size == 0
    assert Kernel("cumulative", 4, 3, learner="tsallis").n_clocks == 3
    assert Bandit(4, Contextual(3), variant="bobw").gamma == TSALLIS_SCALE


def old_rate_probabilities(b: Bandit, ctx: int) -> list[float]:
    """q of context ``ctx`` as the learner before the clocks played it: one shared clock S
    and γ = tsallis_scale·sqrt(C)."""
    n = b.structure.n_contexts
    ref = BobwReference(b.n_arms, n, TSALLIS_SCALE * math.sqrt(n))
    ref.phi = b._state.tolist()
    ref.clocks = [b._vn] * n
    return ref.probabilities(ctx)


def test_bytes_packed_before_the_clocks_unpack_to_the_rate_each_context_had():
    b = trained()
    blob = b.pack()
    old = columns_of(b._row)[: -8 * (9 + 9)]  # before: no clocks, context means, arms' block
    again = Bandit.unpack(old, Bandit(4, Contextual(3), variant="bobw"), "u")
    assert again._clocks.tolist() == [(1.0 + b._vn) / 3 - 1.0] * 3
    for ctx in range(3):
        np.testing.assert_allclose(
            again.probabilities(ctx), old_rate_probabilities(b, ctx), atol=1e-12
        )
    assert Bandit.unpack(blob, Bandit(4, Contextual(3), variant="bobw"), "u").to_dict() == (
        b.to_dict()
    )


def test_a_version_2_snapshot_reads_its_old_default_rate_as_todays():
    b = trained()
    snap = b.to_dict()
    snap["version"], snap["gamma"] = 2, TSALLIS_SCALE * math.sqrt(3)
    del snap["clocks"], snap["context_means"], snap["context_counts"]
    again = Bandit.from_dict(snap)
    assert again.gamma == TSALLIS_SCALE
    for ctx in range(3):
        np.testing.assert_allclose(
            again.probabilities(ctx), old_rate_probabilities(b, ctx), atol=1e-12
        )
    snap["gamma"] = 0.5  # chosen by hand: kept
    assert Bandit.from_dict(snap).gamma == 0.5


@pytest.mark.parametrize(
    ("clocks", "message"),
    [
        ([1.0, -1.0, 2.0], "clocks: context clocks must be finite and >= 0, got -1.0"),
        ([1.0, float("nan"), 2.0], "got nan"),
        ([1.0, 2.0], "3 context clocks, got 2"),
    ],
)
def test_a_bad_clock_is_refused_in_snapshots_and_in_bytes(clocks, message):
    b = trained()
    snap = b.to_dict()
    snap["clocks"] = clocks
    with pytest.raises(ValueError, match=message):
        Bandit.from_dict(snap)
    if len(clocks) == 3:
        row = np.array(b._row)
        at = 6 + b._table.kernel.n_state  # the clocks follow the state
        row[at : at + 3] = clocks
        for blob in (columns_of(row), compact_of(row, 4)):
            with pytest.raises(ValueError, match="context clocks must be finite and >= 0"):
                Bandit.unpack(blob, Bandit(4, Contextual(3), variant="bobw"), "u")
    assert b.to_dict()["clocks"] != clocks  # the source is untouched


def test_migration_carries_clocks_by_context_and_starts_them_for_a_new_learner():
    b = trained()
    wider = migrate(b, [0, 1, 2, 3], competition=Contextual(4)).bandit
    assert wider._clocks[:3].tolist() == b._clocks.tolist()
    assert wider._clocks[3] == max(0.0, (1.0 + b._vn) / 4 - 1.0)
    same = migrate(b, [0, 1, 2, 3]).bandit
    assert same._clocks.tolist() == b._clocks.tolist()
    robust = Bandit(4, Contextual(3), variant="robust")
    fresh = migrate(robust, [0, 1, 2, 3], variant="bobw").bandit
    assert fresh._clocks.tolist() == [0.0, 0.0, 0.0]
    for ctx in range(3):  # p per context kept across the learners, each at its own rate
        np.testing.assert_allclose(wider.weight_shares(ctx), b.weight_shares(ctx), atol=1e-9)


def to_thompson(env, seeds: int = 10) -> float:
    """bobw's mean regret (its class matched: Contextual) over Thompson sampling's (one copy
    per context), over ``seeds`` runs."""
    bobw = Contender(
        "bobw", "tsi", lambda e, n, s: _tsi_matched(e, n, s, variant="bobw"), contextual=True
    )
    thompson = Contender("T", "baseline", lambda e, n, s: ThompsonNIG(n, e.shape[1], s))
    return (
        play(env, bobw, seeds, seed=0).regret.mean()
        / play(env, thompson, seeds, seed=0).regret.mean()
    )


@pytest.mark.parametrize(
    ("seed", "n_arms", "n_contexts", "gap"), [(17, 10, 4, 0.05), (18, 5, 8, 0.03)]
)
def test_close_contextual_arms_held_out_cost_about_what_thompson_pays(
    seed, n_arms, n_contexts, gap
):
    """Held-out tables of ``bench/bench_bobw.py`` (the clocks were not chosen on them):
    within 1.15× Thompson sampling."""
    assert to_thompson(close_contextual(10_000, n_arms, n_contexts, seed, gap=gap)) <= 1.15


def test_a_held_out_table_of_busy_and_settled_contexts_costs_under_1_5_thompson():
    """breast cancer (k-means contexts, a held-out table of ``bench/bench_bobw.py``): one
    clock shared by every context (its busy contexts slowing the settled ones) paid 4.06×
    Thompson sampling there, a clock per context with one mean for all contexts 2.47× (the
    contexts' levels differ: every gap carried its context's offset over q); a clock and
    a mean per context stay under 1.5×. 40 runs: about one run in fifty settles on the
    worse arm of the context whose arms are closest (ten runs held one, at 17× the
    median), so ten runs measure that tail more than the mean."""
    assert to_thompson(breast_cancer(10_000, 7), seeds=40) <= 1.5
