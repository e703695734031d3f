"""The flow's shard count (``flows.service.runtime.shard_count``): one rule deciding it,
every refusal naming both counts; a count moves instances between shards and changes
nothing they serve; a store written with 32 shards keeps serving with 32."""

import re
from datetime import timedelta

import orjson
import pytest
from bytewax.recovery import RecoveryConfig, init_db_dir
from bytewax.testing import run_main
from hypothesis import given
from hypothesis import strategies as st

from flows.service.connectors.memory import memory_wiring
from flows.service.dataflow import build_flow
from flows.service.instances.registry import Registry
from flows.service.runtime.options import ConfigError
from flows.service.runtime.process import Service
from flows.service.runtime.recovery import read_states, shard_store, stored_shards
from flows.service.runtime.settings import Settings
from flows.service.runtime.shard_count import (
    DEFAULT_INTERNAL_PARTITIONS,
    MAX_SHARDS,
    flow_shards,
    internal_partitions,
    shard_count,
)
from flows.service.runtime.startup import StartupError, prepare
from flows.service.shards.shard_log import shards_in, write_seed
from flows.service.wire.events import Origin
from flows.service.wire.keys import DEFAULT_SHARDS, internal_partition, of_layout, shard_index

REGISTRY_TOML = """
[experiments.e]
arms = ["a", "b", "c"]
per_unit = true
seed = 4

[experiments.shared]
arms = ["x", "y"]
"""
REGISTRY = Registry.from_toml(REGISTRY_TOML)
COUNTS = st.none() | st.integers(1, MAX_SHARDS)


@given(requested=COUNTS, stored=COUNTS, partitions=COUNTS)
def test_what_exists_decides_the_count_and_a_disagreement_is_refused(requested, stored, partitions):
    """The changelog's partitions, else the store's count, else --shards, else the
    default; a --shards or store count other than what decides is refused."""
    decided = next(c for c in (partitions, stored, requested, DEFAULT_SHARDS) if c is not None)
    disagree = [c for c in (stored, requested) if c is not None and c != decided]
    if disagree:
        with pytest.raises(ConfigError) as refused:
            flow_shards(requested, stored, partitions)
        message = str(refused.value)
        assert str(decided) in message and str(disagree[0]) in message and "\n" not in message
        assert "tsi state export" in message and "tsi state import" in message
        assert f"--shards {disagree[0]}" in message or f"--shards {decided}" in message
    else:
        assert flow_shards(requested, stored, partitions) == decided


def test_each_rule_and_refusal_by_example():
    assert flow_shards(None, None, None) == DEFAULT_SHARDS == 128
    assert flow_shards(64, None, None) == 64  # a new store: --shards
    assert flow_shards(None, 32, None) == 32  # an existing store keeps its count
    assert flow_shards(None, None, 16) == 16  # a member with a lost disk: the cluster's
    assert flow_shards(16, 16, 16) == 16
    with pytest.raises(ConfigError, match=r"--shards 64 disagrees with the recovery store's 32"):
        flow_shards(64, 32, None)
    with pytest.raises(ConfigError, match=r"--shards 64 disagrees with the changelog topic's 16"):
        flow_shards(64, None, 16)
    with pytest.raises(ConfigError, match=r"store holds 32 shards and the changelog topic has 16"):
        flow_shards(None, 32, 16)
    with pytest.raises(ConfigError, match=r"new changelog topic with 64 partitions"):
        flow_shards(64, 32, None)


@pytest.mark.parametrize("text", ["0", "1025", "-1", "x", "", "1.5", "1e3"])
def test_a_bad_shard_count_is_refused_naming_it(text):
    with pytest.raises(ValueError, match=f"from 1 to 1024, got {text!r}"):
        shard_count(text)
    if text.strip():
        with pytest.raises(ConfigError, match=r"--shards / TSI_SHARDS must be a whole number"):
            Settings.from_env({"TSI_REGISTRY": "r.toml", "TSI_SHARDS": text})


def test_the_setting_reads_a_count_or_none():
    assert Settings.from_env({"TSI_REGISTRY": "r.toml"}).shards is None
    assert Settings.from_env({"TSI_REGISTRY": "r.toml", "TSI_SHARDS": "1024"}).shards == 1024
    assert shard_count("1") == 1


def test_a_store_of_two_counts_is_refused_naming_both(tmp_path):
    store = shard_store(tmp_path)
    assert stored_shards(tmp_path) is None  # nothing yet
    write_seed(store, "shard-001-of-032", [])
    assert stored_shards(tmp_path) == 32
    write_seed(store, "shard-001-of-064", [])
    with pytest.raises(ConfigError, match=r"more than one shard count") as refused:
        stored_shards(tmp_path)
    assert "of 32 (shard-001-of-032" in str(refused.value)
    assert "of 64 (shard-001-of-064" in str(refused.value)
    assert "tsi state import FILE --shards N" in str(refused.value)


def request(i, unit):
    return orjson.dumps({"experiment": "e", "unit": f"u{unit}", "request_id": f"r{i}"})


def feedback(i, unit, loss):
    body = {"experiment": "e", "unit": f"u{unit}", "request_id": f"r{i}", "loss": loss}
    return orjson.dumps(body)


def workload(first, count, units=30):
    """Requests for ``units`` users (and one shared instance), each with its feedback."""
    requests, answers = [], []
    for i in range(first, first + count):
        requests.append((request(i, i % units), Origin("rq", 0, i)))
        answers.append((feedback(i, i % units, (i * 7 % 5) / 4), Origin("fb", 0, i)))
    shared = orjson.dumps({"experiment": "shared", "request_id": f"s{first}"})
    requests.append((shared, Origin("rq", 0, first + count)))
    return requests, answers


def serve(recovery, requests, answers, shards=DEFAULT_SHARDS):
    """One run over the messages with the recovery store ``recovery`` (a restart resumes
    each input after what it read before): (selections by request id, dead letters)."""
    selections, dead = [], []
    wiring = memory_wiring(requests, answers, selections, dead)
    flow = build_flow(
        REGISTRY, wiring, clock=lambda: 1000.0, store=shard_store(recovery), shards=shards
    )
    config = RecoveryConfig(str(recovery))
    run_main(flow, epoch_interval=timedelta(seconds=0), recovery_config=config)
    by_id = {orjson.loads(v)["request_id"]: (k, orjson.loads(v)) for k, v in selections}
    return by_id, [orjson.loads(v) for _, v in dead]


def fresh(directory):
    directory.mkdir()
    init_db_dir(directory, 1)
    return directory


def test_the_count_moves_instances_between_shards_and_changes_nothing_they_serve(tmp_path):
    """The same events with 8 and with 128 shards: the same selections, the same state."""
    requests, answers = workload(0, 120)
    runs = {n: serve(fresh(tmp_path / str(n)), requests, answers, n) for n in (8, 128)}
    (few, few_dead), (many, many_dead) = runs[8], runs[128]
    assert few == many and len(few) == 121 and few_dead == many_dead == []
    assert read_states(tmp_path / "8") == read_states(tmp_path / "128")
    assert stored_shards(tmp_path / "8") == 8 and stored_shards(tmp_path / "128") == 128
    assert all(of_layout(name, 8) for name in shards_in(shard_store(tmp_path / "8")))


def test_a_store_of_32_shards_restarts_with_32_and_serves_on(tmp_path):
    """A store the release of 32 shards wrote resumes with its own count under the new
    default (every instance served on, no state_lost); --shards 64 against it is refused
    naming both counts and the way out, before any broker is asked."""
    old = fresh(tmp_path / "old")
    requests, answers = workload(0, 60)
    first, dead = serve(old, requests, answers, shards=32)
    more_requests, more_answers = workload(61, 60)
    assert len(first) == 61 and dead == []
    assert stored_shards(old) == 32
    before = read_states(old)

    registry = tmp_path / "registry.toml"
    registry.write_text(REGISTRY_TOML)
    settings = Settings(registry=registry, brokers=["127.0.0.1:1"], recovery_dir=old)
    service = Service.from_settings(settings, stored=stored_shards(old))  # as bytewax.run
    assert service.shards == 32
    second, dead = serve(
        old, requests + more_requests, answers + more_answers, shards=service.shards
    )
    assert len(second) == 61 and not second.keys() & first.keys()
    assert dead == []  # no state_lost, no foreign_shard
    for request_id, (key, answer) in second.items():
        if key in before:  # each instance went on from its stored rounds
            assert answer["round"] > before[key]["bandit"]["n_rounds"], request_id
    after = read_states(old)
    assert sum(s["bandit"]["n_updates"] for s in after.values()) == 120
    assert stored_shards(old) == 32

    refused = Settings(
        registry=registry, brokers=["127.0.0.1:1"], recovery_dir=old, shards=64, connect_timeout=0.1
    )
    with pytest.raises(StartupError) as startup:
        prepare(refused)
    message = str(startup.value)
    assert "--shards 64 disagrees with the recovery store's 32 shards" in message
    assert "tsi state import FILE --shards 64" in message and "64 partitions" in message
    with pytest.raises(ConfigError, match="--shards 64 disagrees"):
        Service.from_settings(refused, stored=32)


def test_the_default_count_on_a_32_shard_store_would_start_its_instances_over(tmp_path):
    """Why the store's count decides: with another count no event reaches the stored
    shards (each says so, in a dead letter), and every instance starts over elsewhere."""
    old = fresh(tmp_path / "old")
    requests, answers = workload(0, 30)
    serve(old, requests, answers, shards=32)
    before = read_states(old)
    more_requests, more_answers = workload(31, 30)
    served, dead = serve(old, requests + more_requests, answers + more_answers, DEFAULT_SHARDS)
    assert {d["reason"] for d in dead} == {"foreign_shard"}
    firsts = {}
    for key, answer in sorted(served.values(), key=lambda ka: ka[1]["round"], reverse=True):
        firsts[key] = answer["round"]
    assert all(before[key]["bandit"]["n_rounds"] >= 1 for key in firsts if key in before)
    assert set(firsts.values()) == {1}  # started over: what the resolution prevents


@given(st.integers(1, MAX_SHARDS))
def test_a_new_internal_topic_divides_the_shard_count_and_keeps_each_key_partition(shards):
    default = internal_partitions(None, shards)
    assert shards % default == 0 and default <= DEFAULT_INTERNAL_PARTITIONS
    key = f"exp\x1fu{shards}"
    assert internal_partition(shard_index(key, shards), default) == shard_index(key, default)


@pytest.mark.parametrize("bad", ["0", "3", "256", "x", "-4", "2.0"])
def test_an_internal_partition_count_not_dividing_the_shards_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match=f"dividing the shard count 128, got '{re.escape(bad)}'"):
        internal_partitions(bad, 128)
