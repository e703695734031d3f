"""A breach through the experiments topic's model: the experiment paused to the holdout's
arm, with an audit record that says the guardrails did it and why."""

from __future__ import annotations

import tomllib

from flows.experiments import model
from flows.gateway.live_data import parse_metrics
from flows.guardrails.control import Controller
from flows.guardrails.store_action import PauseInStore, store_registry
from tests.guardrails.test_control import REGISTRY, _text


class Store:
    """The part of ``ExperimentStore`` the action uses, in memory."""

    def __init__(self) -> None:
        self.resources: dict[str, model.Resource] = {}
        self.audits: list[model.Audit] = []

    def current(self) -> dict[str, model.Resource]:
        return dict(self.resources)

    def change(self, name, operation):
        resource, audit = operation(self.resources.get(name))
        if audit is not None:
            self.resources[name], _ = resource, self.audits.append(audit)
        return resource, audit


def test_a_breach_pauses_the_experiment_in_the_store_with_its_audit_record():
    store = Store()
    spec = tomllib.loads(REGISTRY)["experiments"]["shop"]
    store.change("shop", lambda current: model.apply(current, "shop", spec, "ann"))
    controller = Controller(lambda: store_registry(store), PauseInStore(store))
    slow = parse_metrics(_text((900, 900 * 200.0, 900 * 40100.0), (100, 100 * 100, 100 * 10100.0)))
    for _ in range(3):
        controller.observe(slow)
    paused = store.resources["shop"]
    assert (paused.status, paused.arm, paused.version) == ("paused", "control", 2)
    assert store_registry(store)["shop"].force_arm == "control"
    last = store.audits[-1]
    assert last.action == "pause" and last.who.startswith("guardrails: ")
    assert "latency_ms" in last.who
    assert len(store.audits) == 2  # paused once, not at every look


def test_no_breach_changes_nothing():
    store = Store()
    spec = tomllib.loads(REGISTRY)["experiments"]["shop"]
    store.change("shop", lambda current: model.apply(current, "shop", spec, "ann"))
    controller = Controller(lambda: store_registry(store), PauseInStore(store))
    same = parse_metrics(_text((900, 900 * 100.0, 900 * 10100.0), (100, 100 * 100, 100 * 10100.0)))
    controller.observe(same)
    assert store.resources["shop"].status == "active" and len(store.audits) == 1
