"""`tsi simulate` says what its numbers show, and the batch of maps is the separate runs."""

import numpy as np
import pytest
from typer.testing import CliRunner

import flows.cli.simulate as simulate_cli
from flows.cli import app
from flows.tools.simulate import Result, agreement, agreement_text, bernoulli_table, run, run_maps

MAPS = [(1.0, 0.0), (1000.0, 1e6), (1e-6, -4.2), (2.0**20, -(2.0**40))]


def _result(normalised: float, arms: list[int]) -> Result:
    """A result whose mean normalised regret is ``normalised`` (T = 1, M = 1, D = 1)."""
    chosen = np.array([arms], dtype=np.int16)
    return Result(np.array([normalised]), np.array([normalised]), 1.0, (1, 1), chosen)


def _table_rows(output: str) -> list[list[str]]:
    rows = [line for line in output.splitlines() if line.startswith(("l ", "1", "-"))]
    return [line.split() for line in rows]


@pytest.mark.parametrize("variant", ["robust", "paper"])
def test_the_runs_of_a_batch_of_maps_are_the_separate_runs_bit_for_bit(variant):
    table = bernoulli_table(600, [0.2, 0.5, 0.7], seed=3)
    ticks = []
    batch = run_maps(table, 3, MAPS, seed=5, variant=variant, progress=ticks.append)
    assert sum(ticks) == 600
    for (scale, shift), together in zip(MAPS, batch, strict=True):
        alone = run(table, 3, scale=scale, shift=shift, seed=5, variant=variant)
        assert np.array_equal(alone.arms, together.arms)
        assert np.array_equal(alone.regret, together.regret)
        assert alone.range == together.range


def test_the_sentence_follows_the_numbers():
    same = [_result(0.5, [0, 1]), _result(0.5, [0, 1])]
    text = agreement_text(same, ["l", "2·l"])
    assert "same 2 selections" in text and "invariant to these maps" in text
    assert "identical in every row, bit for bit" in text

    column_differs = [_result(0.5, [0, 1]), _result(0.5005, [0, 1])]
    text = agreement_text(column_differs, ["l", "2·l"])
    assert "identical" not in text and "same in every row" not in text
    assert "differs between rows by up to 1.0e-03 relative" in text
    assert "agree to 3 significant digits" in text

    selections_differ = [_result(0.5, [0, 1]), _result(0.5, [0, 0]), _result(0.5, [1, 0])]
    text = agreement_text(selections_differ, ["l", "a", "b"])
    assert "invariant" not in text and "not the same under every map" in text
    assert "a (1), b (2)" in text
    assert agreement(selections_differ).differing == (0, 1, 2)


def test_the_cli_prints_the_computed_sentence_never_an_assumed_one(monkeypatch):
    differing = [
        _result(0.7796, [0]),
        _result(0.7806, [1]),
        _result(0.7794, [0]),
        _result(0.7796, [0]),
    ]
    monkeypatch.setattr(simulate_cli, "run_maps", lambda *args, **kwargs: differing)
    result = CliRunner().invoke(app, ["simulate", "--rounds", "1", "--seeds", "1"])
    assert result.exit_code == 0, result.output
    assert [row[-1] for row in _table_rows(result.output)] == [
        "0.779600",
        "0.780600",
        "0.779400",
        "0.779600",
    ]
    assert [row[-2] for row in _table_rows(result.output)] == ["0", "1", "0", "0"]
    assert "same in every row" not in result.output and "identical" not in result.output
    assert "is invariant" not in result.output and "choices are invariant" not in result.output
    assert "1000·l + 1e6 (1)" in result.output


@pytest.mark.parametrize("variant", ["robust", "paper"])
def test_the_cli_sentence_matches_its_own_table(variant):
    args = ["simulate", "--rounds", "1500", "--seeds", "3", "--variant", variant]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = _table_rows(result.output)
    assert len(rows) == 4
    differing = [int(row[-2].replace(",", "")) for row in rows]
    sentence = result.output.strip().splitlines()[-1]
    assert sentence.startswith("Every map made the same") == (not any(differing))
    if len({row[-1] for row in rows}) > 1:  # differs even as printed
        assert "identical" not in sentence


def test_an_unknown_variant_is_refused():
    result = CliRunner().invoke(app, ["simulate", "--variant", "nope"])
    assert result.exit_code != 0 and "--variant" in result.output
