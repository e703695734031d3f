"""Wake-ups from one queue per worker instead of Bytewax's per-key timers."""

import dataclasses
import doctest
import gc
import heapq
import math
import sys
import threading
import time

import orjson
import pytest
from bytewax.testing import run_main
from hypothesis import given, settings
from hypothesis import strategies as st

from flows.service.connectors.memory import memory_wiring
from flows.service.dataflow import Wiring, build_flow
from flows.service.instances import _deadline_queue
from flows.service.instances.registry import Registry
from flows.service.shards.deadlines import WAKE_UP, DeadlineQueue, WakeUpScheduler
from flows.service.shards.logic import logic_builder
from flows.service.wire.events import Origin, parse_request
from flows.service.wire.keys import shard_of

REGISTRY = Registry.from_toml('[experiments.e]\narms = ["a", "b"]\nfeedback_ttl = 5\n')


def request(rid, unit=None):
    body = {"experiment": "e", "request_id": rid} | ({"unit": unit} if unit else {})
    return parse_request(orjson.dumps(body), Origin("t", 0, 1))


def test_the_queue_drops_superseded_wishes_and_forgets_keys():
    """Each ticket answered before its TTL leaves a superseded wish in the heap: they do
    not pile up (at 10^5 tickets a second and a one-hour TTL, 10^8 entries)."""
    q = DeadlineQueue()
    for i in range(100_000):
        q.want(f"k{i % 100}", 3600.0 + i)  # the ticket's deadline
        q.want(f"k{i % 100}", 1.0 + i)  # its answer's, earlier
        assert q.due(1.0 + i) == [f"k{i % 100}"]
    assert q.queued <= 2 * len(q) + 65
    q.want("gone", 5.0)
    q.forget("gone")
    assert q.due(1e9) == [] and q.next() is None


def test_the_queue_wakes_each_key_once_at_its_earliest_wish():
    q = DeadlineQueue()
    q.want("a", 5.0)
    q.want("b", 3.0)
    q.want("a", 4.0)  # earlier: replaces 5.0
    q.want("b", 9.0)  # later: b is still woken at 3.0, and wishes again then
    q.want("c", None)  # nothing to wake
    assert q.next() == 3.0 and len(q) == 2
    assert q.due(2.9) == []
    assert q.due(4.0) == ["b", "a"]
    assert q.next() is None and q.due(100.0) == []  # the superseded 5.0 is not a wake-up
    q.want("a", 6.0)
    assert q.due(6.0) == ["a"]


class QueueModel:
    """What the queue promises, without a heap: each key's earliest wish since it was
    last woken or forgotten; due keys in (time, key) order."""

    def __init__(self) -> None:
        self.wished: dict[str, float] = {}

    def want(self, key: str, at: float | None) -> None:
        if at is not None and (key not in self.wished or at < self.wished[key]):
            self.wished[key] = at

    def forget(self, key: str) -> None:
        self.wished.pop(key, None)

    def due_times(self, now: float) -> list[tuple[float, str]]:
        out = sorted((at, key) for key, at in self.wished.items() if at <= now)
        for _, key in out:
            del self.wished[key]
        return out

    def next(self) -> float | None:
        return min(self.wished.values(), default=None)


KEYS = st.sampled_from(["a", "b", "c", "shard-001", "home\x1fu1", "é"])
TIMES = st.integers(0, 40).map(lambda t: t / 4)  # ties are common: the key breaks them
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("want"), KEYS, st.one_of(st.none(), TIMES)),
        st.tuples(st.just("forget"), KEYS),
        st.tuples(st.just("due_times"), TIMES),
        st.tuples(st.just("next")),
    ),
    max_size=300,
)


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_the_compiled_queue_keeps_the_promises_of_its_model(ops):
    """Any sequence of wishes, forgets and wake-ups: the same answers as the model, the
    heap bounded by the rebuild (the keys' references let go: see the refcount test)."""
    queue, model = DeadlineQueue(), QueueModel()
    for name, *args in ops:
        assert getattr(queue, name)(*args) == getattr(model, name)(*args), (name, args)
        assert len(queue) == len(model.wished)
        assert queue.queued <= 2 * len(queue) + 65
    assert queue.due(math.inf) == [key for _, key in model.due_times(math.inf)]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.tuples(TIMES, KEYS), st.just("pop")), max_size=400))
def test_a_time_heap_pops_as_a_heapq_of_tuples(ops):
    """Pushes and pops in any order, ties on time common: the same pairs in the same order
    as ``heapq`` on (time, key) tuples, which the heaps of deadlines were."""
    heap, reference = _deadline_queue.TimeHeap(), []
    for op in ops:
        if op == "pop":
            if not reference:
                with pytest.raises(IndexError):
                    heap.pop()
                continue
            assert heap.first() == reference[0] and heap.first_time() == reference[0][0]
            assert heap.pop() == heapq.heappop(reference)
        else:
            heap.push(*op)
            heapq.heappush(reference, op)
        assert len(heap) == len(reference) and sorted(heap) == sorted(reference)


def test_a_time_heap_holds_its_keys_and_lets_them_go():
    key = "".join(["r", "id"])  # a string of its own, not interned
    before = sys.getrefcount(key)
    heap = _deadline_queue.TimeHeap()
    for at in range(100):  # grows, then shrinks as it empties
        heap.push(float(at), key)
    assert sys.getrefcount(key) == before + 100
    while len(heap) > 3:
        heap.pop()
    assert sys.getrefcount(key) == before + 3 and not gc.is_tracked(heap)
    del heap
    assert sys.getrefcount(key) == before


def test_the_compiled_queue_holds_each_key_while_queued_and_lets_it_go():
    key = "".join(["k", "ey"])  # a string of its own, not interned
    before = sys.getrefcount(key)
    queue = DeadlineQueue()
    for at in (5.0, 4.0, 3.0):
        queue.want(key, at)
    assert sys.getrefcount(key) > before
    assert queue.due(10.0) == [key] and queue.next() is None
    assert sys.getrefcount(key) == before, "every heap entry gave its reference back"
    queue.want(key, 1.0)
    del queue
    assert sys.getrefcount(key) == before


def test_the_compiled_queue_doctests():
    """pytest's --doctest-modules does not read compiled modules: run them here."""
    result = doctest.testmod(_deadline_queue)
    assert result.attempted > 0 and result.failed == 0


def test_each_worker_thread_has_its_own_queue():
    scheduler = WakeUpScheduler()
    mine = scheduler.queue()
    mine.want("here", 1.0)
    seen = []
    other = threading.Thread(target=lambda: seen.append(len(scheduler.queue())))
    other.start()
    other.join()
    assert seen == [0] and scheduler.queue() is mine and mine.due(1.0) == ["here"]


def test_each_scheduler_has_its_own_queues_on_one_thread():
    first, second = WakeUpScheduler(), WakeUpScheduler()
    first.queue().want("here", 1.0)
    assert len(second.queue()) == 0 and second.queue() is not first.queue()
    assert first.queue().due(1.0) == ["here"]


def test_a_logic_on_wake_ups_asks_the_queue_not_bytewax_and_expires_on_its_wake_up():
    now, scheduler = [100.0], WakeUpScheduler()
    logic = logic_builder(REGISTRY, clock=lambda: now[0], wake_ups=scheduler, rest_after=1e9)(None)
    experiment = logic.store.context.registry.current["e"]
    logic.handle([("e", experiment, request("r1"))])
    assert logic.notify_at() is None  # no per-key timer for Bytewax to scan
    assert scheduler.queue().next() == 105.0
    now[0] = 106.0
    assert scheduler.queue().due(now[0]) == [shard_of("e")]  # one wake-up for the shard
    out = logic.handle([(shard_of("e"), None, WAKE_UP)])
    assert [d.reason for d in out] == ["ticket_expired"]
    window = experiment.retry_window  # the expired answer is kept this long for retries
    assert window > 0 and scheduler.queue().next() == now[0] + window


def test_a_restored_instance_queues_its_deadline_on_the_worker_that_builds_it():
    before, after = WakeUpScheduler(), WakeUpScheduler()
    logic = logic_builder(REGISTRY, clock=lambda: 0.0, wake_ups=before)(None)
    logic.handle([("e", logic.store.context.registry.current["e"], request("r1"))])
    snapshot = logic.snapshot()
    logic_builder(REGISTRY, clock=lambda: 0.0, wake_ups=after)(snapshot)
    assert after.queue().next() == 5.0


def test_an_unbounded_flow_expires_tickets_from_its_wake_ups():
    """Requests with a 1 s time to live, no feedback: their tickets expire while the flow
    runs (the wake-up source ends 3 s in, the inputs long before)."""
    registry = Registry.from_toml('[experiments.e]\narms = ["a", "b"]\nfeedback_ttl = 1\n')
    raw = [orjson.dumps({"experiment": "e", "request_id": f"r{i}"}) for i in range(5)]
    selections, dead = [], []
    requests = [(r, Origin("t", 0, i)) for i, r in enumerate(raw)]
    wiring = memory_wiring(requests, [], selections, dead)
    started = time.time()
    ending = lambda: time.time() > started + 3.0  # noqa: E731
    unbounded = Wiring(dataclasses.replace(wiring.inputs, ending=ending), wiring.outputs)
    run_main(build_flow(registry, unbounded, snapshots=False))
    letters = [orjson.loads(d) for _, d in dead]
    assert len(selections) == 5
    assert sorted(d["reason"] for d in letters) == ["ticket_expired"] * 5
