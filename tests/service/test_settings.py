"""Service configuration: registry, Kafka client settings, environment, the `tsi run` errors."""

import pytest
from typer.testing import CliRunner

from flows.cli import app
from flows.service.instances.registry import Registry, RegistryError
from flows.service.runtime.process import Service
from flows.service.runtime.settings import ConfigError, Settings, client_config

REGISTRY_TOML = '[experiments.home]\narms = ["a", "b"]\n'


def test_client_settings_pass_through_untouched(tmp_path):
    path = tmp_path / "kafka.toml"
    path.write_text(
        '[kafka]\n"security.protocol" = "SASL_SSL"\n"sasl.mechanism" = "PLAIN"\n'
        '[kafka.consumer]\n"fetch.min.bytes" = 1\n[kafka.producer]\n"linger.ms" = 2\n'
    )
    consumer, producer = client_config(path)
    assert consumer == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "fetch.min.bytes": 1,
    }
    assert producer == {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "linger.ms": 2}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[kafka\n", "not valid TOML"),
        ("kafka = 3\n", "must be a table"),
        ('[kafka]\n"x" = [1]\n', "must be a scalar"),
    ],
)
def test_bad_client_settings_are_refused(tmp_path, text, message):
    path = tmp_path / "kafka.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        client_config(path)


def test_environment_configures_the_service(tmp_path):
    (tmp_path / "r.toml").write_text(REGISTRY_TOML)
    settings = Settings.from_env(
        {
            "TSI_REGISTRY": str(tmp_path / "r.toml"),
            "KAFKA_BOOTSTRAP_SERVERS": "h1:1,h2:2",
            "TSI_TOPIC_EVENTS": "all.events",
            "TSI_SKIP_OFFSETS": "all.events:0:5,all.events:1:7",
        }
    )
    service = Service.from_settings(settings)
    assert service.guards.skip == {("all.events", 0, 5), ("all.events", 1, 7)}
    assert service.brokers == ["h1:1", "h2:2"] and service.topics.events == "all.events"
    assert service.topics.selections == "tsi.selections"
    with pytest.raises(ConfigError, match="TSI_REGISTRY"):
        Settings.from_env({})


def test_the_heap_trim_interval_is_read_and_checked(tmp_path):
    env = {"TSI_REGISTRY": str(tmp_path / "r.toml")}
    assert Settings.from_env(env).malloc_trim == 10.0
    assert Settings.from_env(env | {"TSI_MALLOC_TRIM": "0"}).malloc_trim == 0.0
    for bad, shown in (("-1", "0 or more seconds, got -1.0"), ("often", "'often'")):
        with pytest.raises(ConfigError, match=f"TSI_MALLOC_TRIM must be .*{shown}"):
            Settings.from_env(env | {"TSI_MALLOC_TRIM": bad})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "at least one"),
        ('[experiments.e]\narms = ["a", "a"]', "distinct"),
        ('[experiments.e]\narms = ["a"]\nfeedback_ttl = -1', "feedback_ttl"),
        ('[experiments.e]\narms = ["a"]\ncolour = 1', "unknown setting"),
        ('[experiments.e]\narms = ["a", "b"]\ncompetition = "magic"', "unknown competition"),
        (
            '[experiments.e]\narms = ["a", "b"]\ncompetition = {kind = "fixed", rate = 0.1}',
            r"'fixed' takes no options; unexpected \['rate'\]",
        ),
        (
            '[experiments.e]\narms = ["a", "b"]\ncompetition = {kind = "contextual"}',
            "'contextual' needs n_contexts",
        ),
        (
            '[experiments.e]\narms = ["a", "b"]\ncompetition = {kind = "switching", pace = 1}',
            r"takes rate, switches, horizon; unexpected \['pace'\]",
        ),
        (
            '[experiments.e]\narms = ["a", "b"]\ncompetition = {kind = "switching", rate = 2}',
            "rate must be in",
        ),
        ('[experiments.e]\narms = ["a", "b"]\ngamma = 0', "gamma"),
        ('[experiments.e]\narms = ["a", "b"]\nper_unit = "yes"', "per_unit"),
    ],
)
def test_invalid_registry_is_refused_naming_the_problem(text, message):
    with pytest.raises(RegistryError, match=message):
        Registry.from_toml(text)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--registry", "/no/such/file.toml", "--no-recovery"], "cannot read registry"),
        (
            ["--registry", "{reg}", "--no-recovery", "--kafka-config", "/no/such.toml"],
            "cannot read Kafka config",
        ),
        (["--registry", "{reg}", "--process-id", "0"], "go together"),
        (
            [
                "--registry",
                "{reg}",
                "--no-recovery",
                "--snapshot-every",
                "1",
                "--backup-every",
                "15",
            ],
            "--backup-every must stay within 14 snapshots",
        ),
        (["--registry", "{reg}"], "give --recovery-dir DIR"),  # running without it is a choice
        (["--registry", "{reg}", "--recovery-dir", "{reg}", "--no-recovery"], "or --no-recovery"),
        (["--registry", "{reg}", "--recovery-dir", "{reg}"], "not a directory"),
        (
            ["--registry", "{reg}", "--no-recovery", "--skip-offset", "t:0", "--brokers", "x:1"],
            "TOPIC:PARTITION:OFFSET",
        ),
        (["--registry", "{reg}", "--no-recovery", "--malloc-trim", "-1"], "--malloc-trim"),
    ],
)
def test_tsi_run_explains_user_mistakes_in_one_line(tmp_path, args, message):
    (tmp_path / "r.toml").write_text(REGISTRY_TOML)
    args = [a.replace("{reg}", str(tmp_path / "r.toml")) for a in args]
    result = CliRunner().invoke(app, ["run", *args])
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output


def test_tsi_run_help_names_the_kafka_settings_tables():
    shown = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "250"}).output
    for table in ("[kafka]", "[kafka.consumer]", "[kafka.producer]"):
        assert table in shown


def test_the_experiments_topic_stands_for_the_registry_file(tmp_path):
    settings = Settings.from_env({"TSI_EXPERIMENTS_TOPIC": "1", "TSI_GROUP_ID": "shop"})
    assert settings.registry is None and settings.experiments_topic
    with pytest.raises(ConfigError, match=r"--registry FILE .* or --experiments-topic"):
        Settings.from_env({"TSI_EXPERIMENTS_TOPIC": "0"})
    both = {"TSI_EXPERIMENTS_TOPIC": "1", "TSI_REGISTRY": str(tmp_path / "r.toml")}
    assert Settings.from_env(both).registry == tmp_path / "r.toml"
