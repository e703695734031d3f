"""The Bytewax logic of a shard of instances: guarded events, timers, snapshots."""

import gc

import orjson
from bytewax.operators import StatefulBatchLogic as StatefulLogic

from flows.service.instances.registry import Registry
from flows.service.shards import shard_store as store_module
from flows.service.shards.logic import logic_builder
from flows.service.wire.events import DeadLetter, Origin, parse_feedback, parse_request
from tsi_core import Bandit

REGISTRY = Registry.from_toml('[experiments.e]\narms = ["a", "b"]\nfeedback_ttl = 5\n')


def item(logic, key, event):
    """What the dataflow routes to a shard's logic: a batch of one (instance key, the
    event's experiment, the event)."""
    return [(key, logic.store.context.registry.current[event.experiment], event)]


def request(rid):
    return parse_request(orjson.dumps({"experiment": "e", "request_id": rid}), Origin("t", 0, 1))


def test_an_unexpected_error_becomes_a_dead_letter_and_the_logic_lives_on(monkeypatch):
    logic = logic_builder(REGISTRY, clock=lambda: 100.0)(None)
    # Bytewax's call: batches in, one item out holding all the outputs, written
    items, keep = logic.on_batch([item(logic, "e", request("r1"))])
    [([(instance, written)], [])] = items
    assert keep is StatefulLogic.RETAIN and instance == "e"
    assert orjson.loads(written)["request_id"] == "r1"

    def explode(*_args):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(Bandit, "select", explode)  # what the instance asks for an arm
    [([], [dead])], keep = logic.on_batch([item(logic, "e", request("r2"))])
    assert isinstance(dead, DeadLetter) and dead.reason == "internal_error"
    assert "disk on fire" in dead.detail and keep is StatefulLogic.RETAIN


def test_timer_is_timezone_aware_and_expiry_runs_on_notify():
    now = [100.0]
    logic = logic_builder(REGISTRY, clock=lambda: now[0], rest_after=1e9)(None)
    assert logic.notify_at() is None
    logic.handle(item(logic, "e", request("r1")))
    due = logic.notify_at()
    assert due.tzinfo is not None and due.timestamp() == 105.0
    now[0] = 106.0
    out = logic.wake()
    assert [d.reason for d in out] == ["ticket_expired"]


def test_snapshot_resumes_the_same_instance():
    logic = logic_builder(REGISTRY, clock=lambda: 0.0)(None)
    logic.handle(item(logic, "e", request("r1")))
    fb = parse_feedback(
        orjson.dumps({"experiment": "e", "request_id": "r1", "loss": 2}), Origin("t", 0, 2)
    )
    resumed = logic_builder(REGISTRY, clock=lambda: 0.0)(logic.snapshot())
    assert resumed.snapshot() == logic.snapshot()
    assert list(resumed.handle(item(resumed, "e", fb))) == []
    assert resumed.store.instances["e"].bandit.n_updates == 1
    # an experiment removed from the registry: its saved state is kept aside, not a crash
    other = Registry.from_toml('[experiments.f]\narms = ["a"]\n')
    archived = logic_builder(other)(logic.snapshot())
    assert archived.store.instances == {} and list(archived.store.resting) == ["e"]


def test_without_recovery_no_snapshot_is_built():
    logic = logic_builder(REGISTRY, clock=lambda: 0.0, snapshots=False)(None)
    logic.handle(item(logic, "e", request("r1")))
    assert logic.snapshot() is None


def test_an_instance_unchanged_for_a_generation_is_put_to_rest():
    """Packed and held as its bytes a generation after its last event, between epochs;
    an instance still changing stays live."""
    now = [0.0]
    logic = logic_builder(REGISTRY, clock=lambda: now[0], snapshots=False, rest_after=0.0)(None)
    logic.handle(item(logic, "e", request("r1")))
    raw = orjson.dumps({"experiment": "e", "request_id": "r1", "loss": 1})
    logic.handle(item(logic, "e", parse_feedback(raw, Origin("t", 0, 2))))
    now[0] = 1e6  # past the retry window: the answer kept for retries goes
    logic.wake()
    assert "e" in logic.store.instances  # changed in the generation before: cooling
    logic.handle([])
    logic.handle([])
    assert "e" not in logic.store.instances and "e" in logic.store.resting
    logic.handle(item(logic, "e", request("r2")))  # built again from its bytes
    assert logic.store.instances["e"].bandit.n_updates == 1


def test_the_live_and_resting_gauges_follow_an_instance_put_to_rest():
    from prometheus_client import REGISTRY as METRICS

    def held():
        return tuple(METRICS.get_sample_value(f"tsi_instances_{s}") for s in ("live", "resting"))

    now = [0.0]
    logic = logic_builder(REGISTRY, clock=lambda: now[0], snapshots=False, rest_after=0.0)(None)
    live, resting = held()
    logic.handle(item(logic, "e", request("r1")))
    assert held() == (live + 1, resting)
    now[0] = 1e6
    logic.wake()
    logic.handle([])
    logic.handle([])
    assert "e" in logic.store.resting and held() == (live, resting + 1)
    del logic
    gc.collect()
    assert held() == (live, resting)  # a store gone is no longer counted


def test_a_shard_no_event_reaches_is_woken_to_put_its_instances_to_rest():
    """Without further events a shard still settles: its timer is due at the next turn
    of the generation, and at once while keys wait to be put to rest."""
    logic = logic_builder(REGISTRY, clock=lambda: 500.0, rest_after=0.5)(None)
    assert logic.notify_at() is None
    logic.handle(item(logic, "e", request("r1")))  # a ticket due at 505
    assert 500.0 < logic.notify_at().timestamp() <= 500.5  # the generation turns first
    logic.store.generations.settling.append("e")
    assert logic.notify_at().timestamp() == 500.0


def requests_of(logic, keys):
    return [item(logic, key, request(f"r-{key}"))[0] for key in keys]


def test_a_flood_of_new_instances_keeps_a_few_generations_live(monkeypatch):
    """New keys turn the generation before its time is up, so a flood of new users does
    not keep ``REST_AFTER`` seconds' worth of them live; on time alone all would be."""
    monkeypatch.setattr(store_module, "NEW_LIVE", 50)
    peaks = {}
    for turning in (True, False):
        if not turning:
            monkeypatch.setattr(store_module, "NEW_LIVE", 10**9)
        build = logic_builder(
            REGISTRY, clock=lambda: 0.0, snapshots=False, rest_after=1e9, shards=1
        )
        logic = build(None)
        peak = 0
        for call in range(100):
            out = logic.handle(requests_of(logic, [f"u{call}-{i}" for i in range(20)]))
            assert len(out) == 20
            peak = max(peak, len(logic.store.instances))
        assert len(logic.store.instances) + len(logic.store.resting) == 2_000
        peaks[turning] = peak
    assert peaks[True] <= 4 * 50 and peaks[False] == 2_000


def test_users_coming_back_do_not_turn_generations(monkeypatch):
    """Only new keys count: 400 users coming back in turn (more than a generation's new
    keys) are put to rest once, while they are new, and then stay live."""
    monkeypatch.setattr(store_module, "NEW_LIVE", 50)  # a flow of one shard: all of it
    build = logic_builder(REGISTRY, clock=lambda: 0.0, snapshots=False, rest_after=1e9, shards=1)
    logic = build(None)
    users = [f"u{i}" for i in range(400)]
    logic.handle(requests_of(logic, users[:200]))
    logic.handle(requests_of(logic, users[200:]))
    assert len(logic.store.resting) > 0  # the new ones turned generations: the first rested
    for _ in range(5):  # the first round is the first to see them rest
        for start in range(0, 400, 20):
            logic.handle(requests_of(logic, users[start : start + 20]))
    assert len(logic.store.instances) == 400 and len(logic.store.resting) == 0
    assert all(logic.store.instances[u].bandit.n_updates == 0 for u in users)
