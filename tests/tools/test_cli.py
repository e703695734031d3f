"""The embedded default job, `tsi simulate`, and what any command prints when it fails."""

import sys

import pytest
from typer.testing import CliRunner

from flows.cli import app, main


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


def run_main(monkeypatch, capsys, *args):
    """``tsi ARGS`` through the console script: (exit status, stderr)."""
    monkeypatch.setattr(sys, "argv", ["tsi", *args])
    with pytest.raises(SystemExit) as stopped:
        main()
    return stopped.value.code, capsys.readouterr().err


def test_an_unexpected_error_is_one_line_naming_the_command_and_exit_status_1(
    monkeypatch, capsys, tmp_path
):
    def damaged(_directory):
        raise ValueError("shard shard-014-of-032: the record at byte 13\n  is damaged")

    monkeypatch.setattr("flows.service.runtime.recovery.read_states", damaged)
    monkeypatch.delenv("TSI_TRACEBACK", raising=False)
    status, err = run_main(monkeypatch, capsys, "inspect", "--recovery-dir", str(tmp_path))
    assert status == 1
    assert err.splitlines() == [
        "tsi inspect: shard shard-014-of-032: the record at byte 13 is damaged "
        "(ValueError; TSI_TRACEBACK=1 shows where)"
    ]


def test_tsi_traceback_shows_the_whole_story(monkeypatch, capsys, tmp_path):
    def damaged(_directory):
        raise ValueError("damaged")

    monkeypatch.setattr("flows.service.runtime.recovery.read_states", damaged)
    monkeypatch.setenv("TSI_TRACEBACK", "1")
    monkeypatch.setattr(sys, "argv", ["tsi", "inspect", "--recovery-dir", str(tmp_path)])
    with pytest.raises(ValueError, match="damaged"):
        main()


def test_a_users_mistake_stays_exit_status_2(monkeypatch, capsys, tmp_path):
    status, err = run_main(monkeypatch, capsys, "inspect", "--recovery-dir", str(tmp_path / "no"))
    assert status == 2 and err.count("\n") == 1
    assert err.startswith("tsi inspect: recovery directory")
