"""``tsi state import`` to another shard count or split over members, and ``tsi state
export`` over members' directories (offline: stores made by imports; the members' stores
made by ``tsi run`` are in ``test_state_members_live.py``)."""

import random
import shutil

import pytest
from typer.testing import CliRunner

from flows.cli import app
from flows.service.connectors.members import Members
from flows.service.instances.instance import Instance
from flows.service.instances.registry import Registry
from flows.service.instances.resting import entry_of
from flows.service.runtime.recovery import (
    NotOneClusterError,
    committed_entries,
    last_layout,
    seeded_inputs,
    shard_store,
)
from flows.service.shards.shard_log import encode, read_records
from flows.service.wire.events import Origin, parse_feedback, parse_request
from flows.service.wire.keys import DEFAULT_SHARDS, shard_index, shard_of
from flows.tools.state import export_state, import_state, read_state_file
from tests.service.members_live import REGISTRY, key_of

INPUTS = {
    **{f"tsi.requests_in.kafka_input/{p}-req": 10 + p for p in range(4)},
    **{f"tsi.internal_in/{p}-int": {"next": 5 * p} for p in range(4)},
}


def state_file(path, units=60):
    """A state file of ``units`` instances, each asked and answered a few times."""
    experiment = Registry.from_toml(REGISTRY)["shop"]
    rng = random.Random(3)
    entries = []
    for unit in range(units):
        instance = Instance(experiment, key_of(unit))
        for i in range(rng.randint(1, 4)):
            request = f'{{"experiment":"shop","unit":"u{unit}","request_id":"r{unit}-{i}"}}'
            [answer] = instance.on_request(parse_request(request.encode(), Origin("t")), 0.0)
            if rng.random() < 0.7:
                feedback = (
                    f'{{"experiment":"shop","unit":"u{unit}","request_id":"r{unit}-{i}",'
                    f'"loss":{rng.random():.3f},"arm":"{answer.arm_name}"}}'
                )
                instance.on_feedback(parse_feedback(feedback.encode(), Origin("t")), 0.0)
        entries.append(entry_of(instance))
    header = {"format": "tsi.state", "version": 1, "inputs": INPUTS, "instances": units}
    path.write_bytes(encode([header]) + encode(entries))
    return path


def seeds(directory):
    """{shard: {key: entry}} of the seeds an import wrote in ``directory``."""
    store = shard_store(directory)
    return {seed.stem: read_records(seed, None)[0] for seed in store.glob("*.seed")}


def invoke(*args):
    return CliRunner().invoke(app, ["state", *map(str, args)], env={"COLUMNS": "250"})


def test_import_to_another_shard_count_puts_each_instance_in_its_shard_bytes_unchanged(tmp_path):
    _, exported = read_state_file(state_file(tmp_path / "state.tsi"))
    done = invoke(
        "import", tmp_path / "state.tsi", "--recovery-dir", tmp_path / "64", "--shards", 64
    )
    assert done.exit_code == 0, done.output
    placed = seeds(tmp_path / "64")
    assert all(shard.endswith("-of-064") for shard in placed)
    assert all(shard_of(key, 64) == shard for shard, held in placed.items() for key in held)
    imported = {key: entry for held in placed.values() for key, entry in held.items()}
    assert {k: (e.kind, e.data) for k, e in imported.items()} == {
        e.key: (e.kind, e.data) for e in exported
    }
    assert any(entry.kind.startswith("packed") for entry in exported)
    assert seeded_inputs(tmp_path / "64") == INPUTS


@pytest.mark.parametrize("bad", ["0", "-1", "2000", "x"])
def test_import_refuses_a_bad_shard_count_naming_it_and_writes_nothing(tmp_path, bad):
    source = state_file(tmp_path / "state.tsi", units=3)
    new = tmp_path / "new"
    done = invoke("import", source, "--recovery-dir", new, "--shards", bad)
    assert done.exit_code == 2, done.output
    assert f"shard count '{bad}': must be a whole number from 1 to 1024, got '{bad}'" in done.output
    assert not new.exists()


def test_an_export_split_over_members_and_exported_again_is_the_same(tmp_path):
    source = state_file(tmp_path / "state.tsi")
    _, exported = read_state_file(source)
    dirs = [tmp_path / f"m{k}" for k in range(2)]
    for k, directory in enumerate(dirs):
        done = invoke("import", source, "--recovery-dir", directory, "--member", k, "--members", 2)
        assert done.exit_code == 0, done.output
        assert last_layout(directory) == Members(2, k)
        assert all(int(shard[6:9]) % 2 == k for shard in seeds(directory))  # P == the shard count
        assert all(int(w.split("/")[1].split("-")[0]) % 2 == k for w in seeded_inputs(directory))
    held = [set(committed_entries([d])) for d in dirs]
    assert held[0] and held[1] and not held[0] & held[1]
    assert export_state(dirs, tmp_path / "again.tsi").instances == len(exported)
    header, again = read_state_file(tmp_path / "again.tsi")
    assert header["inputs"] == INPUTS
    assert {e.key: e.data for e in again} == {e.key: e.data for e in exported}


def test_export_refuses_a_missing_member_and_a_shard_two_directories_hold(tmp_path):
    source = state_file(tmp_path / "state.tsi", units=10)
    dirs = [tmp_path / f"m{k}" for k in range(2)]
    for k, directory in enumerate(dirs):
        import_state(source, [directory], member=Members(2, k))
    with pytest.raises(NotOneClusterError, match="member 1 of 2 is missing"):
        export_state(dirs[:1], tmp_path / "out.tsi")
    shutil.copytree(dirs[0], tmp_path / "copy")
    done = invoke(
        "export", tmp_path / "out.tsi", *(f"--recovery-dir={d}" for d in [*dirs, tmp_path / "copy"])
    )
    said = done.output.strip().splitlines()
    assert done.exit_code == 2 and len(said) == 1, done.output
    assert "held by both" in said[0] and "m0 (member 0 of 2)" in said[0] and "copy" in said[0]
    alone = tmp_path / "alone"
    import_state(source, [alone])
    with pytest.raises(NotOneClusterError, match="held by both"):
        export_state([alone, dirs[1]], tmp_path / "out.tsi")
    assert not (tmp_path / "out.tsi").exists()


def test_a_members_import_takes_one_single_process_directory(tmp_path):
    source = state_file(tmp_path / "state.tsi", units=3)
    done = invoke(
        "import", source, "--recovery-dir", tmp_path / "a", "--recovery-dir", tmp_path / "b",
        "--member", 0, "--members", 2,
    )  # fmt: skip
    assert done.exit_code == 2 and "import once per member" in done.output, done.output
    done = invoke("import", source, "--recovery-dir", tmp_path / "a", "--member", 2, "--members", 2)
    assert done.exit_code == 2 and "member 2 of 2" in done.output, done.output
    done = invoke("import", source, "--recovery-dir", tmp_path / "a", "--member", 0)
    assert done.exit_code == 2 and "together" in done.output, done.output
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_the_default_shard_count_is_the_flows(tmp_path):
    source = state_file(tmp_path / "state.tsi", units=20)
    import_state(source, [tmp_path / "d"])
    for shard, held in seeds(tmp_path / "d").items():
        assert all(shard_index(key) == int(shard[6:9]) for key in held)
        assert shard.endswith(f"-of-{DEFAULT_SHARDS:03d}")


def test_members_of_another_shard_count_export_by_their_own_count(tmp_path):
    """Split over 3 members with 64 shards (where a shard's member differs from its member
    with 32), exported again: each instance once, from the member holding its shard of 64."""
    source = state_file(tmp_path / "state.tsi")
    _, exported = read_state_file(source)
    dirs = [tmp_path / f"m{k}" for k in range(3)]
    for k, directory in enumerate(dirs):
        import_state(source, [directory], shards=64, member=Members(3, k))
    moved = [e.key for e in exported if shard_index(e.key, 64) % 3 != shard_index(e.key) % 3]
    assert moved  # with 32 shards these would be another member's
    assert export_state(dirs, tmp_path / "again.tsi").instances == len(exported)
    _, again = read_state_file(tmp_path / "again.tsi")
    assert {e.key: e.data for e in again} == {e.key: e.data for e in exported}
    with pytest.raises(NotOneClusterError, match="different shard counts"):
        other = tmp_path / "other"
        import_state(source, [other], member=Members(3, 2))
        export_state([*dirs[:2], other], tmp_path / "mixed.tsi")
