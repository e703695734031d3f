"""Upgrading recovery directories of earlier releases: written before shards (one Bytewax
key per instance), or with another shard count."""

import collections
import dataclasses
import shutil
import zlib
from datetime import timedelta
from types import SimpleNamespace

import bytewax.operators as op
import orjson
import pytest
from bytewax.dataflow import Dataflow
from bytewax.operators import StatefulLogic
from bytewax.recovery import RecoveryConfig, init_db_dir
from bytewax.testing import TestingSource, run_main

from flows.service.connectors.memory import memory_wiring
from flows.service.dataflow import build_flow
from flows.service.instances.instance import Instance
from flows.service.instances.registry import Registry
from flows.service.runtime.recovery import (
    _committed_steps,
    keys_of_one_shard,
    read_states,
    seed_from_per_instance_snapshots,
    shard_store,
    stored_shards,
)
from flows.service.runtime.settings import ConfigError, Settings
from flows.service.runtime.startup import StartupError, check_cluster_keys, prepare
from flows.service.shards.logic import logic_builder
from flows.service.wire.events import Origin, parse_feedback, parse_request
from flows.service.wire.keys import (
    DEFAULT_SHARDS,
    instance_key,
    of_layout,
    shard_name,
    shard_names,
    shard_of,
)
from flows.tools.state import export_state, import_state

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
    assert seed_from_per_instance_snapshots(recovery, DEFAULT_SHARDS) == 1

    selections, dead = [], []
    wiring = memory_wiring([(message("new"), Origin("t", 0, 0))], [], selections, dead)
    flow = build_flow(REGISTRY, wiring, store=shard_store(recovery))
    run_main(flow, epoch_interval=timedelta(seconds=0), recovery_config=RecoveryConfig(recovery))
    [(served_key, answer)] = selections
    assert served_key == KEY and orjson.loads(answer)["round"] == 6 and not dead  # it went on
    assert seed_from_per_instance_snapshots(recovery, DEFAULT_SHARDS) == 0  # once
    assert read_states(recovery)[KEY]["bandit"]["n_updates"] == 5


def legacy_shard_of(key, shards=256):
    """How the release before 2026-11-28 named an instance's shard (256, ``shard-NNN``)."""
    return f"shard-{zlib.crc32(key.encode()) % shards:03d}"


def serve_once(recovery, messages, monkeypatch=None, handover=None):
    """One run of the flow over ``messages`` with ``recovery``; (selections, dead letters)
    as parsed JSON. With ``monkeypatch``, the run routes and names shards as the release
    before did (the Python parser: the compiled one is fixed at import); ``handover``: as
    ``build_flow``'s."""
    selections, dead = [], []
    origins = [(raw, Origin("t", 0, i)) for i, raw in enumerate(messages)]
    wiring = memory_wiring(origins, [], selections, dead)
    if monkeypatch is not None:
        monkeypatch.setattr(
            "flows.service.dataflow.shard_of", lambda key, shards: legacy_shard_of(key)
        )
        monkeypatch.setattr(
            "flows.service.shards.shard_store.shard_of", lambda key, shards: legacy_shard_of(key)
        )
        monkeypatch.setattr(
            "flows.service.shards.shard_store.of_layout", lambda shard, shards: True
        )
        slow = lambda raw, origin, **kw: parse_request(raw, origin, **kw)  # noqa: E731
        inputs = dataclasses.replace(wiring.inputs, parsers={"requests": slow})
        wiring = dataclasses.replace(wiring, inputs=inputs)
    flow = build_flow(REGISTRY, wiring, store=shard_store(recovery), handover=handover)
    run_main(flow, epoch_interval=timedelta(seconds=0), recovery_config=RecoveryConfig(recovery))
    if monkeypatch is not None:
        monkeypatch.undo()
    return [orjson.loads(v) for _, v in selections], [orjson.loads(v) for _, v in dead]


def test_a_store_of_the_256_shard_release_is_refused_kept_and_moved(tmp_path, monkeypatch):
    """A store written with another shard count: ``tsi run`` refuses it naming the way out;
    a flow started on it anyway keeps its instances unchanged and says so in a dead
    letter per shard (never a crash, never a silent reset); export and import put every
    instance in its shard of this release, and their rounds go on."""
    old = tmp_path / "old"
    old.mkdir()
    init_db_dir(old, 1)
    units = [f"u{i}" for i in range(40)]
    first = [orjson.dumps({"experiment": "e", "unit": u, "request_id": "r1"}) for u in units]
    answers, dead = serve_once(old, first, monkeypatch)
    assert [a["round"] for a in answers] == [1] * 40 and not dead
    shards = {legacy_shard_of(instance_key("e", u)) for u in units}
    assert len(shards) > 30 and not any(of_layout(s, DEFAULT_SHARDS) for s in shards)

    with pytest.raises(
        ConfigError, match="shards of more than one shard count, or of a"
    ) as refused:
        stored_shards(old)
    assert "tsi state export" in str(refused.value) and "tsi state import" in str(refused.value)
    assert str(old) in str(refused.value) and "\n" not in str(refused.value)
    registry = tmp_path / "registry.toml"
    registry.write_text('[experiments.e]\narms = ["a", "b", "c"]\nper_unit = true\n')
    nowhere = Settings(
        registry=registry, brokers=["127.0.0.1:1"], recovery_dir=old, connect_timeout=0.1
    )
    with pytest.raises(StartupError, match="shards of more than one shard count, or of a"):
        prepare(nowhere)  # before any broker is asked
    before = read_states(old)
    assert sorted(before) == sorted(instance_key("e", u) for u in units)

    stray = tmp_path / "stray"  # run on a copy anyway (``python -m bytewax.run``)
    shutil.copytree(old, stray)
    _, letters = serve_once(stray, [])
    assert sorted(d["instance"] for d in letters) == sorted(shards)
    assert {d["reason"] for d in letters} == {"foreign_shard"}
    assert "tsi state import" in letters[0]["detail"]
    assert read_states(stray) == before  # kept as they were

    export_state([old], tmp_path / "state.tsi")
    import_state(tmp_path / "state.tsi", [tmp_path / "new"])
    assert stored_shards(tmp_path / "new") == DEFAULT_SHARDS  # a new store's count
    second = [orjson.dumps({"experiment": "e", "unit": u, "request_id": "r2"}) for u in units]
    answers, dead = serve_once(tmp_path / "new", second)
    assert [a["round"] for a in answers] == [2] * 40 and not dead  # each went on
    assert {shard_of(instance_key("e", u)) for u in units} <= set(shard_names(DEFAULT_SHARDS))


@pytest.mark.parametrize("shards", [32, DEFAULT_SHARDS])
def test_shard_names_say_their_layout(shards):
    """A count's names are recognised, the 256-shard release's and other counts' not,
    and the hash spreads keys over every shard."""
    names = shard_names(shards)
    assert all(of_layout(name, shards) for name in names) and len(names) == shards
    others = ["shard-000", "shard-031", "shard-255", shard_name(3, shards * 2), "x", ""]
    assert not any(of_layout(name, shards) for name in others)
    assert shard_name(shards, shards) not in names
    assert not of_layout(shard_name(shards, shards), shards)
    n = 1000 * shards
    counts = collections.Counter(shard_of(instance_key("e", f"u{i}"), shards) for i in range(n))
    assert set(counts) == set(names)
    assert max(counts.values()) < 1.1 * n / shards  # within 10% of an even spread


@pytest.mark.parametrize("prefilled", [False, True])
def test_a_store_of_one_key_a_shard_resumes_into_key_groups(tmp_path, prefilled):
    """A recovery directory written when each shard was its own Bytewax key (the release
    before key groups): every instance's state goes on, served or not in the first run
    after the upgrade, and the old keys leave the store once their groups hold them;
    whether the old keys hand their states over as Bytewax builds them, or the service
    read them from the store first (``prefilled``, as ``Service.flow`` does)."""
    recovery = tmp_path / "recovery"
    recovery.mkdir()
    init_db_dir(recovery, 1)
    units = [f"u{i}" for i in range(12)]  # shards of several groups
    first = [orjson.dumps({"experiment": "e", "unit": u, "request_id": "r1"}) for u in units]
    before = Dataflow("tsi")  # the stateful step ``shards`` as that release keyed it
    items = [
        (
            shard_of(instance_key("e", u)),
            [(instance_key("e", u), REGISTRY["e"], parse_request(raw, Origin("t", 0, i)))],
        )
        for i, (u, raw) in enumerate(zip(units, first, strict=True))
    ]
    builder = logic_builder(REGISTRY, store=shard_store(recovery))
    op.inspect(
        "out", op.stateful_batch("shards", op.input("in", before, TestingSource(items)), builder)
    )
    run_main(before, epoch_interval=timedelta(seconds=0), recovery_config=RecoveryConfig(recovery))
    rows = committed_rows(recovery)
    assert rows and all(key.startswith("shard-") for key in rows)  # one key a shard
    with pytest.raises(StartupError, match=f"holds {len(rows)} Bytewax keys of one shard"):
        check_cluster_keys(SimpleNamespace(processes=2, recovery_dir=recovery))
    check_cluster_keys(SimpleNamespace(processes=1, recovery_dir=recovery))  # handed over

    handover = keys_of_one_shard(recovery) if prefilled else None
    assert handover is None or sorted(handover) == sorted(rows)
    served, dead = serve_once(recovery, [message("r2")], handover=handover)  # u1 only
    assert [(s["unit"], s["round"]) for s in served] == [("u1", 2)] and not dead
    states = read_states(recovery)
    assert {key: s["bandit"]["n_rounds"] for key, s in states.items()} == {
        instance_key("e", u): 2 if u == "u1" else 1 for u in units
    }
    held = committed_rows(recovery)
    assert shard_of(KEY) not in held  # its group took it, the old key went

    again = [orjson.dumps({"experiment": "e", "unit": u, "request_id": "r3"}) for u in units]
    served, dead = serve_once(recovery, [message("r2"), *again])  # the input resumes at 1
    assert sorted((s["unit"], s["round"]) for s in served) == sorted(
        (u, 3 if u == "u1" else 2) for u in units
    )
    assert not dead
    assert all(key.startswith("group-") for key in committed_rows(recovery))


def committed_rows(recovery):
    """{Bytewax key: state} of the stateful step's rows at the committed epoch (deleted
    ones left out)."""
    files = sorted(recovery.glob("part-*.sqlite3"))
    return {key: state for _, key, state in _committed_steps(files, "tsi.shards") if state}
