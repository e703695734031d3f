"""Real data sets bundled with scikit-learn as loss tables (arena/lab/datasets.py)."""

import numpy as np
import pytest

from arena.lab.datasets import DIABETES_RULES, diabetes, diabetes_forecasts, digits, wine


def test_diabetes_losses_are_absolute_errors_in_the_targets_units():
    env = diabetes(3000, seed=2)
    assert env.shape == (3000, len(DIABETES_RULES)) == (3000, 10)
    assert env.kind == "fixed" and env.contexts is None
    assert (env.losses >= 0).all()
    assert env.losses.max() > 150.0  # native units (progression 25..346), not [0, 1]
    assert 30.0 < env.losses.mean() < 80.0
    forecasts, targets = diabetes_forecasts()
    assert forecasts.shape == (442, 10) and targets.min() == 25.0 and targets.max() == 346.0
    # every round is one patient's row of errors
    all_rows = np.abs(forecasts - targets[:, None])
    for row in env.losses[:50]:
        assert np.isclose(all_rows, row, rtol=0, atol=1e-9).all(axis=1).any()


def test_diabetes_rules_are_the_stated_ones_and_the_lines_beat_the_constants():
    forecasts, targets = diabetes_forecasts()
    np.testing.assert_allclose(forecasts[:, 0], targets.mean())
    np.testing.assert_allclose(forecasts[:, 1], np.median(targets))
    errors = np.abs(forecasts - targets[:, None]).mean(axis=0)
    assert errors[2:].min() < errors[:2].min() - 10.0  # the best line (bmi or s5) by > 10
    assert DIABETES_RULES[int(errors.argmin())] in ("line on bmi", "line on s5")


def test_diabetes_is_seeded_and_samples_with_replacement():
    a, b, c = diabetes(1000, seed=5), diabetes(1000, seed=5), diabetes(1000, seed=6)
    assert np.array_equal(a.losses, b.losses) and not np.array_equal(a.losses, c.losses)
    assert len(np.unique(a.losses, axis=0)) < 442  # 1000 draws of 442 patients repeat some
    with pytest.raises(ValueError, match="n_rounds"):
        diabetes(0, seed=1)


@pytest.mark.parametrize(
    ("make", "arms", "contexts"), [(digits, 10, 8), (wine, 3, 4)], ids=["digits", "wine"]
)
def test_classification_tables_have_cluster_contexts_that_help(make, arms, contexts):
    env = make(600, seed=1)
    assert env.shape == (600, arms) and env.n_contexts == contexts
    assert set(np.unique(env.losses)) == {0.0, 1.0}
    assert (env.losses.sum(axis=1) == arms - 1).all()  # exactly one right answer a round
    assert env.best_contextual_loss() < 0.8 * env.best_fixed_loss()
    assert np.array_equal(make(600, seed=1).losses, env.losses)
