"""A shard's compiled event loop and instances serve exactly as the Python oracle does.

The same random streams of requests, feedback, retries, duplicates, early and late
feedback, wrong arms, contexts, wake-ups and epoch closes go through a shard and through
``tests/service/reference_shard.py`` (plain Python over ``reference_instance.Instance``):
outputs, instance states and metrics must be the same.
"""

import copy
import doctest
import gc
import pickle
import weakref

import orjson
from hypothesis import example, given, settings
from hypothesis import strategies as st

from flows.service.instances import _answer_book
from flows.service.instances import instance as compiled_instance
from flows.service.instances.instance import Instance, Open
from flows.service.instances.registry import LiveRegistry, Registry
from flows.service.observe.metrics import thread_tally
from flows.service.observe.stream_clock import StreamClock
from flows.service.shards import _event_loop
from flows.service.shards.logic import FlowContext, ShardLogic
from flows.service.shards.shard_store import LINGER
from flows.service.wire.events import Origin, parse_feedback, parse_request
from tests.service.reference_shard import ReferenceShard
from tsi_core import Bandit

REGISTRY = Registry.from_toml(
    """
[experiments.user]
arms = ["a", "b", "c"]
per_unit = true
feedback_ttl = 5
retry_window = 3
seed = 3

[experiments.shared]
arms = ["x", "y"]
feedback_ttl = 4
early_feedback_limit = 2

[experiments.ctx]
arms = ["p", "q"]
competition = { kind = "contextual", n_contexts = 2 }
feedback_ttl = 6
"""
)

UNITS = ("u1", "u2")
RIDS = ("r1", "r2", "r3", "r4")


def message(kind, experiment, unit, rid, loss, arm, context, ts):
    data = {"experiment": experiment, "request_id": rid}
    if unit is not None:
        data["unit"] = unit
    if ts is not None:
        data["ts"] = ts
    if kind == "request":
        if context is not None:
            data["context"] = context
        return data
    data["loss"] = loss
    if arm is not None:
        data["arm"] = arm
    return data


events = st.tuples(
    st.sampled_from(["request", "feedback"]),
    st.sampled_from(["user", "shared", "ctx"]),
    st.sampled_from(UNITS),
    st.sampled_from(RIDS),
    st.floats(-1e6, 1e6, allow_nan=False),
    st.sampled_from([None, None, None, 0, 1, "a", "x", "q", "zz"]),
    st.sampled_from([None, None, 0, 1, 5]),
    st.sampled_from([None, None, 1_700_000_000.0]),
)
steps = st.lists(
    st.one_of(
        events.map(lambda e: ("event", e)),
        st.tuples(st.just("wait"), st.sampled_from([0.5, 2.0, 7.0])),
        st.tuples(st.just("epoch"), st.none()),
    ),
    max_size=60,
)


def run(script, stream_time: bool, rest_after: float = 1e9, reference: bool = False):
    """Outputs, states and metrics of ``script`` through one shard (whose instances rest
    ``rest_after`` seconds after their last change: 0 puts them to rest at every call), or
    through the ``reference`` shard."""
    now = [1_700_000_100.0]
    stream = StreamClock(wall=lambda: now[0]) if stream_time else None
    if stream is not None:
        stream.note_position("t", 0, caught_up=True)
    live = LiveRegistry(REGISTRY)
    if reference:
        oracle = ReferenceShard(lambda: now[0], stream)
    else:
        shard = ShardLogic(FlowContext(live, lambda: now[0], stream=stream, rest_after=rest_after))
    before = copy.deepcopy(thread_tally().experiments)
    counts_before = {k: sum(v[:-1]) for k, v in thread_tally().processing.items()}
    ages_before = copy.deepcopy(thread_tally().age)
    thread_tally().last_ts = 0.0
    outputs = []
    for offset, (kind, what) in enumerate(script):
        if kind == "wait":
            now[0] += what
            wake_at = stream.now() if stream is not None else now[0]
            outputs.append(oracle.wake(wake_at) if reference else shard.wake())
        elif kind == "epoch":
            oracle.epoch() if reference else shard.snapshot()
        else:
            data = message(*what)
            raw = orjson.dumps(data)
            origin = Origin("t", 0, offset, now[0] if stream_time else None)
            parse = parse_request if what[0] == "request" else parse_feedback
            event = parse(raw, origin)
            if not hasattr(event, "request_id"):
                continue  # refused by the parser: never reaches a shard
            experiment = live.current[event.experiment]
            key = experiment.instance_key(event.unit)
            if reference:
                outputs.append(oracle.handle(key, experiment, event))
            else:
                outputs.append(shard.handle([(key, experiment, event)]))
    if reference:
        held = oracle.instances
    else:
        for key in list(shard.store.resting):  # built: their states compared with the oracle's
            shard.store.bind(live.current[key.split("\x1f")[0]], key)
        held = shard.store.instances
    states = {key: instance.to_dict() for key, instance in sorted(held.items())}
    after = thread_tally().experiments
    counted = {
        name: [
            a - b
            for a, b in zip(after[name], before.get(name, [0] * len(after[name])), strict=True)
        ]
        for name in after
    }
    timed = {k: sum(v[:-1]) - counts_before[k] for k, v in thread_tally().processing.items()}
    aged = {
        k: [a - b for a, b in zip(v[:-1], ages_before[k][:-1], strict=True)]
        for k, v in thread_tally().age.items()
    }
    return outputs, states, counted, timed, aged, thread_tally().last_ts


@settings(max_examples=300, deadline=None)
@given(steps, st.booleans())
def test_the_shard_serves_as_the_python_oracle(script, stream_time):
    assert run(script, stream_time) == run(script, stream_time, reference=True)


@settings(max_examples=200, deadline=None)
@given(steps, st.booleans())
@example(  # two instances due in one wake, one woken by a wish for an entry since gone
    script=[
        ("event", ("request", "user", "u1", "r1", 0.0, None, None, None)),
        ("event", ("request", "user", "u1", "r1", 0.0, None, None, None)),
        ("event", ("feedback", "shared", "u1", "r1", 0.0, 0, None, None)),
        ("wait", 2.0),
        ("event", ("request", "shared", "u1", "r1", 0.0, None, None, None)),
        ("event", ("request", "user", "u1", "r1", 0.0, None, None, None)),
        ("wait", 7.0),
    ],
    stream_time=False,
)
def test_instances_put_to_rest_at_any_call_answer_the_same(script, stream_time):
    """Resting (packing, unpacking on the next event) is invisible: instances settled at
    every call give the outputs, states and metrics of instances never settled between
    epochs, and of the oracle, which never rests."""
    eager = run(script, stream_time, rest_after=0.0)
    assert eager[:3] == run(script, stream_time)[:3]
    assert eager[:3] == run(script, stream_time, reference=True)[:3]


def test_feedback_before_its_request_is_counted_out_of_the_early_buffer():
    """Feedback first, then its request, five times over on an instance whose buffer holds
    two: each waits, is applied when its request comes and leaves room for the next."""
    script = []
    for i in range(5):
        script += [
            ("event", ("feedback", "shared", "u1", f"r{i}", 1.0, None, None, None)),
            ("event", ("request", "shared", "u1", f"r{i}", 0.0, None, None, None)),
        ]
    served = run(script, False)
    assert served == run(script, False, reference=True)
    outputs, _, counted, *_ = served
    assert [len(out) for out in outputs] == [0, 1] * 5  # no early_buffer_full letter
    assert counted["shared"][:4] == [5, 0, 0, 0]  # decisions, retries, pending, early


def test_answers_past_the_books_limit_are_kept_as_entries_and_served_the_same():
    """An instance with more answers than its book holds (a shared one): the first
    ``LIMIT`` in the book, the rest as entries; retries and duplicate feedback of both,
    their expiry, and a new request after it, served as the oracle serves them."""
    limit = _answer_book.LIMIT
    n = limit + 6
    pairs = [
        ("event", (kind, "shared", "u1", f"r{i}", float(i), None, None, None))
        for i in range(n)
        for kind in ("request", "feedback")
    ]
    again = [
        ("event", (kind, "shared", "u1", f"r{i}", 0.0, None, None, None))
        for i in (0, limit - 1, limit, n - 1)
        for kind in ("request", "feedback")
    ]
    script = pairs + again + [("wait", 2.0)] + again + [("wait", 7.0)] + again
    for stream_time in (False, True):
        served = run(script, stream_time)
        assert served == run(script, stream_time, reference=True)
        outputs = served[0]
        retried = [out for out in outputs[2 * n : 2 * n + 8]]
        assert [len(out) for out in retried] == [1] * 8  # an answer, a duplicate's letter
        assert [out[0].reason for out in retried[1::2]] == ["duplicate_feedback"] * 4
        assert retried[::2] == [outputs[2 * i] for i in (0, limit - 1, limit, n - 1)]
        fresh = outputs[-8:]  # after the retry window: new selections, applied feedback
        assert [out[0].round for out in fresh[::2]] == [n + 1, n + 2, n + 3, n + 4]
        assert fresh[1::2] == [[]] * 4

    shared = REGISTRY["shared"]
    instance = Instance(shared, shared.instance_key(None))
    for i in range(n):
        rid = f"r{i}"
        raw = orjson.dumps(message("request", "shared", None, rid, 0.0, None, None, None))
        instance.on_request(parse_request(raw, Origin("t")), now=1.0)
        raw = orjson.dumps(message("feedback", "shared", None, rid, 1.0, None, None, None))
        instance.on_feedback(parse_feedback(raw, Origin("t")), now=1.0)
    assert instance.holding()["book"] == limit and instance.n_held() == n


def test_events_from_another_process_reach_the_receiving_registrys_experiment():
    """In a cluster an event routed by another process arrives pickled, its experiment
    with it. It must reach the instance as the receiving registry's own object: another
    object of the same definition would make every such event a registry change to
    follow (2.5-3x the shard's CPU an event, when measured)."""
    now = [1_700_000_100.0]
    live = LiveRegistry(REGISTRY)
    shard = ShardLogic(FlowContext(live, lambda: now[0]))
    for kind, rid in [("request", "r1"), ("request", "r2"), ("feedback", "r2"), ("request", "r3")]:
        raw = orjson.dumps(message(kind, "user", "u1", rid, 1.0, None, None, None))
        event = (parse_request if kind == "request" else parse_feedback)(raw, Origin("t"))
        experiment = live.current["user"]
        routed = [(experiment.instance_key("u1"), experiment, event)]
        [(_, carried, _)] = pickle.loads(pickle.dumps(routed))
        assert carried is experiment
        shard.handle(pickle.loads(pickle.dumps(routed)))
    assert shard.store.instances["user\x1fu1"].experiment is live.current["user"]
    assert shard.store.instances["user\x1fu1"].bandit.n_updates == 1


def one_user(now):
    """A shard of per-user bandits whose answers are kept for an hour, on the clock
    ``now[0]``, and ``send(kind, rid)``: unit u1's request or feedback, handled; its key."""
    registry = Registry.from_toml(
        '[experiments.user]\narms = ["a", "b", "c"]\nper_unit = true\nretry_window = 3600\n'
    )
    shard = ShardLogic(FlowContext(LiveRegistry(registry), lambda: now[0], rest_after=0.0))
    experiment = registry["user"]
    key = experiment.instance_key("u1")

    def send(kind, rid):
        raw = orjson.dumps(message(kind, "user", "u1", rid, 1.0, None, None, None))
        event = (parse_request if kind == "request" else parse_feedback)(raw, Origin("t"))
        return shard.handle([(key, experiment, event)])

    return shard, key, send


def test_a_user_back_with_kept_answers_builds_them_only_when_read():
    """A user who rested with several kept answers comes back: its answers stay in its
    book, its new request and feedback are served beside them, and a retry of an old
    request builds that one answer into an entry, answered as first."""
    now = [1_700_000_100.0]
    shard, key, send = one_user(now)
    first = {rid: send("request", rid) for rid in ("r1", "r2", "r3")}
    for rid in first:
        send("feedback", rid)
    shard.wake()
    assert key in shard.store.instances  # back within LINGER of its newest answer: kept live
    assert shard.notify_at().timestamp() == now[0] + LINGER  # woken then, events or not
    now[0] += LINGER
    shard.wake()
    assert key in shard.store.resting and key not in shard.store.instances
    [answer] = send("request", "r4")
    assert shard.store.instances[key].holding()["book"] == 3  # none built
    assert send("feedback", "r4") == []
    assert shard.store.instances[key].holding()["book"] == 4  # and r4's answer
    assert send("request", "r2") == first["r2"]  # a retry, answered the same
    assert shard.store.instances[key].holding()["book"] == 3  # r2 built into an entry
    [duplicate] = send("feedback", "r1")
    assert duplicate.reason == "duplicate_feedback"
    assert shard.store.instances[key].bandit.n_updates == 4 and answer.round == 4


def test_a_user_kept_live_is_in_the_lingering_heap_once_however_often_it_is_tried():
    """Each generation's turn tries to put a user with several kept answers to rest; it
    stays live until LINGER after its newest answer, with one entry in the heap, and rests
    then; a newer answer moves its time (the older entry is passed over)."""
    now = [1_700_000_100.0]
    shard, key, send = one_user(now)
    for rid in ("r1", "r2"):
        send("request", rid)
        send("feedback", rid)
    for _ in range(50):  # every call turns a generation (rest_after 0) and tries again
        now[0] += 0.5
        shard.wake()
    store = shard.store
    assert key in store.instances and len(store.lingering) == 1
    send("request", "r3")
    send("feedback", "r3")  # a newer answer: a later time
    for _ in range(5):
        shard.wake()
    assert len(store.lingering) == 2 and store.lingers[key] == store.lingering.first_time() + 25
    now[0] += LINGER
    shard.wake()
    assert key in store.resting and not len(store.lingering) and not store.lingers


def test_an_error_handling_an_event_is_its_dead_letter(monkeypatch):
    script = [("event", ("request", "user", "u1", f"r{i}", 0.0, None, None, None)) for i in (1, 2)]
    reference, *_ = run(script, False)

    select, calls = Bandit.select, []

    def explode(self, *args, **kwargs):  # the first selection made, the second fails
        calls.append(args or kwargs)
        if len(calls) > 1:
            raise RuntimeError("disk on fire")
        return select(self, *args, **kwargs)

    monkeypatch.setattr(Bandit, "select", explode)
    [_, [dead]], states, counted, *_ = run(script, False)
    assert dead.reason == "internal_error" and "disk on fire" in dead.detail
    assert len(states["user\x1fu1"]["open"]) == 1 and len(reference[1]) == 1
    assert counted["user"][:3] == [1, 0, 1]  # one decision, one ticket open: r2 changed nothing


def test_the_modules_examples_hold():
    """pytest's --doctest-modules does not read compiled modules: run the examples here."""
    for module in (_event_loop, compiled_instance):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module


def test_the_kept_loop_reads_an_experiment_again_after_a_reload():
    """An instance reads its experiment's terms once per experiment object: after a
    reload (new objects, a new time to live) it serves with the new definition."""
    now = [1_700_000_100.0]
    live = LiveRegistry(REGISTRY)
    shard = ShardLogic(FlowContext(live, lambda: now[0]))

    def ask(rid):
        experiment = live.current["user"]
        event = parse_request(
            orjson.dumps(message("request", "user", "u1", rid, 0.0, None, None, None)), Origin("t")
        )
        return shard.handle([(experiment.instance_key("u1"), experiment, event)])

    ask("r1")
    ask("r2")
    loop = shard.store.loop
    for ttl in (50, 500):
        live.current = Registry.from_toml(
            f'[experiments.user]\narms = ["a", "b", "c"]\nper_unit = true\nfeedback_ttl = {ttl}\n'
            "retry_window = 3\nseed = 3\n"
        )
        ask(f"r{ttl}")  # follows the new definition
        ask(f"s{ttl}")
        assert shard.store.loop is loop
        assert shard.store.instances["user\x1fu1"].open[f"s{ttl}"].deadline == now[0] + ttl


def test_a_shard_and_its_kept_loop_are_freed_by_reference_counting():
    """The loop lets its shard go after each batch: no cycle keeps a dropped shard alive
    for the cyclic GC to find (which the service's freezer may keep from looking)."""
    live = LiveRegistry(REGISTRY)
    shard = ShardLogic(FlowContext(live, lambda: 1_700_000_100.0))
    experiment = live.current["user"]
    for rid in ("r1", "r2"):
        raw = orjson.dumps(message("request", "user", "u1", rid, 0.0, None, None, None))
        shard.handle([(experiment.instance_key("u1"), experiment, parse_request(raw, Origin("t")))])
    assert shard.store.loop is not None
    dropped = weakref.ref(shard)
    collecting = gc.isenabled()
    gc.disable()
    try:
        del shard
        assert dropped() is None
    finally:
        if collecting:
            gc.enable()


def test_tables_of_several_entries_are_not_walked_by_the_cyclic_gc():
    """Requests ahead of their feedback leave an instance several open tickets: its table
    of entries and its bandit's table of pending tickets hold only records kept from the
    GC, so neither is tracked (a dict is tracked from the first tracked object put in it)."""
    live = LiveRegistry(REGISTRY)
    shard = ShardLogic(FlowContext(live, lambda: 1_700_000_100.0))
    experiment = live.current["user"]
    key = experiment.instance_key("u1")

    def handle(kind, rid):
        raw = orjson.dumps(message(kind, "user", "u1", rid, 1.0, None, None, None))
        parse = parse_request if kind == "request" else parse_feedback
        return shard.handle([(key, experiment, parse(raw, Origin("t")))])

    for rid in ("r1", "r2", "r3", "r4"):
        handle("request", rid)
    handle("feedback", "r2")
    instance = shard.store.instances[key]
    [entries] = [d for d in gc.get_referents(instance) if type(d) is dict]
    pending = instance.bandit._pending
    assert sorted(entries) == ["r1", "r3", "r4"] and all(type(e) is Open for e in entries.values())
    assert type(pending) is dict and len(pending) == 3
    assert not gc.is_tracked(entries) and not gc.is_tracked(pending)
    for rid in ("r1", "r3"):
        handle("feedback", rid)
    [last] = instance.entries(Open).values()
    assert last.rid == "r4" and instance.bandit.pending == (last.ticket,)
