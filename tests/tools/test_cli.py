"""The embedded default job: `tsi simulate`."""

from typer.testing import CliRunner

from flows.cli import app


def test_simulate_prints_the_same_normalised_regret_under_every_transform():
    result = CliRunner().invoke(app, ["simulate", "--rounds", "2000", "--seeds", "4"])
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if line.startswith(("l ", "1", "-"))]
    assert len(rows) == 4
    normalised = {line.split()[-1] for line in rows}
    assert len(normalised) == 1  # identical to 6 decimals under every affine map
    assert 0.0 < float(normalised.pop()) < 5 + 4 * 1.27  # below the paper's bound for M = 5


def test_simulate_rejects_a_bad_option_with_a_clear_message():
    result = CliRunner().invoke(app, ["simulate", "--arms", "1"])
    assert result.exit_code != 0
    assert "--arms" in result.output
