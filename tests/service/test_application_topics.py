"""Two services on one broker, each with its own consumer group and the default topic
settings, never share state: each names its changelog from its group, and after losing
its recovery directory rebuilds only its own instances; a service started on another
application's changelog refuses in one line naming both.

The services run as real processes on the project's Kafka broker.
"""

import random
import signal

from flows.service.instances.registry import Registry
from flows.testing.kafka_broker import consume_all, create_topic, unique_topic
from tests.service.streams import (
    REGISTRY_TOML,
    comparable,
    event_stream,
    reference_states,
    service_env,
    start_service,
)
from tests.service.test_changelog_recovery import changelog_states, fresh_directory
from tests.service.test_changelog_resume import produce
from tests.service.test_operating import tsi
from tests.waiting import wait_for


def served(bootstrap, topic, count):
    """Whether ``topic`` holds ``count`` selections."""
    return sum(map(len, consume_all(bootstrap, topic, timeout=5).values())) >= count


def one_service(bootstrap, tmp_path, name, seed):
    """A service of group ``name`` on its own input: its env, recovery directory, events."""
    topics = {n: unique_topic(f"{name}-{n}") for n in ("ev", "sel", "dlq")}
    for topic in topics.values():
        create_topic(bootstrap, topic, 2)
    registry = tmp_path / "registry.toml"
    registry.write_text(REGISTRY_TOML)
    env = service_env(bootstrap, registry, topics["ev"], topics["sel"], topics["dlq"])
    env = {k: v for k, v in env.items() if k != "TSI_TOPIC_CHANGELOG"}  # the default name
    env["TSI_GROUP_ID"] = name
    recovery = tmp_path / f"recovery-{name}"
    fresh_directory(recovery)
    events = event_stream(random.Random(seed))
    return env, recovery, events, topics


def serve_until_answered(env, recovery, events, topics, bootstrap):
    """Run the service until every request of ``events`` is answered and its changelog holds
    the states they lead to; killed -9 then."""
    proc = start_service(env, recovery)
    try:
        produce(bootstrap, topics["ev"], events)
        requests = sum(b'"request"' in value for _, value in events)
        wait_for(lambda: served(bootstrap, topics["sel"], requests), proc, 240, "the answers")
        changelog = f"{env['TSI_GROUP_ID']}.changelog"
        want = comparable_all(reference_states(Registry.from_toml(REGISTRY_TOML), events))
        wait_for(
            lambda: comparable_all(changelog_states(bootstrap, changelog)) == want,
            proc,
            240,
            "the changelog holding the answered states",
        )
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def test_two_services_with_their_own_groups_rebuild_only_their_own_state(
    kafka_bootstrap, tmp_path, monkeypatch
):
    monkeypatch.delenv("TSI_TOPIC_CHANGELOG", raising=False)
    registry = Registry.from_toml(REGISTRY_TOML)
    names = [unique_topic("app-a"), unique_topic("app-b")]
    apps = [
        one_service(kafka_bootstrap, tmp_path, n, s) for n, s in zip(names, (1, 2), strict=True)
    ]
    for env, recovery, events, topics in apps:
        serve_until_answered(env, recovery, events, topics, kafka_bootstrap)
    expected = [reference_states(registry, events) for _, _, events, _ in apps]
    assert expected[0] != expected[1]  # the same keys, other learned states

    for name, states in zip(names, expected, strict=True):
        held = changelog_states(kafka_bootstrap, f"{name}.changelog")
        assert set(held) == set(states)
        for key, state in states.items():
            assert comparable(held[key]) == comparable(state), (name, key)

    env, recovery, events, topics = apps[0]
    fresh_directory(recovery)  # A's directory lost: only its changelog holds its shards
    proc = start_service(env, recovery)
    try:  # a new request for every unit: each instance is rebuilt, then answers
        again = (b'"request_id":"r', b'"request_id":"again-r')
        more = [(key, value.replace(*again)) for key, value in events[-24:]]
        produce(kafka_bootstrap, topics["ev"], more)
        mine = comparable_all(reference_states(registry, events + more))
        changelog = f"{names[0]}.changelog"
        wait_for(
            lambda: comparable_all(changelog_states(kafka_bootstrap, changelog)) == mine,
            proc,
            240,
            "A's rebuilt states",
        )
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def comparable_all(states):
    """``states`` with each state in the form two runs' states compare in."""
    return {key: comparable(state) for key, state in states.items()}


def test_a_start_on_another_applications_changelog_refuses_in_one_line(
    kafka_bootstrap, tmp_path, monkeypatch
):
    monkeypatch.delenv("TSI_TOPIC_CHANGELOG", raising=False)
    owner, intruder = unique_topic("owner"), unique_topic("intruder")
    env, recovery, events, topics = one_service(kafka_bootstrap, tmp_path, owner, 3)
    serve_until_answered(env, recovery, events, topics, kafka_bootstrap)
    other = tmp_path / "other"
    args = ["run", "--registry", tmp_path / "registry.toml", "--brokers", kafka_bootstrap]
    args += ["--events-topic", topics["ev"], "--selections-topic", topics["sel"]]
    args += ["--dlq-topic", topics["dlq"], "--recovery-dir", other, "--group-id", intruder]
    args += ["--changelog-topic", f"{owner}.changelog", "--log-file", tmp_path / "run.log"]
    ended = tsi(*args, timeout=180)
    assert ended.returncode == 2, ended.stderr[-2000:]
    said = ended.stderr.strip().splitlines()[-1]
    assert f"application {owner!r}, not of {intruder!r}" in said, ended.stderr[-2000:]
    assert "Traceback" not in ended.stderr
