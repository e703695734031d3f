"""Members with a changelog on the real broker: the member count changed by a restart
(1 to 2 and back, the new member from an empty directory, the first member from its old
one), and a member's disk lost under load (killed -9, its directory deleted). Each ends
with every request answered (an answer sent again is the same one), no dead letter (no
feedback refused), and every instance's state equal to the oracle of the internal topic
(``members_live.internal_oracle``: each event applied once, in order), in the changelog
and in the members' recovery directories."""

import shutil
import signal

from tests.service.members_live import (
    Clients,
    changelog_env,
    changelog_setup,
    comparable,
    internal_oracle,
    served,
    start_member,
    states_of,
    stop_member,
    wait_until,
)
from tests.service.test_changelog_recovery import changelog_states


def applied(dirs):
    return sum(s["bandit"]["n_updates"] for s in states_of(dirs).values())


def assert_as_uninterrupted(bootstrap, topics, changelog, dirs, clients, requests):
    answers, letters = served(bootstrap, topics)
    assert letters == []  # no feedback refused (arm_mismatch, duplicate, unknown, ...)
    assert sorted(answers) == sorted(f"r{i}" for i in range(requests))
    assert all(len(each) == 1 for each in answers.values())  # an answer sent again: the same
    assert all(len(each) == 1 for each in clients.answers.values())
    expected = {k: comparable(v) for k, v in internal_oracle(bootstrap, topics["internal"]).items()}
    held = changelog_states(bootstrap, changelog)
    assert {k: comparable(v) for k, v in held.items()} == expected
    assert {k: comparable(v) for k, v in states_of(dirs).items()} == expected
    assert sum(s["bandit"]["n_updates"] for s in held.values()) == requests  # once each


def test_members_rescale_by_restart_from_one_to_two_and_back(kafka_bootstrap, tmp_path):
    requests = 500
    topics, changelog, registry = changelog_setup(kafka_bootstrap, tmp_path)
    first, second = tmp_path / "member-0", tmp_path / "member-1"
    clients = Clients(kafka_bootstrap, topics, requests, 0.03)
    threads = clients.start()
    procs = []
    try:
        for phase, (members, dirs, until) in enumerate(
            [(1, [first], 100), (2, [first, second], 300), (1, [first], requests)]
        ):
            envs = [
                changelog_env(kafka_bootstrap, registry, topics, changelog, members, k)
                for k in (0, 1)
            ]
            logs = [tmp_path / f"phase{phase}-{k}.log" for k in range(members)]
            procs = [(start_member(envs[k], dirs[k], logs[k]), logs[k]) for k in range(members)]
            wait_until(lambda n=until: clients.answered() >= n, 180, procs)
            if until == requests:
                wait_until(lambda: applied([first]) == requests, 120, procs)
            for proc, log in procs:
                stop_member(proc, log)
                assert "no clean end" not in log.read_text()  # the last epoch committed
    finally:
        clients.stop.set()
        for thread in threads:
            thread.join()
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
    assert "rebuilt from its changelog" in (tmp_path / "phase1-1.log").read_text()
    back = (tmp_path / "phase2-0.log").read_text()
    assert "other members served" in back and "rebuilt from its changelog" in back
    assert_as_uninterrupted(kafka_bootstrap, topics, changelog, [first], clients, requests)


def test_a_member_that_loses_its_disk_under_load_loses_nothing(kafka_bootstrap, tmp_path):
    requests = 500
    topics, changelog, registry = changelog_setup(kafka_bootstrap, tmp_path)
    dirs = [tmp_path / f"member-{k}" for k in range(2)]
    logs = [tmp_path / f"member-{k}.log" for k in range(2)]
    envs = [changelog_env(kafka_bootstrap, registry, topics, changelog, 2, k) for k in range(2)]
    procs = [start_member(envs[k], dirs[k], logs[k]) for k in range(2)]
    clients = Clients(kafka_bootstrap, topics, requests, 0.03)
    threads = clients.start()
    try:
        wait_until(lambda: clients.answered() >= 150, 120, list(zip(procs, logs, strict=True)))
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait()
        shutil.rmtree(dirs[1])  # its disk lost: a new, empty volume
        procs[1] = start_member(envs[1], dirs[1], logs[1])
        running = list(zip(procs, logs, strict=True))
        wait_until(lambda: clients.answered() == requests, 180, running)
        wait_until(lambda: applied(dirs) == requests, 120, running)
    finally:
        clients.stop.set()
        for thread in threads:
            thread.join()
        for proc, log in zip(procs, logs, strict=True):
            stop_member(proc, log)
    assert all("no clean end" not in log.read_text() for log in logs)
    assert "rebuilt from its changelog" in logs[1].read_text()
    assert_as_uninterrupted(kafka_bootstrap, topics, changelog, dirs, clients, requests)
