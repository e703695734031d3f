"""Each setting declared once: its variable and its flag are the same setting, the docs'
generated table (tests/docs/test_site.py) and ``tsi run --help`` show every one, and the
topic options are one bundle."""

from pathlib import Path

import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from flows.cli import app
from flows.service.runtime.options import ConfigError, Option
from flows.service.runtime.settings import TOPIC_OPTIONS, Settings, options

ROOT = Path(__file__).resolve().parents[2]
OPTIONS = list(options())
REGISTRY = {"TSI_REGISTRY": "r.toml"}
NO_VARIABLES = {option.var: None for option in OPTIONS}  # the test's own environment aside
# Texts a person may type: numbers in every form, names, lists, paths, junk.
TEXTS = st.one_of(
    st.sampled_from(
        ["", " ", "0", "1", "-1", "0.5", "1e3", "inf", "nan", "70000", "9100", "+3", "a,b", "x y"]
    ),
    st.text(st.sampled_from("01239.-+eE ,;:/_abtxz"), max_size=12),
)
VALID = {  # a value each setting accepts, other than its default
    "TSI_REGISTRY": "other.toml",
    "KAFKA_BOOTSTRAP_SERVERS": "h1:1,h2:2",
    "TSI_KAFKA_CONFIG": "kafka.toml",
    "TSI_TOPIC_REQUESTS": "req",
    "TSI_TOPIC_FEEDBACK": "fb",
    "TSI_TOPIC_EVENTS": "all",
    "TSI_TOPIC_SELECTIONS": "sel",
    "TSI_TOPIC_DLQ": "dl",
    "TSI_TOPIC_INTERNAL": "",
    "TSI_TOPIC_CHANGELOG": "other.changelog",
    "TSI_RECOVERY_DIR": "rec",
    "TSI_NO_CHANGELOG": "1",
    "TSI_SNAPSHOT_EVERY": "2.5",
    "TSI_BACKUP_EVERY": "20",
    "TSI_WORKERS": "4",
    "TSI_PROCESS_ID": "1",
    "TSI_ADDRESSES": "a:1;b:2",
    "TSI_MEMBERS": "2",
    "TSI_SHARDS": "64",
    "TSI_MEMBER": "1",
    "TSI_CONNECT_TIMEOUT": "0.5",
    "TSI_METRICS_PORT": "9100",
    "TSI_METRICS_HOST": "127.0.0.1",
    "TSI_READY_TIMEOUT": "30",
    "TSI_GROUP_ID": "",
    "TSI_SKIP_OFFSETS": "t:0:5,u:1:7",
    "TSI_TS_WINDOW": "3600",
    "TSI_MALLOC_TRIM": "0",
    "TSI_LOG_FILE": "run.log",
    "TSI_OUTPUTS": "files:out",
}
INVALID = {  # a value each setting refuses, by itself
    "KAFKA_BOOTSTRAP_SERVERS": ",",
    "TSI_SNAPSHOT_EVERY": "0.001",
    "TSI_BACKUP_EVERY": "often",
    "TSI_WORKERS": "0",
    "TSI_MEMBERS": "0",
    "TSI_SHARDS": "1025",
    "TSI_MEMBER": "-1",
    "TSI_PROCESS_ID": "-1",
    "TSI_CONNECT_TIMEOUT": "nan",
    "TSI_METRICS_PORT": "70000",
    "TSI_READY_TIMEOUT": "0.5",
    "TSI_SKIP_OFFSETS": "t:0",
    "TSI_TS_WINDOW": "0",
    "TSI_MALLOC_TRIM": "-1",
    "TSI_NO_RECOVERY": "yes",
    "TSI_STOP_AT_END": "true",
    "TSI_FRESH": "2",
    "TSI_REBUILD": "on",
}
PAIRED = {
    "TSI_PROCESS_ID": {"TSI_ADDRESSES": "a:1;b:2"},
    "TSI_ADDRESSES": {"TSI_PROCESS_ID": "0"},
    "TSI_MEMBER": {"TSI_MEMBERS": "4"},
    "TSI_TOPIC_CHANGELOG": {"TSI_RECOVERY_DIR": "rec"},  # mirrors the recovery directory
}


def flag(option: Option) -> str:
    return option.flag.split("/")[0]


def from_env(env: dict[str, str]) -> Settings | str:
    """The settings ``env`` describes, or the error's message."""
    try:
        return Settings.from_env(env)
    except ConfigError as exc:
        return str(exc)


def from_command_line(monkeypatch, args: list[str], env: dict | None = None) -> Settings | str:
    """The settings ``tsi run ARGS`` serves with, or its one-line error."""
    seen = []
    monkeypatch.setattr("flows.cli.run.serve", seen.append)
    result = CliRunner().invoke(app, ["run", *args], env={**NO_VARIABLES, **(env or {})})
    if seen:
        return seen[0]
    assert result.exit_code == 2, result.output
    message = result.output.strip()
    assert message.startswith("tsi run: ") and "\n" not in message, message
    return message.removeprefix("tsi run: ")


def as_args(env: dict[str, str]) -> list[str]:
    """``env`` as ``tsi run``'s flags."""
    by_var = {option.var: option for option in OPTIONS}
    args = []
    for var, text in env.items():
        option = by_var[var]
        if option.kind == "switch":
            args += [flag(option)] if text == "1" else []
        else:
            args.append(f"{flag(option)}={text}")
    return args


def test_every_tsi_run_setting_is_declared_once_with_a_variable_and_a_flag():
    assert len({o.var for o in OPTIONS}) == len({flag(o) for o in OPTIONS}) == len(OPTIONS)
    assert {"TSI_REGISTRY", "TSI_FRESH", "TSI_WORKERS", "TSI_LOG_FILE"} <= {o.var for o in OPTIONS}
    assert set(VALID) | {o.var for o in OPTIONS if o.kind == "switch"} == {o.var for o in OPTIONS}


def test_settings_are_given_by_keyword_only():
    with pytest.raises(TypeError):
        Settings(Path("r.toml"))  # type: ignore[misc]
    assert Settings(registry=Path("r.toml")) == Settings.from_env(REGISTRY)


@pytest.mark.parametrize("option", [o for o in OPTIONS if o.kind == "value"], ids=flag)
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=TEXTS)
def test_a_flag_and_its_variable_given_the_same_text_are_the_same_setting(
    monkeypatch, option, text
):
    env = {**REGISTRY, **PAIRED.get(option.var, {}), option.var: text}
    assert from_command_line(monkeypatch, as_args(env)) == from_env(env)


@pytest.mark.parametrize("var", sorted(VALID))
def test_a_valid_value_is_read_alike_and_is_not_the_default(monkeypatch, var):
    env = {**REGISTRY, **PAIRED.get(var, {}), var: VALID[var]}
    read = from_env(env)
    assert isinstance(read, Settings), read
    assert read != from_env({**REGISTRY, **PAIRED.get(var, {})})
    assert from_command_line(monkeypatch, as_args(env)) == read


@pytest.mark.parametrize("var", sorted(INVALID))
def test_an_invalid_value_is_refused_alike_naming_the_flag_the_variable_and_value(monkeypatch, var):
    option = next(o for o in OPTIONS if o.var == var)
    env = {**REGISTRY, var: INVALID[var]}
    message = from_env(env)
    assert isinstance(message, str), message
    assert flag(option) in message and var in message
    assert repr(INVALID[var]) in message or str(float(INVALID[var])) in message, message
    if option.kind != "switch":  # a switch's flag takes no value
        assert from_command_line(monkeypatch, as_args(env)) == message


@pytest.mark.parametrize("option", [o for o in OPTIONS if o.kind == "switch"], ids=flag)
def test_a_switch_is_its_flag_or_its_variable_set_to_1(monkeypatch, option):
    on = from_env({**REGISTRY, option.var: "1"})
    off = from_env({**REGISTRY, option.var: "0"})
    assert isinstance(on, Settings) and on != off == from_env(REGISTRY)
    assert from_command_line(monkeypatch, ["--registry=r.toml", flag(option)]) == on
    assert from_command_line(monkeypatch, ["--registry=r.toml"], {option.var: "1"}) == on
    if "/" in option.flag:  # --x/--no-x: the flag's other form wins over the variable
        no = option.flag.split("/")[1]
        assert from_command_line(monkeypatch, ["--registry=r.toml", no], {option.var: "1"}) == off


def test_a_repeated_flag_is_its_comma_separated_variable(monkeypatch):
    env = {**REGISTRY, "TSI_SKIP_OFFSETS": "t:0:5,u:1:7"}
    read = from_env(env)
    assert read.skip_offsets == {("t", 0, 5), ("u", 1, 7)}
    both = ["--skip-offset", "t:0:5", "--skip-offset", "u:1:7"]
    assert from_command_line(monkeypatch, ["--registry=r.toml", *both]) == read
    assert from_env({**REGISTRY, "TSI_SKIP_OFFSETS": " t:0:5  u:1:7 "}) == read


def test_a_flag_wins_over_its_variable(monkeypatch):
    read = from_command_line(
        monkeypatch,
        ["--registry=r.toml", "--metrics-port=9100", "--group-id="],
        {"TSI_METRICS_PORT": "9200", "TSI_GROUP_ID": "g", "TSI_WORKERS": "3"},
    )
    assert (read.metrics_port, read.group_id, read.workers) == (9100, None, 3)


def test_tsi_run_help_shows_every_setting_with_its_variable():
    shown = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "250"}).output
    for option in OPTIONS:
        assert flag(option) in shown and option.var in shown


@pytest.mark.parametrize("command", [["run"], ["topics", "create"], ["topics", "check"]])
def test_the_topic_options_are_one_bundle_every_service_command_takes(command):
    group = typer.main.get_command(app)
    for name in command:
        group = group.commands[name]  # type: ignore[attr-defined]
    flags = {opt for param in group.params for opt in param.opts}
    assert {flag(option) for option in TOPIC_OPTIONS.values()} <= flags
    assert {"--brokers", "--kafka-config"} <= flags
