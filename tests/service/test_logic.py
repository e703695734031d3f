"""The Bytewax logic of a shard of instances: guarded events, timers, snapshots."""

import orjson
from bytewax.operators import StatefulBatchLogic as StatefulLogic

from flows.service import _fast_lane
from flows.service.events import DeadLetter, Origin, Selection, parse_feedback, parse_request
from flows.service.instance import Instance
from flows.service.logic import logic_builder
from flows.service.registry import Registry

REGISTRY = Registry.from_toml('[experiments.e]\narms = ["a", "b"]\nfeedback_ttl = 5\n')


def item(logic, key, event):
    """What the dataflow routes to a shard's logic: a batch of one (instance key, the
    event's experiment, the event)."""
    return [(key, logic.context.registry.current[event.experiment], event)]


def request(rid):
    return parse_request(orjson.dumps({"experiment": "e", "request_id": rid}), Origin("t", 0, 1))


def test_an_unexpected_error_becomes_a_dead_letter_and_the_logic_lives_on(monkeypatch):
    logic = logic_builder(REGISTRY, clock=lambda: 100.0)(None)
    # Bytewax's call: batches in, one item out holding all the outputs
    items, keep = logic.on_batch([item(logic, "e", request("r1"))])
    [[selection]] = items
    assert keep is StatefulLogic.RETAIN and isinstance(selection, Selection)

    def explode(*_args):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(Instance, "on_request", explode)  # the Python path
    monkeypatch.setattr(_fast_lane, "uniform_draw", explode)  # the compiled lane
    [[dead]], keep = logic.on_batch([item(logic, "e", request("r2"))])
    assert isinstance(dead, DeadLetter) and dead.reason == "internal_error"
    assert "disk on fire" in dead.detail and keep is StatefulLogic.RETAIN


def test_timer_is_timezone_aware_and_expiry_runs_on_notify():
    now = [100.0]
    logic = logic_builder(REGISTRY, clock=lambda: now[0])(None)
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
    assert resumed.instances["e"].bandit.n_updates == 1
    # an experiment removed from the registry: its saved state is kept aside, not a crash
    other = Registry.from_toml('[experiments.f]\narms = ["a"]\n')
    archived = logic_builder(other)(logic.snapshot())
    assert archived.instances == {} and list(archived.resting) == ["e"]


def test_without_recovery_no_snapshot_is_built():
    logic = logic_builder(REGISTRY, clock=lambda: 0.0, snapshots=False)(None)
    logic.handle(item(logic, "e", request("r1")))
    assert logic.snapshot() is None
