"""Members' state on the real broker: ``tsi state export`` over the members' directories
(after a rescale by restart, member 0's store holds dormant, stale copies of member 1's
shards: never exported), an export moved to another shard count, and rescales under
failure (member 1 killed -9 while it takes its shards over; an internal topic with as many
partitions as shards). Each is compared with the oracle of the internal topic
(``members_live.internal_oracle``: every instance fed its copies once, in order)."""

import signal
import time

from flows.service.instances.resting import state_of
from flows.service.runtime.recovery import committed_entries, read_states
from flows.service.wire.keys import shard_index, shard_of
from flows.tools.member_state import member_dir
from flows.tools.state import export_state, import_state, read_state_file
from tests.service.members_live import (
    PARTITIONS,
    Clients,
    changelog_env,
    changelog_setup,
    comparable,
    internal_oracle,
    served,
    start_member,
    stop_member,
    wait_until,
)
from tests.service.test_changelog_recovery import changelog_states

#: The shard count of these tests' flows: their changelog topic's partitions decide it.
SHARDS = 32


def held_states(dirs):
    """Each member's committed states of the shards it holds (a running service's:
    ``read_states`` takes no lock), merged: no instance in two members."""
    merged = {}
    for directory in dirs:
        member = member_dir(directory)
        states = read_states(directory)
        held = {k: s for k, s in states.items() if member.holds(shard_index(k, SHARDS))}
        assert not merged.keys() & held.keys()
        merged.update(held)
    return merged


def applied(dirs):
    return sum(s["bandit"]["n_updates"] for s in held_states(dirs).values())


def exported(dirs, path):
    """{key: state} of ``tsi state export`` over ``dirs``."""
    export_state(dirs, path)
    _, entries = read_state_file(path)
    return {entry.key: state_of(entry) for entry in entries}


def same(states, expected):
    return {k: comparable(v) for k, v in states.items()} == {
        k: comparable(v) for k, v in expected.items()
    }


def assert_served_as_uninterrupted(bootstrap, topics, changelog, clients, requests):
    """Every request answered (an answer sent again: the same), no dead letter (no feedback
    refused), the changelog equal to the oracle; the oracle, returned."""
    answers, letters = served(bootstrap, topics)
    assert letters == []
    assert sorted(answers) == sorted(f"r{i}" for i in range(requests))
    assert all(len(each) == 1 for each in answers.values())
    assert all(len(each) == 1 for each in clients.answers.values())
    expected = internal_oracle(bootstrap, topics["internal"])
    assert same(changelog_states(bootstrap, changelog), expected)
    assert sum(s["bandit"]["n_updates"] for s in expected.values()) == requests  # once each
    return expected


def serve(bootstrap, tmp_path, topics, changelog, registry, clients, phases):
    """Serve in ``phases`` ((members, dirs, answered by then), ...), each member stopped
    cleanly at its phase's end; once every request is answered, until every feedback is
    applied."""
    procs = []
    try:
        for phase, (members, dirs, until) in enumerate(phases):
            envs = [
                changelog_env(bootstrap, registry, topics, changelog, members, k) for k in (0, 1)
            ]
            logs = [tmp_path / f"phase{phase}-{k}.log" for k in range(members)]
            procs = [(start_member(envs[k], dirs[k], logs[k]), logs[k]) for k in range(members)]
            wait_until(lambda n=until: clients.answered() >= n, 180, procs)
            if until == clients.requests:
                wait_until(lambda d=dirs: applied(d) == clients.requests, 120, procs)
            for proc, log in procs:
                stop_member(proc, log)
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()


def test_export_of_two_members_and_after_a_rescale_equals_the_oracle(kafka_bootstrap, tmp_path):
    requests = 300
    topics, changelog, registry = changelog_setup(kafka_bootstrap, tmp_path, SHARDS)
    first, second = tmp_path / "member-0", tmp_path / "member-1"
    clients = Clients(kafka_bootstrap, topics, requests, 0.02)
    threads = clients.start()
    try:
        phases = [(1, [first], 120), (2, [first, second], requests)]
        serve(kafka_bootstrap, tmp_path, topics, changelog, registry, clients, phases)
    finally:
        clients.stop.set()
        for thread in threads:
            thread.join()
    expected = assert_served_as_uninterrupted(kafka_bootstrap, topics, changelog, clients, requests)
    # member 0's store still holds its old copies of member 1's shards: stale
    stale = {k: s for k, s in read_states(first).items() if shard_index(k, SHARDS) % 2 == 1}
    assert stale and not same(stale, {k: expected[k] for k in stale})
    assert [member_dir(d).partitions for d in (first, second)] == [PARTITIONS, PARTITIONS]
    assert same(exported([first, second], tmp_path / "state.tsi"), expected)
    # moved to another shard count: the same instances, the same bytes, each in its shard
    _, entries = read_state_file(tmp_path / "state.tsi")
    import_state(tmp_path / "state.tsi", [tmp_path / "64"], shards=64)
    moved = committed_entries([tmp_path / "64"])
    assert {k: (e.kind, e.data) for k, e in moved.items()} == {
        e.key: (e.kind, e.data) for e in entries
    }
    names = {p.stem for p in (tmp_path / "64" / "shards").glob("*.seed")}
    assert names == {shard_of(key, 64) for key in moved}


def test_a_member_killed_while_it_takes_its_shards_over_loses_nothing(kafka_bootstrap, tmp_path):
    requests = 400
    topics, changelog, registry = changelog_setup(kafka_bootstrap, tmp_path, SHARDS)
    dirs = [tmp_path / "member-0", tmp_path / "member-1"]
    clients = Clients(kafka_bootstrap, topics, requests, 0.03)
    threads = clients.start()
    envs = [changelog_env(kafka_bootstrap, registry, topics, changelog, 2, k) for k in (0, 1)]
    procs = []
    try:
        serve(kafka_bootstrap, tmp_path, topics, changelog, registry, clients, [(1, dirs[:1], 120)])
        logs = [tmp_path / f"two-{k}.log" for k in (0, 1)]
        procs = [start_member(envs[k], dirs[k], logs[k]) for k in (0, 1)]
        taking_over = lambda: "rebuilt from its changelog" in logs[1].read_text()  # noqa: E731
        wait_until(lambda: logs[1].exists() and taking_over(), 120, [(procs[0], logs[0])])
        procs[1].send_signal(signal.SIGKILL)  # while it rebuilds and takes its shards over
        procs[1].wait()
        time.sleep(2.0)  # deliberate: the member stays down a while; nothing timed is checked
        procs[1] = start_member(envs[1], dirs[1], tmp_path / "two-1-again.log")
        running = [(procs[0], logs[0]), (procs[1], tmp_path / "two-1-again.log")]
        wait_until(lambda: clients.answered() == requests, 240, running)
        wait_until(lambda: applied(dirs) == requests, 120, running)
        for proc, log in running:
            stop_member(proc, log)
    finally:
        clients.stop.set()
        for thread in threads:
            thread.join()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    expected = assert_served_as_uninterrupted(kafka_bootstrap, topics, changelog, clients, requests)
    assert same(held_states(dirs), expected)
    assert same(exported(dirs, tmp_path / "state.tsi"), expected)


def test_an_internal_topic_with_a_partition_per_shard_serves_two_members(kafka_bootstrap, tmp_path):
    requests = 300
    topics, changelog, registry = changelog_setup(
        kafka_bootstrap, tmp_path, SHARDS, internal_partitions=SHARDS
    )
    dirs = [tmp_path / "member-0", tmp_path / "member-1"]
    clients = Clients(kafka_bootstrap, topics, requests, 0.01)
    threads = clients.start()
    try:
        serve(
            kafka_bootstrap, tmp_path, topics, changelog, registry, clients, [(2, dirs, requests)]
        )
    finally:
        clients.stop.set()
        for thread in threads:
            thread.join()
    expected = assert_served_as_uninterrupted(kafka_bootstrap, topics, changelog, clients, requests)
    assert [member_dir(d).partitions for d in dirs] == [SHARDS, SHARDS]
    assert all(held_states([d]) for d in dirs)  # both members served
    assert same(held_states(dirs), expected)
    assert same(exported(dirs, tmp_path / "state.tsi"), expected)
