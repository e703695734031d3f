"""Upgrading a recovery directory written before shards (one Bytewax key per instance)."""

from datetime import timedelta

import bytewax.operators as op
import orjson
from bytewax.dataflow import Dataflow
from bytewax.operators import StatefulLogic
from bytewax.recovery import RecoveryConfig, init_db_dir
from bytewax.testing import TestingSource, run_main

from flows.service.connectors.memory import memory_wiring
from flows.service.dataflow import build_flow
from flows.service.events import Origin, parse_feedback, parse_request
from flows.service.instance import Instance
from flows.service.recovery import read_states, seed_from_per_instance_snapshots, shard_store
from flows.service.registry import Registry, instance_key

REGISTRY = Registry.from_toml('[experiments.e]\narms = ["a", "b", "c"]\nper_unit = true\n')
KEY = instance_key("e", "u1")


def message(rid, **extra):
    return orjson.dumps({"experiment": "e", "unit": "u1", "request_id": rid, **extra})


def test_per_instance_snapshots_of_the_release_before_shards_are_carried_over(tmp_path):
    """A recovery directory of the release before shards (one Bytewax key per instance,
    step ``bandit``) upgrades in place: its instances seed their shards."""
    recovery = tmp_path / "recovery"
    recovery.mkdir()
    init_db_dir(recovery, 1)
    instance = Instance(REGISTRY["e"], KEY)
    for i in range(5):
        instance.on_request(parse_request(message(f"old{i}"), Origin("t")), now=0.0)
        instance.on_feedback(parse_feedback(message(f"old{i}", loss=1), Origin("t")), now=0.0)
    state = instance.to_dict()

    class Before(StatefulLogic):  # what the release before snapshotted per key
        def on_item(self, value):
            return [], StatefulLogic.RETAIN

        def snapshot(self):
            return state

    old = Dataflow("tsi")
    keyed = op.input("in", old, TestingSource([(KEY, None)]))
    op.inspect("out", op.stateful("bandit", keyed, lambda resume: Before()))
    run_main(old, epoch_interval=timedelta(seconds=0), recovery_config=RecoveryConfig(recovery))
    assert seed_from_per_instance_snapshots(recovery) == 1

    selections, dead = [], []
    wiring = memory_wiring([(message("new"), Origin("t", 0, 0))], [], selections, dead)
    flow = build_flow(REGISTRY, wiring, store=shard_store(recovery))
    run_main(flow, epoch_interval=timedelta(seconds=0), recovery_config=RecoveryConfig(recovery))
    [(served_key, answer)] = selections
    assert served_key == KEY and orjson.loads(answer)["round"] == 6 and not dead  # it went on
    assert seed_from_per_instance_snapshots(recovery) == 0  # once
    assert read_states(recovery)[KEY]["bandit"]["n_updates"] == 5
