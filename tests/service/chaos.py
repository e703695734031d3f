"""A fault campaign on the real broker: members serving clients while random faults strike
(a member killed -9, also while it restores; its directory lost; a rescale 1 <-> 2 <-> 3
by restart; the broker killed -9 and started again, or paused with SIGSTOP), then a check
that nothing was lost, doubled or changed.

``Campaign(...).run()`` returns a ``Verdict``: every request answered, every answer to a
request id byte-identical, every feedback applied once (the rounds and updates the
changelog holds equal the requests), each instance's state equal to an uninterrupted run
of the internal topic (``members_live.internal_oracle``), no dead letter, and no member
that stopped on its own. ``bench/chaos.py`` runs it for minutes and several seeds; a short
seeded run is a test (``test_chaos.py``).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from flows.testing.kafka_broker import restart_broker
from tests.service.members_live import (
    Clients,
    changelog_env,
    changelog_setup,
    comparable,
    internal_oracle,
    served,
    start_member,
)
from tests.service.test_changelog_recovery import changelog_states

#: The faults a campaign draws from, by name (``Campaign.faults``).
FAULTS = ("kill", "kill_restoring", "lose_directory", "rescale", "broker_kill", "broker_pause")
#: Seconds the campaign waits, after its faults, for every answer and every feedback.
SETTLE_S = 300.0


@dataclass
class Verdict:
    """What a campaign found: the counts that must be 0, and what happened."""

    requests: int
    unanswered: int  # requests never answered
    changed: int  # request ids answered with different bytes
    lost_rounds: int  # requests answered that the final state does not hold
    extra_rounds: int  # requests the final state holds more than once
    lost_updates: int  # feedback sent that the final state did not apply
    extra_updates: int  # feedback applied more than once
    unlike_oracle: int  # instances whose state differs from an uninterrupted run's
    dead_letters: dict[str, int]  # by reason
    stopped_on_their_own: list[str]  # a member's exit the campaign did not cause
    faults: list[str]  # what struck, in order, with when (seconds from the start)

    def clean(self) -> bool:
        """Nothing lost, doubled or changed, no dead letter, no member stopped itself."""
        counts = (self.unanswered, self.changed, self.lost_rounds, self.extra_rounds)
        counts += (self.lost_updates, self.extra_updates, self.unlike_oracle)
        return not any(counts) and not self.dead_letters and not self.stopped_on_their_own


@dataclass
class Member:
    proc: subprocess.Popen
    log: Path
    directory: Path


@dataclass
class Campaign:
    """``seconds`` of faults drawn by ``seed`` from ``faults`` on the broker of
    ``broker_dir`` (the broker's faults need it), members 1 to ``max_members``, clients
    asking every ``pace`` seconds; files under ``work``."""

    bootstrap: str
    broker_dir: Path | None
    work: Path
    seed: int
    seconds: float
    pace: float = 0.02
    max_members: int = 3
    faults: tuple[str, ...] = FAULTS
    gap: tuple[float, float] = (2.0, 8.0)  # seconds between two faults
    cover: bool = False  # each fault once first (in the seed's order), then drawn
    script: tuple[str, ...] = ()  # faults played first, in order ("rescale:1": to 1)
    first_count: int | None = None  # members at the start (None: drawn)
    members: dict[int, Member] = field(default_factory=dict)
    count: int = 1
    started: float = 0.0
    struck: list[str] = field(default_factory=list)
    unasked: list[str] = field(default_factory=list)
    starts: int = 0

    def run(self) -> Verdict:
        """Serve, strike, settle, check."""
        rng = random.Random(self.seed)
        requests = int(self.seconds / self.pace)
        self.topics, self.changelog, self.registry = changelog_setup(self.bootstrap, self.work)
        self.count = self.first_count or rng.randint(1, self.max_members)
        self.clients = Clients(self.bootstrap, self.topics, requests, self.pace)
        self.started = time.monotonic()
        self._start_all()
        threads = self.clients.start()
        try:
            self._strike(rng)
            self._settle(requests)
        finally:
            self.clients.stop.set()
            for thread in threads:
                thread.join()
            self._stop_all(signal.SIGTERM)
        return self._verdict(requests)

    # ---------------------------------------------------------------- members
    def _directory(self, k: int) -> Path:
        return self.work / f"member-{k}"

    def _start(self, k: int) -> None:
        env = changelog_env(
            self.bootstrap, self.registry, self.topics, self.changelog, self.count, k
        )
        self.starts += 1
        log = self.work / f"member-{k}-start-{self.starts}.log"
        self.members[k] = Member(
            start_member(env, self._directory(k), log), log, self._directory(k)
        )

    def _start_all(self) -> None:
        for k in range(self.count):
            self._start(k)

    def _stop(self, k: int, how: signal.Signals) -> None:
        member = self.members.pop(k)
        if member.proc.poll() is None:
            member.proc.send_signal(how)
        try:
            member.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            member.proc.kill()
            member.proc.wait()
            self.unasked.append(f"member {k} did not stop on {how.name} in 90 s")

    def _stop_all(self, how: signal.Signals) -> None:
        for k in list(self.members):
            self._stop(k, how)

    def _check_members(self) -> None:
        """A member that ended without being told: noted (with its log's end), restarted."""
        for k, member in list(self.members.items()):
            if member.proc.poll() is not None:
                tail = member.log.read_text(errors="replace")[-600:] if member.log.exists() else ""
                self.unasked.append(f"member {k} exited {member.proc.returncode}: {tail}")
                del self.members[k]
                self._start(k)

    # ---------------------------------------------------------------- faults
    def _strike(self, rng: random.Random) -> None:
        end = self.started + self.seconds
        plan = list(self.script)
        plan += rng.sample(self.faults, len(self.faults)) if self.cover else []
        while time.monotonic() < end or plan:
            self._pause(rng.uniform(*self.gap))
            fault = plan.pop(0) if plan else rng.choice(self.faults)
            self.struck.append(f"{time.monotonic() - self.started:.0f}s {fault}")
            name, _, count = fault.partition(":")  # "rescale:2": to that count
            getattr(self, f"_{name}")(rng, *map(int, filter(None, [count])))

    def _pause(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self._check_members()
            time.sleep(min(0.5, max(0.0, end - time.monotonic())))

    def _kill(self, rng: random.Random) -> None:
        k = rng.randrange(self.count)
        self._stop(k, signal.SIGKILL)
        self._pause(rng.uniform(0.0, 3.0))
        self._start(k)

    def _kill_restoring(self, rng: random.Random) -> None:
        """Killed, started, and killed again while it starts (restores), then started."""
        k = rng.randrange(self.count)
        self._stop(k, signal.SIGKILL)
        self._start(k)
        time.sleep(rng.uniform(0.5, 4.0))
        self._stop(k, signal.SIGKILL)
        self._start(k)

    def _lose_directory(self, rng: random.Random) -> None:
        k = rng.randrange(self.count)
        self._stop(k, signal.SIGKILL)
        shutil.rmtree(self._directory(k), ignore_errors=True)
        self._start(k)

    def _rescale(self, rng: random.Random, to: int | None = None) -> None:
        """Every member stopped (killed -9 or told to stop), then another count started
        (``to``, else drawn): the members it keeps on their directories, a new one on an
        empty one."""
        self._stop_all(rng.choice([signal.SIGKILL, signal.SIGTERM]))
        others = [n for n in range(1, self.max_members + 1) if n != self.count]
        self.count = to or rng.choice(others)
        self._start_all()

    def _broker_pid(self) -> int:
        assert self.broker_dir is not None, "the broker's faults need its data directory"
        return int((self.broker_dir / "broker.pid").read_text())

    def _broker_kill(self, rng: random.Random) -> None:
        pid = self._broker_pid()
        os.kill(pid, signal.SIGKILL)
        while _alive(pid):
            time.sleep(0.1)
        time.sleep(rng.uniform(2.0, 10.0))
        restart_broker(self.broker_dir)

    def _broker_pause(self, rng: random.Random) -> None:
        pid = self._broker_pid()
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(rng.uniform(2.0, 8.0))
        finally:
            os.kill(pid, signal.SIGCONT)

    # ---------------------------------------------------------------- the check
    def _settle(self, requests: int) -> None:
        """Until every request is answered and the changelog holds every feedback."""
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline:
            self._check_members()
            if self.clients.answered() == requests and self._applied() == requests:
                return
            time.sleep(1.0)

    def _applied(self) -> int:
        try:
            states = changelog_states(self.bootstrap, self.changelog)
        except Exception:  # the broker may be starting again: asked later
            return -1
        return sum(s["bandit"]["n_updates"] for s in states.values())

    def _verdict(self, requests: int) -> Verdict:
        answers, letters = served(self.bootstrap, self.topics)
        held = changelog_states(self.bootstrap, self.changelog)
        oracle = internal_oracle(self.bootstrap, self.topics["internal"])
        rounds = sum(s["bandit"]["n_rounds"] for s in held.values())
        updates = sum(s["bandit"]["n_updates"] for s in held.values())
        unlike = {k for k in held.keys() | oracle.keys() if k not in held or k not in oracle}
        unlike |= {
            k for k in held.keys() & oracle.keys() if comparable(held[k]) != comparable(oracle[k])
        }
        return Verdict(
            requests=requests,
            unanswered=sum(f"r{i}" not in answers for i in range(requests)),
            changed=sum(len(each) > 1 for each in answers.values()),
            lost_rounds=max(0, requests - rounds),
            extra_rounds=max(0, rounds - requests),
            lost_updates=max(0, requests - updates),
            extra_updates=max(0, updates - requests),
            unlike_oracle=len(unlike),
            dead_letters=dict(Counter(letter["reason"] for letter in letters)),
            stopped_on_their_own=list(self.unasked),
            faults=list(self.struck),
        )


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
