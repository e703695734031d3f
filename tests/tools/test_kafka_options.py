"""``tsi replay`` and ``tsi evaluate`` take the brokers, the Kafka client settings and the
topic names from ``tsi run``'s declarations: the same objects, so the same flags,
variables, help and defaults; a flag and its variable are the same setting."""

from __future__ import annotations

from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from flows.cli import app
from flows.cli.evaluate import EVALUATE_OPTIONS, SELECTIONS
from flows.cli.replay import REPLAY_OPTIONS
from flows.cli.topics import SERVICE_OPTIONS
from flows.service.runtime.settings import options


def params(command: str) -> dict[str, Any]:
    """A ``tsi`` command's options by flag (their first spelling)."""
    group = typer.main.get_command(app)
    return {p.opts[0]: p for p in group.commands[command].params if p.opts}  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("command", "declared", "flags"),
    [
        ("replay", REPLAY_OPTIONS, ["--brokers", "--kafka-config", "--group-id",
                                    "--requests-topic", "--feedback-topic",
                                    "--internal-topic"]),
        ("evaluate", EVALUATE_OPTIONS, ["--brokers", "--kafka-config", "--selections-topic",
                                        "--events-topic", "--feedback-topic", "--requests-topic"]),
    ],
)  # fmt: skip
def test_the_kafka_options_are_tsi_runs_declarations(command, declared, flags):
    run, shared = list(options()), [each for each in declared if each is not SELECTIONS]
    assert all(any(each is mine for mine in run) for each in shared)
    assert all(any(each is mine for mine in SERVICE_OPTIONS) for each in shared)
    assert [each.flag for each in declared] == flags
    theirs, mine = params("run"), params(command)
    for flag in flags:  # the same flag, variable, help and default on the command line
        assert mine[flag].opts == theirs[flag].opts
        if flag != "--selections-topic":
            assert mine[flag].help == theirs[flag].help
        assert mine[flag].default is None and theirs[flag].default is None


def test_evaluate_shows_no_default_selections_topic_and_reads_files_without_one(tmp_path):
    """Unset, ``--selections-topic`` reads nothing from Kafka: its help says so, and the
    file given is read (its own error, not the unreachable broker's)."""
    shown = " ".join(params("evaluate")["--selections-topic"].help.split())
    assert "TSI_TOPIC_SELECTIONS" in shown and "default: none" in shown
    assert "tsi.selections" not in shown
    log = tmp_path / "log.jsonl"
    log.write_text("")
    env = {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1", "TSI_TOPIC_SELECTIONS": ""}
    result = CliRunner().invoke(app, ["evaluate", str(log)], env=env)
    assert result.exit_code == 2 and "the log has no records" in result.output


TWO = ("replay", "--registry", "nowhere.toml", "--topic", "a")


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["--requests-topic", "a", "--feedback-topic", "b"], {}),
        ([], {"TSI_TOPIC_REQUESTS": "a", "TSI_TOPIC_FEEDBACK": "b"}),
        (["--feedback-topic", "b"], {"TSI_TOPIC_REQUESTS": "a", "TSI_TOPIC_FEEDBACK": "c"}),
    ],
    ids=["flags", "variables", "a flag wins over its variable"],
)
def test_replay_reads_the_topic_names_by_flag_or_variable(args, env):
    """The names decide how ``--topic a`` is read: here as the requests topic, whose
    feedback topic must be replayed with it (refused before any broker is asked)."""
    result = CliRunner(env=env).invoke(app, [*TWO, *args])
    assert result.exit_code == 2, result.output
    assert "--topic a (the requests topic) needs the feedback topic b too" in result.output


@pytest.mark.parametrize("by", ["flag", "variable"])
@pytest.mark.parametrize("command", [TWO, ("evaluate", "--selections-topic", "s")])
def test_the_kafka_client_settings_are_read_by_flag_or_variable(tmp_path, command, by):
    """--kafka-config / TSI_KAFKA_CONFIG: a setting librdkafka does not know is refused,
    naming it, before any broker is asked."""
    config = tmp_path / "kafka.toml"
    config.write_text('[kafka]\n"no.such.setting" = "1"\n')
    args = ["--kafka-config", str(config)] if by == "flag" else []
    env = {"TSI_KAFKA_CONFIG": str(config)} if by == "variable" else {}
    result = CliRunner(env=env).invoke(app, [*command, *args])
    assert result.exit_code == 2, result.output
    assert "no.such.setting" in result.output


@pytest.mark.parametrize("by", ["flag", "variable"])
def test_replay_reads_the_brokers_by_flag_or_variable(tmp_path, by):
    """--brokers / KAFKA_BOOTSTRAP_SERVERS: the replay reads from those brokers (none
    listens here: the error names them)."""
    brokers = "127.0.0.1:1"
    args = ["--brokers", brokers] if by == "flag" else []
    env = {"KAFKA_BOOTSTRAP_SERVERS": brokers} if by == "variable" else {}
    registry = tmp_path / "registry.toml"
    registry.write_text('[experiments.e]\narms = ["a", "b"]\n')
    result = CliRunner(env=env).invoke(
        app, ["replay", "--registry", registry, "--topic", "t", "--out", tmp_path, *args]
    )
    assert result.exit_code == 2, result.output
    assert f"from {brokers}" in result.output or f"on {brokers}" in result.output
