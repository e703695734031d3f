"""The test oracle of a shard's event loop (``flows.service.shards._event_loop``): the same
events through ``reference_instance.Instance`` objects, counted as the loop counts, in
plain Python. Instances never rest here (an epoch only packs their bandits): resting is
what the compiled shard must make invisible.

>>> from flows.service.instances.registry import LiveRegistry, Registry
>>> from flows.service.wire.events import Origin, parse_request
>>> live = LiveRegistry(Registry.from_toml('[experiments.e]\\narms = ["a", "b"]'))
>>> shard = ReferenceShard(lambda: 0.0)
>>> event = parse_request(b'{"experiment":"e","request_id":"r1"}', Origin("t"))
>>> [answer] = shard.handle("e", live.current["e"], event)
>>> answer.round
1
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from time import perf_counter
from typing import Any

import orjson

from flows.service.observe.metrics import (
    AGE_BUCKETS,
    APPLIED,
    DECISIONS,
    EARLY,
    EARLY_FEEDBACK,
    INSTANCES,
    LOSSES,
    PENDING,
    PROCESSING_BUCKETS,
    RETRIES,
    REWARDS,
    SLOT_OF_REASON,
    observe_expired,
    thread_tally,
)
from flows.service.observe.stream_clock import StreamClock
from flows.service.wire.events import Request, Selection
from tests.service.reference_instance import Instance


class ReferenceShard:
    """Instances by key, created on their first event, woken in the order of their
    deadlines; every event counted into the thread's tally."""

    def __init__(self, clock: Callable[[], float], stream: StreamClock | None = None) -> None:
        self.clock, self.stream = clock, stream
        self.instances: dict[str, Instance] = {}

    def handle(self, key: str, experiment: Any, event: Any) -> list:
        started = perf_counter()
        instance = self.instances.get(key)
        new = instance is None
        if new:
            instance = self.instances[key] = Instance(experiment, key)
        elif experiment is not instance.experiment:
            instance.follow(experiment)
        notices = instance.take_notices()
        observe_expired(instance, notices)
        now = self.time_of(event)
        if type(event) is Request:
            handled = instance.on_request(event, now)
        else:
            handled = instance.on_feedback(event, now)
        count(experiment.name, event, handled, new, started, now)
        return notices + list(handled)

    def time_of(self, event: Any) -> float:
        origin = event.origin
        if self.stream is None or origin.time is None:
            return self.clock()
        self.stream.note_served(origin.source, origin.partition, origin.time)
        return origin.time

    def wake(self, now: float) -> list:
        """What is due by ``now``, instance by instance in the order of their deadlines."""
        due = []
        for key, instance in self.instances.items():
            at = instance.next_deadline()
            if instance._notices or (at is not None and at <= now):
                due.append((now if instance._notices else at, key))
        out: list = []
        for _, key in sorted(due):
            instance = self.instances[key]
            done = instance.take_notices() + instance.expire(now)
            observe_expired(instance, done)
            out += done
        return out

    def epoch(self) -> None:
        for instance in self.instances.values():
            instance.rest()


def count(experiment: str, event: Any, handled: Any, new: bool, started: float, now: float) -> None:
    """What one event adds to the thread's tally (``_event_loop._Loop.count``)."""
    tally = thread_tally()
    is_request = type(event) is Request
    hist = tally.processing[is_request]
    spent = perf_counter() - started
    hist[bisect_left(PROCESSING_BUCKETS, spent)] += 1
    hist[-1] += spent
    if event.ts is not None:
        tally.last_ts = event.ts
        age = max(now - event.ts, 0.0)
        hist = tally.age[is_request]
        hist[bisect_left(AGE_BUCKETS, age)] += 1
        hist[-1] += age
    c = tally.experiment(experiment)
    c[INSTANCES] += new
    c[PENDING] += handled.pending
    c[EARLY] += handled.early
    c[APPLIED] += handled.applied
    c[EARLY_FEEDBACK] += handled.early > 0
    if not is_request:  # by the field it was given in, read from its JSON
        c[REWARDS if "reward" in orjson.loads(event.raw) else LOSSES] += 1
    for item in handled:
        if type(item) is Selection:
            c[DECISIONS] += 1
            c[RETRIES] += handled.retry
        else:
            slot = SLOT_OF_REASON.get(item.reason)
            if slot is not None:
                c[slot] += 1
