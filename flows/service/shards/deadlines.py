"""Wake-ups of the instances one worker holds, in one queue per worker.

Bytewax keeps every key's ``notify_at`` in one map and scans all of it at each activation
of the stateful step, so an event's cost grows with the keys waiting (bench/RESULTS.md,
"Figures behind the code": deadline heaps and wake-ups). The unbounded service uses
this queue instead: each worker keeps one heap of (time, key), a
source on the same worker (``WakeUps``) pops what is due and
sends each key a ``WAKE_UP`` event, and the key's logic handles it like any other event.
An event's cost does not depend on how many tickets are open.

``WakeUpScheduler`` holds one flow's queues: ``flows.service.dataflow.build_flow`` makes
one per flow and hands it to both sides, the shards' logic (which wishes its next wake-up
into it) and the ``WakeUps`` source (which reads it). Bytewax runs all of a worker's
operators on one thread, so each worker's shards and its wake-up source share the queue
of that thread; two flows in one process share nothing.

``WakeUps`` is that source: one partition per worker, which looks again at the next
wake-up and at least every ``period`` seconds (on stream time the stream may reach a
deadline the wall clock passed long ago). The period is short, 10 ms: Bytewax closes an
epoch only when every input has moved past it, and the stateful step holds the next
epoch's events until then, so a source that slept for a second would hold every answer
arriving at an epoch's close that long: the tail of the decision latency
(bench/RESULTS.md, "after the compiled kernel and wake-ups"). Looking at the heap's head
every 10 ms costs little of a core when idle (the same section). Only unbounded flows
use it;
it ends when their inputs end (``ending`` says so), so that the flow can end. The queue
itself is compiled (``flows.service.instances._deadline_queue``): shards keep one too, told of every
event's new deadline.

>>> scheduler = WakeUpScheduler()
>>> q = scheduler.queue()
>>> q.want("shard-001", 3.0); q.due(4.5)
['shard-001']
>>> WakeUpScheduler().queue() is q  # another flow's scheduler: another queue
False
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta

from bytewax.inputs import DynamicSource, StatelessSourcePartition

from flows.service.instances._deadline_queue import DeadlineQueue

__all__ = ["WAKE_UP", "DeadlineQueue", "WakeUpScheduler", "WakeUps"]


class WakeUpScheduler:
    """One flow's wake-up queues, one per worker: each worker's shards wish into it and
    the worker's ``WakeUps`` partition pops what is due (see the module). ``first``: the
    shards woken as the flow starts (by the first worker's partition, once), so that
    each of them starts then, not at its first event (``build_flow``: those a start
    restores)."""

    def __init__(self, first: Iterable[str] = ()) -> None:
        self._workers = threading.local()  # this scheduler's queue of each worker thread
        self.first = tuple(first)

    def queue(self) -> DeadlineQueue:
        """The queue of the worker running on this thread: Bytewax runs all of a worker's
        operators on one thread, so a key's logic and the wake-up source that serves it
        (the key's own worker) share it."""
        queue = getattr(self._workers, "queue", None)
        if queue is None:
            queue = self._workers.queue = DeadlineQueue()
        return queue


WAKE_UP = "wake-up"  # the event a key receives when its wake-up is due


class _WakeUps(StatelessSourcePartition[tuple[str, str]]):
    def __init__(
        self,
        scheduler: WakeUpScheduler,
        now: Callable[[], float],
        ending: Callable[[], bool],
        period: float,
        first: tuple[str, ...] = (),
    ) -> None:
        self._scheduler = scheduler  # its queue of the worker this runs on
        self._now = now
        self._ending = ending
        self._period = period
        self._first = first  # woken at the first batch (``WakeUpScheduler.first``)

    def next_batch(self) -> list[tuple[str, str]]:
        if self._ending():
            raise StopIteration
        first, self._first = self._first, ()
        due = [*first, *self._scheduler.queue().due(self._now())]
        return [(key, WAKE_UP) for key in due]

    def next_awake(self) -> datetime:
        head = self._scheduler.queue().next()
        wait = self._period if head is None else min(self._period, max(0.0, head - self._now()))
        return datetime.now(UTC) + timedelta(seconds=wait)


class WakeUps(DynamicSource[tuple[str, str]]):
    """(key, ``WAKE_UP``) for every key whose wake-up time ``now()`` has reached in
    ``scheduler``'s queue of each worker, until ``ending()`` is true."""

    def __init__(
        self,
        scheduler: WakeUpScheduler,
        ending: Callable[[], bool],
        now: Callable[[], float] = time.time,
        period: float = 0.01,
    ) -> None:
        self._scheduler = scheduler
        self._ending = ending
        self._now = now
        self._period = period

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _WakeUps:
        first = self._scheduler.first if worker_index == 0 else ()
        return _WakeUps(self._scheduler, self._now, self._ending, self._period, first)
