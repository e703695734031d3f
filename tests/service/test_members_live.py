"""Members on the real broker (``tsi run --members N --member K``): two members serve as
one process does, and one member killed with -9 stops only its own partitions.

Each run is compared with the oracle of its internal topic (``members_live.internal_oracle``):
every instance's state equals the Python instance fed its internal partition's copies in
order, so no feedback was lost or applied twice, whichever member served it.
"""

import signal
import subprocess
import time

from tests.service.members_live import (
    PARTITIONS,
    REGISTRY,
    TSI,
    Clients,
    comparable,
    home,
    internal_oracle,
    make_topics,
    member_env,
    served,
    start_member,
    states_of,
    stop_all,
    wait_answered_and_applied,
    wait_until,
)


def run_members(bootstrap, tmp_path, members, requests, pace):
    """Serve ``requests`` from clients with ``members`` members until every answer is out
    and every feedback applied; (topics, recovery dirs, clients)."""
    topics = make_topics(bootstrap)
    registry = tmp_path / "registry.toml"
    registry.write_text(REGISTRY)
    dirs = [tmp_path / f"m{members}-{k}" for k in range(members)]
    logs = [tmp_path / f"m{members}-{k}.log" for k in range(members)]
    envs = [member_env(bootstrap, registry, topics, members, k) for k in range(members)]
    procs = [start_member(envs[k], dirs[k], logs[k]) for k in range(members)]
    clients = Clients(bootstrap, topics, requests, pace)
    threads = clients.start()
    try:
        wait_answered_and_applied(clients, requests, dirs, procs, logs)
    finally:
        stop_all(clients, threads, procs, logs)
    return topics, dirs, clients


def test_two_members_serve_as_one_process_does(kafka_bootstrap, tmp_path):
    requests = 400
    runs = {n: run_members(kafka_bootstrap, tmp_path, n, requests, 0.01) for n in (1, 2)}
    for topics, dirs, _ in runs.values():
        answers, letters = served(kafka_bootstrap, topics)
        assert letters == []
        assert sorted(answers) == sorted(f"r{i}" for i in range(requests))
        assert all(len(each) == 1 for each in answers.values())  # re-emits identical
        states = states_of(dirs)
        expected = internal_oracle(kafka_bootstrap, topics["internal"])
        assert {k: comparable(v) for k, v in states.items()} == {
            k: comparable(v) for k, v in expected.items()
        }
        assert sum(s["bandit"]["n_updates"] for s in states.values()) == requests
    _, (one, two), _ = runs[2]
    held = [set(states_of([d])) for d in (one, two)]
    assert all(held)  # both members served instances, each its own
    for member, keys in enumerate(held):
        assert {home(int(key.split("\x1fu")[1]), 2) for key in keys} == {member}
    assert set(states_of(runs[1][1])) == held[0] | held[1]


def test_one_member_killed_stops_only_its_partitions_and_resumes_exactly_once(
    kafka_bootstrap, tmp_path
):
    requests, down_s = 600, 6.0
    topics = make_topics(kafka_bootstrap)
    registry = tmp_path / "registry.toml"
    registry.write_text(REGISTRY)
    dirs = [tmp_path / f"member-{k}" for k in range(2)]
    logs = [tmp_path / f"member-{k}.log" for k in range(2)]
    envs = [member_env(kafka_bootstrap, registry, topics, 2, k) for k in range(2)]
    procs = [start_member(envs[k], dirs[k], logs[k]) for k in range(2)]
    clients = Clients(kafka_bootstrap, topics, requests, 0.03)
    threads = clients.start()
    try:
        wait_until(lambda: clients.answered() >= 100, 120, list(zip(procs, logs, strict=True)))
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait()
        killed_at = time.monotonic()
        time.sleep(down_s)  # deliberate: the member stays down this long; asserted on timestamps
        restarted_at = time.monotonic()
        with clients.lock:
            asked = dict(clients.asked)
            first_seen = dict(clients.first_seen)
        procs[1] = start_member(envs[1], dirs[1], logs[1])
        wait_answered_and_applied(clients, requests, dirs, procs, logs)
    finally:
        stop_all(clients, threads, procs, logs)
    # while member 1 was down: member 0 answered its own instances' requests, and only those
    during = {
        rid: home(unit, 2)
        for rid, (unit, when) in asked.items()
        if killed_at <= when < restarted_at - 2.0  # asked with time to be answered
    }
    answered_down = {rid for rid, at in first_seen.items() if killed_at <= at < restarted_at}
    mine = {rid for rid, member in during.items() if member == 0}
    print(  # the measure (pytest -s): bench/RESULTS.md, "Members"
        f"member 1 down {restarted_at - killed_at:.1f} s: member 0 answered "
        f"{len(answered_down)} requests, {len(mine & answered_down)} of the {len(mine)} of "
        f"its instances asked then; {len(during) - len(mine)} of member 1's waited"
    )
    assert mine and mine <= answered_down, (len(mine), len(mine & answered_down))
    assert not {rid for rid, member in during.items() if member == 1} & answered_down
    # after its restart: every request answered once, every feedback applied once
    answers, letters = served(kafka_bootstrap, topics)
    assert letters == []
    assert sorted(answers) == sorted(f"r{i}" for i in range(requests))
    assert all(len(each) == 1 for each in answers.values())
    assert all(len(each) == 1 for each in clients.answers.values())
    states = states_of(dirs)
    expected = internal_oracle(kafka_bootstrap, topics["internal"])
    assert {k: comparable(v) for k, v in states.items()} == {
        k: comparable(v) for k, v in expected.items()
    }
    assert sum(s["bandit"]["n_updates"] for s in states.values()) == requests


def test_members_refuse_a_topic_with_fewer_partitions_than_members(kafka_bootstrap, tmp_path):
    topics = make_topics(kafka_bootstrap)  # PARTITIONS each
    registry = tmp_path / "registry.toml"
    registry.write_text(REGISTRY)
    env = member_env(kafka_bootstrap, registry, topics, PARTITIONS + 1, 0)
    done = subprocess.run(
        [str(TSI), "run", "--no-recovery"], env=env, capture_output=True, timeout=120, check=False
    )
    assert done.returncode == 2, done.stderr.decode()[-2000:]
    said = done.stderr.decode().strip().splitlines()[-1]
    assert said.startswith("tsi run: topic ") and f"fewer than the {PARTITIONS + 1} members" in said
    assert any(f"topic {topics[name]} " in said for name in ("requests", "feedback", "internal"))
