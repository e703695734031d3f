"""One invariant for every restore and resume, checked by a stateful model (in memory: no
broker, no Bytewax run): for every shard, the state restored and the input positions
resumed from come from the same committed epoch, or the state includes the input up to
its ``Marker.seen`` and the shard drops what it reads again below it (``guard``).

The model runs the shards' real logic (``ShardLogic``, their logs on disk, a
``MemoryChangelog``) and models the rest as the service derives it: input partitions
(one per shard: partition p feeds shard p, read by the member that ``owns`` it, which
``holds`` the shard), Bytewax's recovery store per member directory (each epoch's
snapshots, the committed epoch lagging the newest by up to ``LAG`` epochs, a restart
resuming from it), the consumer group's commits (each close commits the positions of
the member's previous close, ``kafka_source._ObservedPartition.snapshot``), and a
directory without a commit resuming at the group's offsets when the changelog holds
records (``process.Service._seeds``), else from the start. Members are killed at any
point (before a first commit, between the changelog's acknowledgement and Bytewax's
commit, during a restore), lose their directories, and the service is rescaled by a
restart. After every step, each shard's state equals an uninterrupted oracle's for the
same input and every answer to a request id is the oracle's.
"""

from __future__ import annotations

import copy
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from flows.service.connectors.members import Members
from flows.service.shards.changelog import MemoryChangelog
from flows.service.shards.logic import ShardLogic, logic_builder
from flows.service.wire.events import DeadLetter, Origin, parse_feedback, parse_request
from flows.service.wire.keys import instance_key, shard_index, shard_name
from tests.service.test_changelog import NOW, REGISTRY, STEP, states

SHARDS = 3
UNITS = [3, 5, 0, 1, 4, 6]  # two units of each shard (``shard_index``: 0, 0, 1, 1, 2, 2)
LAG = 3  # epochs a Bytewax commit lags the newest by (at most ``KEPT_EPOCHS``)
LOST_REASONS = {"state_lost", "foreign_shard", "internal_error"}


@dataclass(frozen=True)
class Kill:
    """How a member dies: what its shards sent unacknowledged reaches the changelog
    (``delivered``) or not, and whether its recovery directory is lost with it."""

    delivered: bool = True
    lost: bool = False


@dataclass(frozen=True)
class Restart:
    """How a restart goes: killed again (``then``) after ``stop`` shards restored and
    events served (None: not), an epoch closing (Bytewax's commit lagging by ``lag``)
    after the catch-up's events at ``closes``."""

    stop: int | None = None
    closes: frozenset[int] = frozenset()
    lag: int = 0
    then: Kill = Kill()


WHO = st.integers(0, 2)  # a member (modulo their count)
CUTS = st.sampled_from([None, None, "before markers", "before commit"])
KILLS = st.builds(Kill, st.booleans(), st.booleans())
RESTARTS = st.builds(
    Restart,
    st.none() | st.integers(0, 6),
    st.frozensets(st.integers(0, 6), max_size=2),
    st.integers(0, LAG),
    KILLS,
)


@dataclass
class Directory:
    """A member's recovery directory: its shards' logs, and Bytewax's store (each
    epoch's snapshots merged over the epochs before: shards' and input positions)."""

    path: Path
    epochs: list[tuple[dict[str, Any], dict[int, int]]] = field(default_factory=list)
    committed: int | None = None  # the epoch a restart resumes from


@dataclass
class Member:
    """One running member: its positions (next offset per owned partition), its shards'
    logic, and the positions of its last close (what its next close commits)."""

    members: Members
    directory: Directory
    positions: dict[int, int] = field(default_factory=dict)
    logics: dict[str, ShardLogic] = field(default_factory=dict)
    done: dict[int, int] | None = None


class StateModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="tsi-model-"))
        self.changelog = MemoryChangelog()
        self.partitions: list[list[tuple]] = [[] for _ in range(SHARDS)]
        self.group: dict[int, int] = {}  # the consumer group's committed offsets
        self.oracles = {shard_name(s, SHARDS): self._builder(None)(None) for s in range(SHARDS)}
        self.expected: dict[tuple[str, str], tuple] = {}  # the oracle's answers
        self.asked: dict[int, int] = {}
        self.dirs = 0
        self.members = [self._started(Members(1, 0), self._directory())]

    def teardown(self) -> None:
        try:
            for member in self.members:  # every shard started, as its next event would
                for index in range(SHARDS):
                    if member.members.holds(index, SHARDS):
                        self._logic(member, shard_name(index, SHARDS))
            self.check_states()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def _directory(self) -> Directory:
        self.dirs += 1
        return Directory(self.root / f"d{self.dirs}")

    def _builder(self, member: Member | None):
        if member is None:  # the oracle: no store, no changelog
            return logic_builder(REGISTRY, clock=lambda: NOW[0], rest_after=0.0, shards=SHARDS)
        members = member.members
        return logic_builder(
            REGISTRY,
            clock=lambda: NOW[0],
            store=member.directory.path / "shards",
            rest_after=0.0,
            changelog=self.changelog,
            holds=None if members.count == 1 else lambda i: members.holds(i, SHARDS),
            shards=SHARDS,
        )

    def _logic(self, member: Member, shard: str) -> ShardLogic:
        """The member's logic of ``shard``, started as its first event starts it."""
        logic = member.logics.get(shard)
        if logic is None:
            logic = member.logics[shard] = self._builder(member)(None)
        if logic.store.shard is None:
            logic.store._start(shard, None)
        return logic

    # -- input -------------------------------------------------------------------------

    @rule(unit=st.sampled_from(UNITS), kind=st.sampled_from(["request", "request", "feedback"]))
    def arrive(self, unit: int, kind: str) -> None:
        """An event reaches its partition; the oracle and the partition's owner serve it."""
        part = shard_index(instance_key("e", f"u{unit}"), SHARDS)
        index = sum(map(len, self.partitions))
        origin = Origin("in", part, len(self.partitions[part]), 1_000.0 + STEP * index)
        self.asked[unit] = self.asked.get(unit, 0) + (kind == "request")
        body = {"experiment": "e", "unit": f"u{unit}", "request_id": f"r{self.asked[unit]}"}
        if kind == "request":
            event = parse_request(orjson.dumps(body), origin)
        else:
            event = parse_feedback(orjson.dumps({**body, "loss": float(unit % 3)}), origin)
        routed = (instance_key("e", f"u{unit}"), REGISTRY["e"], event)
        self.partitions[part].append(routed)
        NOW[0] = origin.time
        oracle = self.oracles[shard_name(part, SHARDS)]
        for out in oracle.handle([routed]) + oracle.wake():
            if hasattr(out, "arm"):
                self.expected.setdefault((out.instance, out.request_id), (out.arm, out.prob))
        [owner] = [m for m in self.members if m.members.owns(part)]
        self._serve(owner, part)

    def _serve(self, member: Member, part: int) -> None:
        """The member handles the next event of partition ``part`` at its own time."""
        routed = self.partitions[part][member.positions[part]]
        logic = self._logic(member, shard_name(part, SHARDS))
        NOW[0] = routed[2].origin.time
        for out in logic.handle([routed]) + logic.wake():
            assert not (isinstance(out, DeadLetter) and out.reason in LOST_REASONS), out.detail
            if hasattr(out, "arm"):
                answer = (out.instance, out.request_id)
                assert self.expected.get(answer) == (out.arm, out.prob), answer
        member.positions[part] += 1

    # -- epochs ------------------------------------------------------------------------

    @rule(who=WHO, lag=st.integers(0, LAG), cut=CUTS, kill=KILLS, restart=RESTARTS)
    def close(self, who: int, lag: int, cut: str | None, kill: Kill, restart: Restart) -> None:
        """A member's epoch closes; it may be killed between its steps (``cut``)."""
        member = self.members[who % len(self.members)]
        if self._close(member, lag, cut):
            self._kill(member, kill)
            self._restart(member, restart)

    def _close(self, member: Member, lag: int, cut: str | None = None) -> bool:
        """Close an epoch (the input's snapshot with the group commit of the previous
        close, the shards' markers, Bytewax's store and commit); True when killed at
        ``cut``."""
        if member.done is not None:
            self.group.update(member.done)
        member.done = dict(member.positions)
        if cut == "before markers":
            return True
        snapshots = {name: logic.snapshot() for name, logic in member.logics.items()}
        if cut == "before commit":
            return True
        directory = member.directory
        shards, positions = directory.epochs[-1] if directory.epochs else ({}, {})
        shards = {**shards, **{k: copy.deepcopy(v) for k, v in snapshots.items() if v}}
        directory.epochs.append((shards, {**positions, **member.positions}))
        newest = len(directory.epochs) - 1
        if newest - lag >= 0:
            directory.committed = max(directory.committed or 0, newest - lag)
        return False

    # -- failures ----------------------------------------------------------------------

    @rule(who=WHO, kill=KILLS, restart=RESTARTS)
    def kill(self, who: int, kill: Kill, restart: Restart) -> None:
        """A member killed (-9), perhaps with its directory, and restarted."""
        member = self.members[who % len(self.members)]
        self._kill(member, kill)
        self._restart(member, restart)

    def _kill(self, member: Member, kill: Kill) -> None:
        """What its shards sent unacknowledged reaches the changelog or is lost; its
        directory may be lost with it."""
        if kill.delivered:
            self.changelog.deliver()
        else:
            for shard in member.logics:
                self.changelog.sent.pop(shard, None)
        member.logics.clear()
        if kill.lost:
            member.directory = self._directory()

    @rule(
        count=st.integers(1, 3),
        kills=st.lists(KILLS, min_size=3, max_size=3),
        restarts=st.lists(RESTARTS, min_size=3, max_size=3),
    )
    def rescale(self, count: int, kills: list[Kill], restarts: list[Restart]) -> None:
        """Every member killed, restarted as ``count`` members on the first directories."""
        for member, kill in zip(self.members, kills, strict=False):
            self._kill(member, kill)
        dirs = [m.directory for m in self.members] + [self._directory() for _ in range(3)]
        self.members = [Member(Members(count, k), dirs[k]) for k in range(count)]
        for member, restart in zip(self.members, restarts, strict=False):
            self._restart(member, restart)

    def _started(self, members: Members, directory: Directory) -> Member:
        member = Member(members, directory)
        self._resume(member)
        return member

    def _restart(self, member: Member, restart: Restart) -> None:
        """Resume, then catch up with the member's partitions, epochs closing on the way;
        killed again (``restart.stop``) during the restore or the catch-up, perhaps, and
        then restarted to the end."""
        member.done = None
        stop = restart.stop
        built = self._resume(member, stop)
        pending = sorted(
            (routed[2].origin.time, part)
            for part, offset in member.positions.items()
            for routed in self.partitions[part][offset:]
        )
        for at, (_, part) in enumerate(pending):
            if stop is not None and built + at >= stop:
                break
            self._serve(member, part)
            if at in restart.closes:
                self._close(member, restart.lag)
        else:
            if stop is None or built + len(pending) < stop:
                return
        self._kill(member, restart.then)
        self._restart(member, Restart())

    def _resume(self, member: Member, stop: int | None = None) -> int:
        """Bytewax's resume: the committed epoch's shards (each restored now) and input
        positions; a directory without a commit resumes at the group's offsets when the
        changelog holds records (``process.Service._seeds``), else at the start. The
        number of shards restored before ``stop``."""
        directory = member.directory
        owned = [p for p in range(SHARDS) if member.members.owns(p)]
        if directory.committed is not None:
            del directory.epochs[directory.committed + 1 :]
            shards, positions = directory.epochs[directory.committed]
        else:
            directory.epochs.clear()
            shards = {}
            held = any(self.changelog.logs.values())
            positions = self.group if held else {}
        member.positions = {p: positions.get(p, 0) for p in owned}
        for at, (shard, state) in enumerate(sorted(shards.items())):
            if stop is not None and at >= stop:
                return at
            member.logics[shard] = self._builder(member)(copy.deepcopy(state))
        return len(shards)

    # -- the invariant -----------------------------------------------------------------

    @invariant()
    def check_states(self) -> None:
        """Each started shard a member holds is the oracle's for all the input so far
        (every member has caught up with its partitions)."""
        for member in self.members:
            for shard, logic in member.logics.items():
                if logic.store.shard is None or logic.store.dormant is not None:
                    continue
                assert states(logic) == states(self.oracles[shard]), (shard, member.members)


StateModel.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_restore_and_resume_keep_one_invariant = StateModel.TestCase


def run_model(steps):
    """Run ``steps`` ((rule name, its arguments)) on a fresh model, then its teardown."""
    model = StateModel()
    try:
        for name, kwargs in steps:
            getattr(model, name)(**kwargs)
            model.check_states()
    finally:
        model.teardown()


def test_a_restart_from_a_lagging_commit_then_a_lost_directory_loses_nothing():
    """Restarted from a commit older than the group's (the backup interval), the shard
    goes on from its changelog's newer state; its directory then lost, it resumes at the
    group's offsets with that state, not an older one."""
    u = UNITS[0]
    run_model(
        [
            ("arrive", {"unit": u, "kind": "request"}),
            ("close", {"who": 0, "lag": 0, "cut": None, "kill": Kill(), "restart": Restart()}),
            ("arrive", {"unit": u, "kind": "request"}),
            ("close", {"who": 0, "lag": 1, "cut": None, "kill": Kill(), "restart": Restart()}),
            ("arrive", {"unit": u, "kind": "request"}),
            ("close", {"who": 0, "lag": 2, "cut": None, "kill": Kill(), "restart": Restart()}),
            ("kill", {"who": 0, "kill": Kill(), "restart": Restart()}),
            ("kill", {"who": 0, "kill": Kill(lost=True), "restart": Restart()}),
        ]
    )


def test_a_commit_taken_while_a_rebuilt_shard_catches_up_keeps_its_guard():
    """Rebuilt from its changelog, a shard reads again from the group's offsets, behind
    the state it holds; an epoch committed before it has caught up is resumed from its
    local log with the input its state includes still guarded: a request whose kept
    answer has since gone is not served again as a new round."""
    u, other = UNITS[0], UNITS[2]
    plain = {"who": 0, "lag": 0, "cut": None, "kill": Kill(), "restart": Restart()}
    asked = ("arrive", {"unit": u, "kind": "request"})
    later = [("arrive", {"unit": other, "kind": "request"})] * 7  # time passes
    run_model(
        [
            asked,
            ("close", plain),
            asked,
            asked,  # read again after the commit below, as a new round
            *later,
            asked,  # expires it (its answer kept for retries)
            *later,
            asked,  # drops its kept answer
            ("close", plain),
            ("kill", {"who": 0, "kill": Kill(lost=True), "restart": Restart(closes={0})}),
            ("kill", {"who": 0, "kill": Kill(), "restart": Restart()}),
        ]
    )
