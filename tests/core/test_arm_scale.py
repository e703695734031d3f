"""The Tsallis learner's scale D: the root of the mean over the arms of each arm's mean
squared gap, so that an arm that is not played keeps its weight in D. Its per-arm
statistics travel in snapshots, bytes and migrations, and bad ones are refused."""

import numpy as np
import pytest

from tests.core.packed_layout import columns_of, compact_of
from tsi_core import Bandit
from tsi_core.migrate import migrate

M = 4
ARMS = 2 * M + 1  # the arms' block: the arms with a gap, M mean squares, M counts


def trained(rounds: int = 300, seed: int = 0) -> Bandit:
    """A Fixed bobw bandit of M arms after ``rounds`` heavy-tailed losses."""
    rng = np.random.default_rng(seed)
    b = Bandit(M, variant="bobw")
    for _ in range(rounds):
        t = b.select(u=float(rng.random()))  # draws given: the bandit owns no generator
        b.update(t, float(rng.standard_t(2.0) + 0.3 * t.arm))
    return b


def squares(b: Bandit) -> np.ndarray:
    return b._arm_stats[: b.n_arms]


def counts(b: Bandit) -> np.ndarray:
    return b._arm_stats[b.n_arms :]


def test_d_squared_is_the_mean_of_the_arms_mean_squares_and_counts_are_the_gaps():
    b = trained()
    played = counts(b) > 0
    assert counts(b).sum() == b.n_updates - 1  # the first loss is the mean: no gap
    assert b._row[-ARMS] == played.sum()  # the arms with a gap, kept in the row
    assert squares(b)[played].mean() == pytest.approx(1.0, rel=1e-12)  # in units of D²


def test_playing_only_a_constant_arm_does_not_shrink_d():
    """Arm 0 loses 0, or 4 one round in five; arm 1 always 1. After 200 rounds of both,
    5,000 of arm 1 alone: its gaps go to 0, arm 0's mean squared gap stays in D (one scale
    over every gap fell like 1/sqrt(n): about 0.2 of D here)."""
    rng = np.random.default_rng(3)
    b = Bandit(2, seed=0, variant="bobw")
    for i in range(200):
        t = b.select(eligible=[i % 2 == 0, i % 2 == 1])
        b.update(t, float(4.0 * (rng.random() < 0.2)) if t.arm == 0 else 1.0)
    before, arm_0 = b.D, squares(b)[0] * b.D**2  # arm 0's mean squared gap, loss units
    n_0 = counts(b)[0]
    for _ in range(5000):
        b.update(b.select(eligible=[False, True]), 1.0)
    assert 0.5 * before <= b.D
    assert squares(b)[0] * b.D**2 == pytest.approx(arm_0, rel=1e-9) and counts(b)[0] == n_0


def test_bytes_and_snapshots_from_before_keep_d_and_every_q():
    b = trained()
    q = b.probabilities().tolist()
    snap = b.to_dict()
    del snap["arm_mean_squares"], snap["arm_gap_counts"]
    for again in (
        Bandit.unpack(columns_of(b._row)[: -8 * ARMS], Bandit(M, variant="bobw"), "u"),
        Bandit.from_dict({**snap, "version": 4}),
    ):
        assert again.D == b.D and again.probabilities().tolist() == q
        assert squares(again).tolist() == [1.0] * M and counts(again).tolist() == [1.0] * M
        t = again.select()
        again.update(t, 2.5)
        assert counts(again)[t.arm] == 2.0
    exact = Bandit.unpack(b.pack(), Bandit(M, variant="bobw"), b.instance_id)
    assert exact.to_dict() == b.to_dict()


def test_a_fresh_bandit_before_any_gap_reads_back_from_old_bytes_with_none():
    b = Bandit(M, variant="bobw")
    again = Bandit.unpack(columns_of(b._row)[: -8 * ARMS], Bandit(M, variant="bobw"), "u")
    assert again._arm_stats.tolist() == [0.0] * (2 * M)


@pytest.mark.parametrize(
    ("squares_", "counts_", "message"),
    [
        ([1.0, float("nan"), 1.0, 1.0], [5, 5, 5, 5], "arm mean squares must be finite"),
        ([1.0, -0.5, 1.0, 1.0], [5, 5, 5, 5], "and >= 0"),
        ([1.0, 0.5, 1.0, 1.0], [5, 0, 5, 5], "0 for an arm with no gap"),
        ([1.0, 1.0, 1.0, 1.0], [5, 0.5, 5, 5], "whole numbers from 0 to n_updates = 300"),
        ([1.0, 1.0, 1.0, 1.0], [5, 301, 5, 5], "whole numbers from 0 to n_updates = 300"),
    ],
)
def test_bad_arm_statistics_are_refused_in_snapshots_and_in_bytes(squares_, counts_, message):
    b = trained()
    snap = b.to_dict()
    with pytest.raises(ValueError, match=message):
        Bandit.from_dict({**snap, "arm_mean_squares": squares_, "arm_gap_counts": counts_})
    row = np.array(b._row)
    row[-ARMS:] = [sum(c > 0 for c in counts_), *squares_, *counts_]
    blobs = [columns_of(row)]  # the columns of the release before; compact if it can say it
    if all(c == int(c) and (c or not s) for s, c in zip(squares_, counts_, strict=True)):
        blobs.append(compact_of(row, M))
    for blob in blobs:
        with pytest.raises(ValueError, match=message):
            Bandit.unpack(blob, Bandit(M, variant="bobw"), "u")
    assert b.to_dict() == snap  # the source is untouched


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("arm_mean_squares", [1.0, 1.0], "arm statistics must be 4 numbers each"),
        ("arm_gap_counts", ["1", 1, 1, 1], "arm statistics must be numbers"),
    ],
)
def test_arm_statistics_of_the_wrong_shape_or_type_are_refused(field, value, message):
    with pytest.raises(ValueError, match=message):
        Bandit.from_dict({**trained().to_dict(), field: value})


def test_bytes_whose_count_of_arms_with_a_gap_disagrees_are_refused():
    row = np.array(trained()._row)
    row[-ARMS] = M - 1  # compact arms derive it: only columns can disagree
    blob = columns_of(row)
    with pytest.raises(ValueError, match="arms with a gap must be 4"):
        Bandit.unpack(blob, Bandit(M, variant="bobw"), "u")


def test_migration_carries_each_kept_arms_statistics_and_keeps_d():
    b = trained()
    moved = migrate(b, [2, None, 0]).bandit
    assert moved.D == b.D
    assert counts(moved).tolist() == [counts(b)[2], 0.0, counts(b)[0]]
    kept = squares(b)[[2, 0]]
    assert squares(moved)[[0, 2]] == pytest.approx(kept / kept.mean(), rel=1e-12)
    assert squares(moved)[1] == 0.0  # joins at its first gap
    same = migrate(b, list(range(M))).bandit
    assert same._arm_stats.tolist() == b._arm_stats.tolist()


def test_migration_into_the_tsallis_learner_starts_with_no_arm_statistics():
    rng = np.random.default_rng(1)
    b = Bandit(M, seed=0, variant="robust")
    for _ in range(100):
        t = b.select()
        b.update(t, float(rng.random() + t.arm))
    moved = migrate(b, list(range(M)), variant="bobw").bandit
    assert moved.D == 0.0 and moved._arm_stats.tolist() == [0.0] * (2 * M)
