"""Start-up checks and topic creation: check_topics against the real broker (the
kafka_bootstrap fixture), check_recovery_dir on real Bytewax recovery partitions, and
``tsi topics create`` / ``check`` run as the installed command."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import bytewax.operators as op
import pytest
from bytewax.dataflow import Dataflow
from bytewax.recovery import RecoveryConfig, init_db_dir
from bytewax.testing import TestingSink, TestingSource, run_main
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType
from typer.testing import CliRunner

from flows.cli import app
from flows.service.connectors.kafka_admin import BrokerUnavailableError, check_topics
from flows.service.runtime.recovery import check_recovery_dir
from flows.service.runtime.settings import ConfigError, client_config
from flows.testing.kafka_broker import create_topic, free_port, unique_topic

TSI = Path(sys.executable).parent / "tsi"
DEFAULT_MAX = 1048588


# ----------------------------------------------------------------------------- helpers
def create_with_config(bootstrap: str, name: str, config: dict[str, str], partitions=1) -> str:
    """A topic with topic-level configs, created with AdminClient; returns once it has leaders."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1, config=config)])[name].result(30)
    return create_topic(bootstrap, name, partitions)  # exists already: waits for leaders


def topic_config(bootstrap: str, name: str, key: str) -> str:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ResourceType.TOPIC, name)
    return admin.describe_configs([resource])[resource].result(30)[key].value


def partition_counts(bootstrap: str) -> dict[str, int]:
    """{topic: partitions} of every topic on the broker."""
    topics = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30).topics
    return {name: len(meta.partitions) for name, meta in topics.items()}


def one_line_refusal(call, *args) -> str:
    with pytest.raises(BrokerUnavailableError) as info:
        call(*args)
    message = str(info.value)
    assert "\n" not in message
    return message


# ------------------------------------------------------------------------- check_topics
def test_check_topics_names_every_missing_topic_with_its_role(kafka_bootstrap):
    there = create_topic(kafka_bootstrap, unique_topic("there"))
    gone_in, gone_out = unique_topic("gone-in"), unique_topic("gone-out")
    message = one_line_refusal(
        check_topics, [kafka_bootstrap], {}, [there, gone_in], [there, gone_out], 10
    )
    assert f"input topic(s) {gone_in} and output topic(s) {gone_out} do not exist" in message
    assert there not in message and "tsi topics create" in message


def test_a_missing_output_topic_alone_fails_the_check(kafka_bootstrap):
    inputs = [create_topic(kafka_bootstrap, unique_topic("in"))]
    selections = create_topic(kafka_bootstrap, unique_topic("sel"))
    dlq = unique_topic("dlq")
    message = one_line_refusal(check_topics, [kafka_bootstrap], {}, inputs, [selections, dlq])
    assert message.startswith(f"output topic(s) {dlq} do not exist on {kafka_bootstrap}")
    assert check_topics([kafka_bootstrap], {}, inputs) == {}  # inputs alone pass


def test_check_topics_returns_the_max_message_bytes_of_each_output(kafka_bootstrap):
    plain = create_topic(kafka_bootstrap, unique_topic("plain"))
    big = create_with_config(kafka_bootstrap, unique_topic("big"), {"max.message.bytes": "3000000"})
    small = create_with_config(
        kafka_bootstrap, unique_topic("small"), {"max.message.bytes": "50000"}
    )
    limits = check_topics([kafka_bootstrap], {}, [plain], [plain, big, small])
    assert limits == {plain: DEFAULT_MAX, big: 3000000, small: 50000}
    assert check_topics([kafka_bootstrap], {}, [plain]) == {}


def test_a_missing_input_alone_fails_the_check(kafka_bootstrap):
    gone = unique_topic("gone")
    message = one_line_refusal(check_topics, [kafka_bootstrap], {}, [gone])
    assert message.startswith(f"input topic(s) {gone} do not exist")


def test_no_broker_is_one_line_within_the_timeout():
    where = f"127.0.0.1:{free_port()}"
    start = time.monotonic()
    message = one_line_refusal(check_topics, [where], {}, ["a"], ["b"], 1.0)
    assert message.startswith(f"no Kafka broker answers at {where} within 1 s")
    assert time.monotonic() - start < 5


def test_settings_refused_together_fail_the_check_in_one_line(kafka_bootstrap, tmp_path):
    path = tmp_path / "kafka.toml"
    path.write_text('[kafka]\nsecurity.protocol = "SASL_PLAINTEXT"\nsasl.mechanism = "PLAIN"\n')
    consumer, _ = client_config(path)  # each setting alone is fine
    message = one_line_refusal(check_topics, [kafka_bootstrap], consumer, [], [], 5)
    assert message.startswith("Kafka client settings refused") and "sasl.username" in message


# ------------------------------------------------------------------ check_recovery_dir
def initialised(directory: Path, partitions: int) -> Path:
    """A recovery directory made as ``python -m bytewax.recovery DIR N`` makes it."""
    directory.mkdir(parents=True)
    init_db_dir(directory, partitions)
    return directory


def contents(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir()}


def run_recovered_flow(directory: Path) -> list[int]:
    """A small flow with recovery in ``directory``; what it output."""
    out: list[int] = []
    flow = Dataflow("recovery_check")
    op.output("out", op.input("in", flow, TestingSource([1, 2, 3])), TestingSink(out))
    run_main(flow, epoch_interval=timedelta(0), recovery_config=RecoveryConfig(str(directory)))
    return out


def test_a_missing_or_empty_recovery_directory_is_fine(tmp_path):
    assert check_recovery_dir(tmp_path / "new" / "recovery") == []
    (tmp_path / "empty").mkdir()
    assert check_recovery_dir(tmp_path / "empty", processes=3) == []


def test_partitions_are_listed_and_left_untouched(tmp_path):
    directory = initialised(tmp_path / "rec", 3)
    before = contents(directory)
    assert check_recovery_dir(directory, processes=3) == [
        directory / f"part-{i}.sqlite3" for i in range(3)
    ]
    assert contents(directory) == before  # no -wal/-shm left behind, nothing written


def test_a_directory_a_flow_ran_in_passes_and_still_resumes(tmp_path):
    directory = initialised(tmp_path / "rec", 1)
    assert run_recovered_flow(directory) == [1, 2, 3]
    assert check_recovery_dir(directory) == [directory / "part-0.sqlite3"]
    assert run_recovered_flow(directory) == []  # resumed after the end: the check broke nothing


def spoil(directory: Path, how: str) -> None:
    """Damage an initialised 3-partition directory in one way."""
    part1 = directory / "part-1.sqlite3"
    if how == "stray file":
        (directory / "notes.txt").write_text("hello")
    elif how == "subdirectory":
        (directory / "backup").mkdir()
    elif how == "garbage partition":
        part1.write_bytes(os.urandom(8192))
    elif how == "truncated partition":
        with part1.open("r+b") as f:
            f.truncate(4096)
    elif how == "empty partition":
        part1.write_bytes(b"")
    elif how == "missing partition":
        part1.unlink()
    elif how == "renamed partition":
        shutil.copy(directory / "part-0.sqlite3", part1)
    elif how == "other initialisation":
        other = initialised(directory.parent / "other", 4)
        shutil.copy(other / "part-1.sqlite3", part1)


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("stray file", "holds 'notes.txt', which is not a Bytewax recovery partition"),
        ("subdirectory", "holds 'backup'"),
        ("garbage partition", "part-1.sqlite3 cannot be read by sqlite (file is not a database)"),
        ("truncated partition", "part-1.sqlite3 cannot be read by sqlite"),
        ("empty partition", "part-1.sqlite3 cannot be read by sqlite (no such table: parts)"),
        ("missing partition", "lacks part-1.sqlite3 of its 3 partitions"),
        ("renamed partition", "part-1.sqlite3 does not record partition 1"),
        ("other initialisation", "mixes partitions of different initialisations"),
    ],
)
def test_a_spoilt_recovery_directory_is_one_line_naming_the_file(tmp_path, how, expected):
    directory = initialised(tmp_path / "rec", 3)
    spoil(directory, how)
    with pytest.raises(ConfigError) as info:
        check_recovery_dir(directory)
    assert expected in str(info.value) and "\n" not in str(info.value)
    assert str(directory) in str(info.value)


def test_a_cluster_process_may_hold_some_of_the_partitions(tmp_path):
    directory = initialised(tmp_path / "rec", 3)
    (directory / "part-1.sqlite3").unlink()
    assert len(check_recovery_dir(directory, processes=3)) == 2


def test_a_recovery_path_that_cannot_be_a_directory_is_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="exists but is not a directory"):
        check_recovery_dir(tmp_path / "file")
    with pytest.raises(ConfigError, match=r"cannot be created: .*file is not a writable"):
        check_recovery_dir(tmp_path / "file" / "recovery")


def test_a_read_only_recovery_directory_is_refused(tmp_path, monkeypatch):
    directory = initialised(tmp_path / "rec", 1)
    real_access = os.access
    # root may write anywhere (CI runs as root): the permission answer is what is checked
    monkeypatch.setattr(
        os, "access", lambda p, mode: False if p == directory else real_access(p, mode)
    )
    with pytest.raises(ConfigError, match="is not writable"):
        check_recovery_dir(directory)


# ------------------------------------------------------------------------ tsi topics
def tsi_topics(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``tsi topics ARGS`` as an operator runs it (TSI_* and KAFKA_* come from ``env``)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TSI_", "KAFKA_"))}
    return subprocess.run(
        [str(TSI), "topics", *args],
        capture_output=True,
        text=True,
        env={**base, **(env or {})},
        timeout=120,
        check=False,
    )


def test_tsi_topics_create_makes_the_service_topics_once(kafka_bootstrap):
    roles = ("REQUESTS", "FEEDBACK", "SELECTIONS", "DLQ", "INTERNAL")
    names = {role: unique_topic(f"cli-{role}") for role in roles}
    env = {f"TSI_TOPIC_{role}": name for role, name in names.items()}
    env["KAFKA_BOOTSTRAP_SERVERS"] = kafka_bootstrap
    ordered = [names[r] for r in roles]  # the internal topic the service copies both into
    changelog = env["TSI_TOPIC_CHANGELOG"] = unique_topic("cli-CHANGELOG")  # one a shard

    sizes = ("--partitions", "2", "--shards", "2")  # the internal topic: 2, gcd(32, shards)
    first = tsi_topics("create", *sizes, "--dlq-max-message-bytes", "2000000", env=env)
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == [
        f"{name}: created, 2 partitions, replication 1, max.message.bytes "
        f"{2000000 if name == names['DLQ'] else DEFAULT_MAX}"
        for name in ordered
    ] + [f"{changelog}: created, 2 partitions, replication 1, max.message.bytes {DEFAULT_MAX}"]
    counts = partition_counts(kafka_bootstrap)
    assert [counts.get(name) for name in ordered] == [2, 2, 2, 2, 2]
    assert topic_config(kafka_bootstrap, names["DLQ"], "max.message.bytes") == "2000000"
    assert topic_config(kafka_bootstrap, names["SELECTIONS"], "max.message.bytes") == "1048588"

    again = tsi_topics("create", env=env)  # defaults (3 partitions) only apply to new topics
    assert again.returncode == 0, again.stderr
    assert [line.split(",")[:2] for line in again.stdout.splitlines()] == [
        [f"{name}: exists", " 2 partitions"] for name in ordered
    ] + [[f"{changelog}: exists", " 2 partitions"]]

    contradicted = tsi_topics("create", "--partitions", "5", env=env)
    assert contradicted.returncode == 2 and contradicted.stdout == ""
    assert contradicted.stderr.startswith("tsi topics: ") and contradicted.stderr.count("\n") == 1
    assert f"{names['REQUESTS']} exists with 2 partitions, not 5" in contradicted.stderr
    assert [partition_counts(kafka_bootstrap)[name] for name in ordered] == [2, 2, 2, 2, 2]


def test_tsi_topics_create_with_an_events_topic_skips_requests_and_feedback(kafka_bootstrap):
    events, selections, dlq = (unique_topic(p) for p in ("ev", "sel", "dlq"))
    requests, feedback = unique_topic("req"), unique_topic("fb")
    changelog = unique_topic("changelog")
    options = [
        *("--brokers", kafka_bootstrap, "--events-topic", events),
        *("--requests-topic", requests, "--feedback-topic", feedback),
        *("--selections-topic", selections, "--dlq-topic", dlq),
        *("--changelog-topic", changelog),
    ]
    done = tsi_topics("create", *options)
    assert done.returncode == 0, done.stderr
    made = [line.split(":")[0] for line in done.stdout.splitlines()]
    assert made == [events, selections, dlq, changelog]
    counts = partition_counts(kafka_bootstrap)
    assert [counts.get(t) for t in (events, selections, dlq)] == [3, 3, 3]
    assert requests not in counts and feedback not in counts

    check = tsi_topics("check", *options)
    assert check.returncode == 0, check.stderr
    assert check.stdout.splitlines()[:3] == [
        f"{t}: 3 partitions, replication 1, max.message.bytes {DEFAULT_MAX}"
        for t in (events, selections, dlq)
    ]  # then the consumer group's lag (tests/service/test_topics_lag.py)
    assert check_topics([kafka_bootstrap], {}, [events], [selections, dlq]) == {
        selections: DEFAULT_MAX,
        dlq: DEFAULT_MAX,
    }


def test_tsi_topics_check_fails_on_a_missing_topic(kafka_bootstrap):
    events = create_topic(kafka_bootstrap, unique_topic("ev"))
    selections, dlq = unique_topic("sel"), unique_topic("dlq")
    options = ["--brokers", kafka_bootstrap, "--events-topic", events]
    options += ["--selections-topic", selections, "--dlq-topic", dlq]
    result = CliRunner().invoke(app, ["topics", "check", *options])
    assert result.exit_code == 2
    assert result.stdout.splitlines()[1:3] == [f"{selections}: missing", f"{dlq}: missing"]
    assert result.stdout.startswith(f"{events}: 1 partition, replication 1")
    assert f"tsi topics: missing topic(s) {selections}, {dlq}" in result.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--brokers", "127.0.0.1:{port}", "--timeout", "1"], "no Kafka broker answers"),
        (["--replication-factor", "3"], "The target replication factor of 3 cannot be reached"),
        (["--dlq-topic", "bad name!"], "'bad name!' is not a valid topic name"),
        (["--kafka-config", "{config}"], "unknown Kafka setting 'sasl.usernam'"),
    ],
)
def test_tsi_topics_mistakes_are_one_line_and_status_2(kafka_bootstrap, tmp_path, args, expected):
    (tmp_path / "kafka.toml").write_text('[kafka]\nsasl.usernam = "me"\n')
    prefix = unique_topic("mistake")
    argv = [
        "topics",
        "create",
        *("--brokers", kafka_bootstrap),
        *("--events-topic", f"{prefix}-ev", "--selections-topic", f"{prefix}-sel"),
        *("--dlq-topic", f"{prefix}-dlq"),
        *(a.format(port=free_port(), config=tmp_path / "kafka.toml") for a in args),
    ]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("tsi topics: ") and result.stderr.count("\n") == 1
    assert expected in result.stderr and "Traceback" not in result.output
    assert f"{prefix}-ev" not in partition_counts(kafka_bootstrap)  # nothing half-created
