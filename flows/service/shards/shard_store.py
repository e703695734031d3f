"""A shard's instances and where they live: live, resting, and the shard's log.

One ``ShardStore`` per shard composes its tiers as Kafka Streams layers a cache over a
store over a changelog: live ``Instance`` objects (the cache; which changed when:
``generations``), resting records (``instances.resting``), with recovery the shard's log
(``shard_log``), and with a changelog the layer that mirrors the log's writes and guards
the input (``changelog_layer``). An instance unchanged for a generation is put to rest
(and written ahead of the epoch's close); an epoch's close appends what changed since
last written. The store knows nothing of Bytewax: the adapter (``logic.ShardLogic``)
maps Bytewax's calls onto it.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flows.service.instances._deadline_queue import TimeHeap
from flows.service.instances.instance import Instance, Output
from flows.service.instances.registry import Experiment, LiveRegistry
from flows.service.instances.resting import Entry, Resting, entry_of, open_tickets, revive
from flows.service.observe.held import hold
from flows.service.observe.metrics import observe_expired, observe_restored
from flows.service.observe.restoring import RESTORING
from flows.service.observe.stream_clock import StreamClock
from flows.service.shards import _event_loop as event_loop
from flows.service.shards.changelog import Changelog, encode, shard_index
from flows.service.shards.changelog_layer import ChangelogLayer, Routed
from flows.service.shards.deadlines import DeadlineQueue, WakeUpScheduler
from flows.service.shards.generations import Generations
from flows.service.shards.shard_log import ShardLog
from flows.service.wire.events import DeadLetter, Origin
from flows.service.wire.keys import DEFAULT_SHARDS, of_layout, shard_of, split_key

log = logging.getLogger(__name__)


#: Seconds without an event after which an instance is put to rest (packed; with a shard
#: log, written to it): a generation of the shard's changed keys turns every ``REST_AFTER``
#: seconds, and what the last one changed and the current one has not is settled a few
#: keys per call. An epoch's close then writes only what changed in the last one or two
#: generations, and without recovery it does nothing at all.
REST_AFTER = 1.0
SETTLE_BASE = 64
#: New instances (keys a shard holds no state for) that a flow's shards create, all
#: together, in a generation: each shard's generation turns before ``REST_AFTER`` has
#: passed once it has created its share (``new_per_generation``). A flood of new users
#: (an experiment's launch, a bench's load) then keeps about three generations of them
#: live as Python objects, whatever the shard count, instead of ``REST_AFTER`` seconds'
#: worth at the input's rate. The peak matters during the flood (the process's high-water
#: mark) and after it: CPython keeps the pools a peak filled (an arena goes back to the
#: system only when emptied entirely), and they stay in the RSS beside the resting
#: instances (bench/RESULTS.md, "a flood of new users no longer leaves its peak in the
#: RSS", and "the live instances of a flood, bounded per flow"). Instances built from
#: their resting bytes do not count: users coming back often would otherwise turn
#: generations that put them to rest again, every event a revival.
NEW_LIVE = 4096
#: The fewest new instances that turn a shard's generation, however many shards share
#: ``NEW_LIVE``: a generation's turn costs set operations over its keys.
NEW_MIN = 16
#: Seconds an instance holding several answers kept for retries stays live after its
#: newest answer: a user who comes back within it is served live; one gone longer rests
#: with its answers as compact tuples (a fraction of its live bytes), and its next return
#: pays a revival and a rest (bench/RESULTS.md, "users resting with their kept answers").
LINGER = 60.0
#: Seconds ahead within which a deadline counts as an instance's next change: the calls
#: do not write such an instance ahead of the epoch's close (see ``ShardLogic._settle``).
CHANGE_NEAR = 5.0


def new_per_generation(shards: int) -> int:
    """New instances after which a shard of a flow of ``shards`` shards turns its
    generation early: its share of ``NEW_LIVE``, at least ``NEW_MIN``.

    >>> new_per_generation(128), new_per_generation(1), new_per_generation(10**6)
    (32, 4096, 16)
    """
    if shards < 1:
        raise ValueError(f"a flow has at least one shard, got {shards!r}")
    return max(NEW_MIN, NEW_LIVE // shards)


@dataclass(frozen=True)
class FlowContext:
    """What every shard of one dataflow shares: the registry, the clock, whether
    snapshots are built (recovery on), whether the flow runs on event time, and the stream
    clock (the Kafka service: an event's time is its Kafka timestamp and tickets expire on
    stream time, see ``flows.service.observe.stream_clock``)."""

    registry: LiveRegistry
    clock: Callable[[], float] = time.time
    snapshots: bool = True
    event_time: bool = False
    stream: StreamClock | None = None
    # wake-ups from the worker's queue of this flow's scheduler instead of Bytewax timers
    wake_ups: WakeUpScheduler | None = None
    # with snapshots: the directory of the shards' logs (``flows.service.shards.shard_log``);
    # None puts each shard's whole state in its Bytewax snapshot (tests, small flows)
    store: Path | None = None
    rest_after: float = REST_AFTER  # see REST_AFTER; 0 settles at every call
    # with a store: each shard's log mirrored to its changelog (``shards.changelog``)
    changelog: Changelog | None = None
    # members: whether this member holds a shard index (``Members.holds``); None: all
    holds: Callable[[int], bool] | None = None
    shards: int = DEFAULT_SHARDS  # the flow's shard count (``runtime.shard_count``)
    # an upgrade from keys of one shard each: their resumed states, by shard, until the
    # key group holding the shard takes it (``group_logic.Retired``), and the shards a group
    # has snapshotted since (whose old keys may then go)
    handover: dict[str, dict[str, Any]] = field(default_factory=dict)
    adopted: set[str] = field(default_factory=set)


class ShardStore:
    """The instances of one shard, in tiers: live (``Instance`` objects), resting (packed
    bytes in C tables, ``resting.Resting``), with recovery the shard's log
    (``shard_log.ShardLog``), with a changelog its layer (``changelog``). Instances are
    created on their first event (which names the experiment) and kept with one queue
    of their deadlines.

    What it offers its callers (the Bytewax adapter ``logic.ShardLogic``, the compiled
    event loop, tests and benchmarks): ``handle`` events, ``bind`` (get an instance:
    live, revived, or new), ``changed`` (mark one changed), ``expire_due`` and ``wake``
    (what is due), ``wake_at`` (when next), ``finish`` (the end of the input) and
    ``send_epoch`` then ``settle_epoch`` (an epoch's close, in two phases: what the log
    must hold, and where the changelog stands once it acknowledged it; ``close_stores``
    closes many shards with one wait). Settling (putting to
    rest, writing ahead of the close) runs inside those calls, a few keys at a time.

    On event time (replays, the demo) ``now`` is the event's own ``ts`` (else the clock),
    an instance's deadlines pass when its next event or the end of the input passes them:
    the same input gives the same output.

    The registry may change under an instance (a restart with an edited file, or a live
    reload): it follows its experiment's new definition on restore or on its next event
    (``Instance.follow``). The state of an experiment removed from the registry is kept
    as it is (archived: snapshotted unchanged, shown by ``tsi inspect``) and comes back
    to life if the experiment returns.

    >>> from flows.service.instances.registry import LiveRegistry, Registry
    >>> from flows.service.wire.events import Origin, parse_request
    >>> live = LiveRegistry(Registry.from_toml('[experiments.e]\\narms = ["a", "b"]'))
    >>> store = ShardStore(FlowContext(live, clock=lambda: 0.0, snapshots=False))
    >>> event = parse_request(b'{"experiment":"e","request_id":"r1"}', Origin("t"))
    >>> [answer] = store.handle([("e", live.current["e"], event)])
    >>> answer.round, 0.0 < store.wake_at() <= 1.0  # to settle what it changed
    (1, True)
    """

    def __init__(self, context: FlowContext, resume: dict[str, Any] | None = None) -> None:
        self.context = context
        self.shard: str | None = None  # known from the resume state, or the first event
        self.instances: dict[str, Instance] = {}
        self.resting = Resting()  # saved, not built: idle, or of an experiment not in force
        self.deadlines = DeadlineQueue()  # instance keys, by their next deadline
        self.generations = Generations()  # which live instances changed when (``_settle``)
        self.new_per_generation = new_per_generation(context.shards)  # turns it early
        self.touched = self.generations.touched  # the same set, for the compiled loop
        self.lingering = TimeHeap()  # (when to look again, key) of those kept live (LINGER)
        self.lingers: dict[str, float] = {}  # each one's time in the heap (older ones: stale)
        self.log: ShardLog | None = None
        self.loop: Any = None  # what the compiled loop keeps between calls (_event_loop)
        self.problems: list[DeadLetter] = []  # what went wrong restoring, handed out once
        self.foreign: list[Entry] = []  # a shard of another shard count: kept as they are
        self.changelog: ChangelogLayer | None = None  # its log's mirror, and the guard
        self.dormant: dict[str, Any] | None = None  # resumed, another member's: kept as is
        hold(self)  # counted live and resting (``tsi_instances_live``, ``_resting``)
        if resume:
            self._start(resume["shard"], resume)

    def _start(self, shard: str, resume: dict[str, Any] | None) -> None:
        """Become shard ``shard``, with its saved entries: in the resume state itself, in
        the shard's log up to the resume state's marker, or (no resume state) its seed.
        The cyclic GC is held while the entries load: they are many young objects, and
        its full collections would be most of a restart's time (bench/RESULTS.md, "shards
        and batches": restart of 10^6 instances)."""
        collecting = gc.isenabled()
        gc.disable()
        try:
            self._load(shard, resume)
        finally:
            if collecting:
                gc.enable()
        RESTORING.note(shard)  # serves without more restore work (``/ready`` waits for it)

    def _load(self, shard: str, resume: dict[str, Any] | None) -> None:
        self.shard = shard
        holds = self.context.holds
        if resume is not None and holds is not None and not holds(shard_index(shard)):
            self.dormant = resume  # not loaded, never woken, never written: when this
            return  # member holds it again, its changelog says whether it is stale
        if resume is not None and "entries" in resume:
            entries = {entry.key: entry for entry in resume["entries"]}
        elif self.context.store is not None and self.context.snapshots:
            self.log = ShardLog(self.context.store, shard)
            entries, problem = self.log.resume(None if resume is None else resume["store"])
            if self.context.changelog is not None and of_layout(shard, self.context.shards):
                layer = ChangelogLayer(self.context.changelog)  # kept once begun
                entries, problem, rebuilt = layer.begin(shard, entries, problem, resume)
                self.changelog = layer
                if rebuilt:  # a new generation holds what the changelog gave
                    self.log.fresh = True
                    log.warning("%s: rebuilt from its changelog, %d instances", shard, len(entries))
            elif problem is not None:
                problem = f"the shard's log is damaged, {len(entries)} instances read: {problem}"
            if problem is not None:
                self._lost(problem)
            if self.log.fresh:  # a base now, so that resting can write within the first epoch
                self.log.compact(list(entries.values()))
        else:
            entries = {}
        if not of_layout(shard, self.context.shards):  # no event is routed here: kept as is
            self.foreign = list(entries.values())
            detail = (
                f"{len(entries)} instances kept unserved: {shard} is a shard of another shard "
                f"count (this flow has {self.context.shards}); move the state with `tsi state "
                "export` and `tsi state import`, which put each instance in its shard"
            )
            self._lost(detail, "foreign_shard")
        else:
            for entry in entries.values():
                self._resume(entry)

    def _lost(self, detail: str, reason: str = "state_lost") -> None:
        log.error("%s: %s", self.shard, detail)
        letter = DeadLetter(reason, detail, b"", Origin("recovery"), self.shard)
        self.problems.append(letter)

    def _resume(self, entry: Entry) -> None:
        experiment = self.context.registry.current.get(entry.experiment)
        if experiment is None:
            log.warning("instance %r archived: its experiment left the registry", entry.key)
            self.resting.put(entry)
            observe_restored(entry.experiment)
            return
        if self.resting.take(entry):  # idle, or waiting on entries: built on its next event
            observe_restored(entry.experiment, pending=open_tickets(entry))
            return
        try:
            instance = revive(entry, experiment)
        except Exception as exc:  # kept as it is: its events get internal_error letters
            self.resting.put(entry)
            self._lost(f"instance {entry.key!r} cannot be restored ({exc}); its state is kept")
            return
        self.instances[instance.key] = instance
        observe_restored(entry.experiment, instance)
        self.deadlines.want(instance.key, self._due(instance))

    def handle(self, events: list[Routed]) -> list[Output]:
        """Handle events in order; their outputs (and problems found restoring) in order."""
        out: list[Output] = []
        if self.problems:
            out, self.problems = self.problems, []
        if self.shard is None and events and self.context.changelog is not None:
            key, experiment, _ = events[0]  # a wake-up's key is its shard (a start's)
            first = key if experiment is None else shard_of(key, self.context.shards)
            self._start(first, None)  # rebuilt, if it is, before the guard
            out += self.problems
            self.problems = []
        if self.changelog is not None:
            events = self.changelog.admit(events, self._now, self._held)
        out += event_loop.handle(self, events)
        self._settle(len(events))
        return out

    def _held(self, key: str, experiment: Experiment) -> Instance | None:
        """Instance ``key`` for the guard (``ChangelogLayer.admit``): live, or built from
        its resting bytes and live from then on; None if not held or not built."""
        instance = self.instances.get(key)
        if instance is None:
            entry = self.resting.pop(key)
            if entry is None:
                return None
            try:
                instance = self._built(experiment, key, entry)
            except Exception:  # kept as it was (``_built``); the request is applied already
                return None
            self.changed(key)  # live now: settled and woken as any other
        return instance

    # What the compiled loop (``flows.service.shards._event_loop``) uses of a shard: ``instances``,
    # ``touched``, ``deadlines``, ``context`` and the three methods below.
    def changed(self, key: str) -> None:
        """An event reached instance ``key``: snapshot it, and wake it at its next deadline."""
        if key in self.instances:
            self.touched.add(key)
            self.deadlines.want(key, self._due(self.instances[key]))

    def bind(self, experiment: Experiment, key: str) -> tuple[Instance, bool]:
        """The first event of a key since the shard started: a saved instance built, or
        a new one (True)."""
        if self.shard is None:
            self._start(shard_of(key, self.context.shards), None)
            if key in self.instances:  # from the seed
                return self.instances[key], False
        entry = self.resting.pop(key)
        return self._built(experiment, key, entry), entry is None

    def _built(self, experiment: Experiment, key: str, entry: Entry | None) -> Instance:
        """A new instance of ``key`` (no entry), or ``entry`` revived, now live; an entry
        that cannot be revived is kept as it was, and the error raised."""
        if entry is None:
            instance = Instance(experiment, key)
            self.generations.created += 1
        else:
            try:
                instance = revive(entry, experiment)
            except Exception:
                self.resting.put(entry)  # kept as it was
                raise
        self.instances[key] = instance
        return instance

    def _now(self) -> float:
        """What a wake-up or the end of the input expires against: the stream time, or
        the clock."""
        stream = self.context.stream
        return self.context.clock() if stream is None else stream.now()

    def _due(self, instance: Instance) -> float | None:
        """When an instance wants to be woken: now for dead letters waiting to be handed
        out, else its next deadline."""
        return self._now() if instance.has_notices() else instance.next_deadline()

    def expire_due(self) -> list[Output]:
        """Expire what is due in the instances whose deadline has come, live or resting
        (built first, unless a kept answer is all there is to drop), in the order of their
        deadlines."""
        out: list[Output] = []
        now = self._now()
        woken = [(self._deadline_of(key, at), key) for at, key in self.deadlines.due_times(now)]
        resting = self.resting.due(now)
        dropped: list[Entry] = []
        for _, key in sorted(woken + resting):
            instance = self.instances.get(key)
            if instance is None and (instance := self._woken(key, now, dropped)) is None:
                continue
            done = instance.take_notices() + instance.expire(now)
            observe_expired(instance, done)  # never raises
            out += done
            self.touched.add(key)
            self.deadlines.want(key, self._due(instance))
        if dropped and self.log is not None:  # as the calls write what they put to rest
            self._logged(dropped)
        return out

    def _deadline_of(self, key: str, wished: float) -> float:
        """When a woken key is due: a live instance's own next deadline (a wake-up wished
        earlier, for an entry since gone, would put it out of its deadlines' order)."""
        instance = self.instances.get(key)
        due = None if instance is None else instance.next_deadline()
        return wished if due is None else due

    def _woken(
        self, key: str, now: float | None = None, dropped: list[Entry] | None = None
    ) -> Instance | None:
        """A resting instance whose deadline has come, built; None if it is not held or
        its experiment left the registry (kept as it is, archived). With ``dropped``, a
        record that holds nothing but a kept answer due by ``now`` is not built: the
        answer is dropped in the record (``Resting.drop_answer``: the same state, no
        output, no unpack and pack), its idle entry added to ``dropped``, and None."""
        experiment = self.context.registry.current.get(split_key(key)[0])
        entry = self.resting.pop(key)  # read once, whichever way it goes
        if entry is None:
            return None
        if experiment is None:
            self.resting.put(entry)
            return None
        if dropped is not None:
            idle = self.resting.drop_answer(entry, now, experiment.packing)
            if idle is not None:
                self.resting.take(idle)
                dropped.append(idle)
                return None
        try:
            return self._built(experiment, key, entry)
        except Exception as exc:  # kept as it was (see _built)
            self._lost(f"instance {key!r} cannot be restored ({exc}); its state is kept")
            return None

    def _next_deadline(self) -> float | None:
        """The earliest deadline of the shard's instances, live or resting."""
        live, resting = self.deadlines.next(), self.resting.next_deadline()
        return live if resting is None else resting if live is None else min(live, resting)

    def wake_at(self) -> float | None:
        """When the shard next wants to be woken: now for problems to hand out, else its
        earliest deadline, or sooner to settle what its last events changed."""
        return self._now() if self.problems else self._sooner(self._next_deadline())

    def _sooner(self, due: float | None) -> float | None:
        """``due``, or sooner if instances wait to be put to rest (now) or the generation
        should turn, or an instance kept live (``lingering``) is due to be looked at again:
        a shard no event reaches still settles what its last events changed."""
        if len(self.lingering):  # (conditionals, not min and max: this runs every call)
            linger = self.lingering.first_time()
            due = linger if due is None or linger < due else due
        wait = self.generations.wait(self.context.rest_after)
        if wait is None:
            return due
        settle = self._now() + wait
        return settle if due is None or settle < due else due

    def _settle(self, handled: int) -> None:
        """Put to rest the instances no event changed for a generation (``REST_AFTER``
        seconds, or fewer if ``new_per_generation`` new instances came first): at most
        ``SETTLE_BASE`` and two per event just handled, so the cost is spread over the
        calls and keeps up with the keys they touch. With a log, what is put to rest is
        written first unless it is ``clean`` (``generations.Generations``: a touched key
        is neither written nor put to rest). Within the same budget, the keys an epoch's
        close wrote (``saved``) are put to rest, and the keys the last generation changed
        are written (``unwritten``), so that the close, which holds every answer, has only
        the newest changes left to write; not those whose next change is likely near
        (``_changes_before``): written now and again soon, they would cost twice the bytes."""
        writing = self.log is not None and self.context.snapshots
        generations, clock = self.generations, time.monotonic()
        rest_after, created = self.context.rest_after, generations.created
        if clock - generations.turned >= rest_after or created >= self.new_per_generation:
            generations.turn(clock, writing)
        budget = SETTLE_BASE + 2 * handled
        if generations.settling:
            keys = generations.take_settling(budget, self.instances)
            if keys:
                if writing:
                    self._write([key for key in keys if key not in generations.clean])
                generations.clean.difference_update(keys)
                self._put_to_rest([self.instances[key] for key in keys])
                budget -= len(keys)
        if generations.saved and budget > 0:
            clean, taken = generations.take_saved(budget)
            self._put_to_rest([self.instances[key] for key in clean if key in self.instances])
            budget -= taken
        if len(self.lingering) and budget > 0:  # those kept live whose time has come
            now = self._now()
            while len(self.lingering) and budget > 0 and self.lingering.first_time() <= now:
                at, key = self.lingering.pop()
                budget -= 1
                if self.lingers.get(key) != at:  # pushed again later: that one counts
                    continue
                del self.lingers[key]
                if key not in self.touched and key in self.instances:
                    self._put_to_rest([self.instances[key]])
        if generations.unwritten and budget > 0:
            keys = generations.take_unwritten(budget, self.instances)
            soon, live = self._now() + CHANGE_NEAR, self.instances
            keys = [k for k in keys if not _changes_before(live[k], soon)]
            self._write(keys)
            generations.clean.update(keys)

    def _write(self, keys: list[str]) -> None:
        """Write the live instances ``keys`` to the log within an epoch."""
        if keys:
            self._logged([entry_of(self.instances[key]) for key in keys])

    def _logged(self, entries: list[Entry]) -> None:
        """Write ``entries`` to the log within an epoch, and to the changelog."""
        self.log.write(self._encoded(entries))

    def _encoded(self, entries: list[Entry]) -> bytes:
        """The log's records of ``entries``: one record for all of them, or, with a
        changelog, one each, each also sent to it (``ChangelogLayer.write``)."""
        return encode(entries) if self.changelog is None else self.changelog.write(entries)

    def _linger(self, key: str, until: float) -> None:
        """Keep ``key`` live until ``until``: one entry in the heap per key and time, not one
        per try to put it to rest (a generation's turn tries every second)."""
        if self.lingers.get(key) != until:
            self.lingers[key] = until
            self.lingering.push(until, key)

    def _put_to_rest(self, instances: list[Instance]) -> None:
        """Pack ``instances`` and hold the idle ones and those waiting on entries as
        bytes (one no longer live, e.g. named twice: two closes may save a key twice, is
        left as it is); one holding several kept answers, the newest less than
        ``LINGER`` old, stays live until then (``lingering``)."""
        now = None
        for instance in instances:
            if self.instances.get(instance.key) is not instance:
                continue
            newest = instance.newest_answer()
            if newest is not None:
                now = self._now() if now is None else now
                if newest + LINGER > now:
                    self._linger(instance.key, newest + LINGER)
                    continue
            instance.rest()
            if self.resting.put_instance(instance):  # its deadline, if any, goes with it
                del self.instances[instance.key]
                self.deadlines.forget(instance.key)

    def wake(self) -> list[Output]:
        """A timer's call: what is due, and problems found restoring; and resting."""
        out, self.problems = self.problems + self.expire_due(), []
        self._settle(0)
        return out

    def finish(self) -> list[Output]:
        """On event time, the end of the input is the last moment: expire what is due."""
        out, self.problems = self.problems, []
        if self.context.event_time:  # built, to expire below
            for key in self.resting.waiting():
                self._woken(key)
        for key in sorted(self.instances):
            instance = self.instances[key]
            done = instance.take_notices()
            if self.context.event_time:
                done += instance.expire(self.context.clock())
            observe_expired(instance, done)  # never raises
            out += done
        return out

    def _all_entries(self) -> list[Entry]:
        live = [entry_of(i) for i in self.instances.values()]
        return live + self.resting.entries() + self.foreign

    def send_epoch(self) -> dict[str, Any] | None:
        """An epoch's close, its first phase: the shard's state for recovery, the instances
        changed since they were last written, appended to the shard's log
        (``context.store``; the snapshot is the log's marker), else the whole shard; with a
        changelog, they and the epoch's marker are sent, not waited for (``settle_epoch``
        completes the state). Bytewax asks for it at every epoch close, for every key
        touched, recovery or not: without recovery nothing is built, and resting goes on at
        its own pace (``_settle``). With a log, the instances written here are put to rest
        by the calls that follow (``saved``): the close holds every answer."""
        if not self.context.snapshots or self.shard is None:
            self._settle(0)
            return None
        if self.dormant is not None:
            return self.dormant
        keys, unwritten = self.generations.close()
        changed = [self.instances[key] for key in keys if key in self.instances]
        dirty = [i for i in changed if i.key in unwritten]
        if self.log is None:
            state = {"shard": self.shard, "entries": self._all_entries()}
        elif self.log.wants_compaction:
            if self.changelog is not None:  # the changed entries to it: it compacts itself
                self.changelog.write(list(map(entry_of, dirty)))
            state = {"shard": self.shard, "store": self.log.compact(self._all_entries())}
        elif dirty:
            records = self._encoded(list(map(entry_of, dirty)))
            state = {"shard": self.shard, "store": self.log.append(records)}
        else:
            state = {"shard": self.shard, "store": self.log.marker}
        if self.changelog is not None:
            self.changelog.send_mark()
        if self.log is None:
            self._put_to_rest(changed)
        else:  # at the pace of the calls that follow: the close is the latency's tail
            self.generations.written([instance.key for instance in changed])
        return state

    def settle_epoch(
        self, state: dict[str, Any] | None, offset: int | None
    ) -> dict[str, Any] | None:
        """An epoch's close, its second phase, once the changelog acknowledged what
        ``send_epoch`` sent (``offset``: its marker's, None if it sent none): ``state``
        with where the changelog now stands."""
        if state is not None and self.changelog is not None and self.dormant is None:
            state["changelog"] = self.changelog.settled(offset)
        return state


def close_stores(changelog: Changelog | None, stores: list[ShardStore]) -> list[Any]:
    """An epoch's close of ``stores`` together: each sends its epoch
    (``ShardStore.send_epoch``), the ``changelog`` is waited for once for all of them
    (``Changelog.settle``: raises if anything was refused), then each state is completed
    (``settle_epoch``); their states, in order.

    >>> from flows.service.instances.registry import LiveRegistry, Registry
    >>> live = LiveRegistry(Registry.from_toml('[experiments.e]\\narms = ["a", "b"]'))
    >>> close_stores(None, [ShardStore(FlowContext(live, snapshots=False))])
    [None]
    """
    states = [store.send_epoch() for store in stores]
    sent = [store for store in stores if store.changelog is not None and store.changelog.sent]
    offsets: dict[int, int | None] = {}
    if sent and changelog is not None:
        acknowledged = changelog.settle([store.changelog.mirror for store in sent])
        offsets = dict(zip(map(id, sent), acknowledged, strict=True))
    return [
        store.settle_epoch(state, offsets.get(id(store)))
        for store, state in zip(stores, states, strict=True)
    ]


def _changes_before(instance: Instance, soon: float) -> bool:
    """Whether ``instance`` will likely change before ``soon``: a selection waits for its
    feedback, or a deadline (an expiry, a kept answer's end) comes first."""
    if instance.awaits_feedback():
        return True
    due = instance.next_deadline()
    return due is not None and due <= soon
