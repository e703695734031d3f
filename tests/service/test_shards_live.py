"""The shard count on the real broker: ``tsi topics create --shards 64`` makes the internal
and changelog topics with 64 partitions, and two members started on them serve with 64
shards (read from the changelog topic), each holding its own."""

from flows.service.connectors.kafka_admin import topic_infos
from flows.service.runtime.recovery import shard_store
from flows.service.runtime.shard_count import internal_partitions
from flows.service.shards.shard_log import shards_in
from flows.service.wire.keys import shard_layout
from flows.testing.kafka_broker import unique_topic
from tests.service.members_live import (
    PARTITIONS,
    Clients,
    comparable,
    internal_oracle,
    member_env,
    served,
    start_member,
    states_of,
    stop_all,
    wait_answered_and_applied,
)
from tests.service.members_live import REGISTRY as REGISTRY_TOML
from tests.service.test_operating import tsi

SHARDS = 64


def test_a_bad_shard_count_is_refused_before_any_broker_is_asked():
    done = tsi("topics", "create", "--brokers", "127.0.0.1:1", "--shards", "0", timeout=60)
    assert done.returncode == 2
    assert "--shards must be a whole number from 1 to 1024, got '0'" in done.stderr


def test_topics_made_for_64_shards_serve_two_members_with_64(kafka_bootstrap, tmp_path):
    names = ("requests", "feedback", "sel", "dlq", "internal", "changelog")
    topics = {n: unique_topic(n) for n in names}
    options = [
        *("--brokers", kafka_bootstrap, "--requests-topic", topics["requests"]),
        *("--feedback-topic", topics["feedback"], "--selections-topic", topics["sel"]),
        *("--dlq-topic", topics["dlq"], "--internal-topic", topics["internal"]),
        *("--changelog-topic", topics["changelog"]),
    ]
    made = tsi("topics", "create", *options, "--partitions", PARTITIONS, "--shards", SHARDS)
    assert made.returncode == 0, made.stderr
    infos = topic_infos([kafka_bootstrap], {}, list(topics.values()))
    counts = {name: infos[topic].partitions for name, topic in topics.items()}
    internal = internal_partitions(None, SHARDS)  # the default: gcd(32, 64)
    assert counts == {**dict.fromkeys(names, PARTITIONS), "internal": internal, "changelog": 64}

    registry = tmp_path / "registry.toml"
    registry.write_text(REGISTRY_TOML)
    dirs = [tmp_path / f"member-{k}" for k in range(2)]
    logs = [tmp_path / f"member-{k}.log" for k in range(2)]
    envs = [
        {
            **member_env(kafka_bootstrap, registry, topics, 2, k),
            "TSI_TOPIC_CHANGELOG": topics["changelog"],
        }
        for k in range(2)
    ]
    procs = [start_member(envs[k], dirs[k], logs[k]) for k in range(2)]
    requests = 200
    clients = Clients(kafka_bootstrap, topics, requests, 0.01)
    threads = clients.start()
    try:
        wait_answered_and_applied(clients, requests, dirs, procs, logs)
    finally:
        stop_all(clients, threads, procs, logs)

    answers, letters = served(kafka_bootstrap, topics)
    assert letters == []
    assert sorted(answers) == sorted(f"r{i}" for i in range(requests))
    assert all(len(each) == 1 for each in answers.values())
    expected = internal_oracle(kafka_bootstrap, topics["internal"])
    assert {k: comparable(v) for k, v in states_of(dirs).items()} == {
        k: comparable(v) for k, v in expected.items()
    }
    for member, directory in enumerate(dirs):
        layouts = [shard_layout(name) for name in shards_in(shard_store(directory))]
        assert layouts and all(layout is not None for layout in layouts)
        assert {count for _, count in layouts} == {SHARDS}  # shard-NNN-of-064
        assert {index % internal % 2 for index, _ in layouts} == {member}  # its own shards
        assert "INFO tsi serving with 64 shards" in logs[member].read_text()
