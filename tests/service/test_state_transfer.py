"""Another number of processes: the state moves to new recovery directories
(``tsi state export`` / ``import``) and the service goes on exactly where it was.

The service runs as real processes on the project's Kafka broker: a store killed (-9)
mid-stream, and 1 -> 2 -> 1 processes of ``tsi run`` with a directory each (the
compose/Kubernetes layout), moved by the documented sequence alone (stop, export, import,
run with the same consumer group): every feedback is applied exactly once, every
re-emitted selection is identical, and the state equals an uninterrupted run's.
"""

import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer
from typer.testing import CliRunner

from flows.cli import app
from flows.service.connectors.kafka_admin import group_offsets
from flows.service.instances.registry import Registry
from flows.service.runtime.recovery import (
    NotOneClusterError,
    check_recovery_dir,
    committed_shard_states,
    input_offsets,
    read_states,
    seeded_inputs,
    store_offsets,
)
from flows.testing.kafka_broker import consume_all, create_topic, free_port, unique_topic
from flows.tools.state import StateFileError, export_state, import_state, read_state_file
from tests.service.streams import (
    REGISTRY_TOML,
    assert_served_once_each,
    comparable,
    event_stream,
    reference_states,
    service_env,
    start_service,
)


def new_store(path):
    path.mkdir(exist_ok=True)
    subprocess.run([sys.executable, "-m", "bytewax.recovery", str(path), "1"], check=True)
    return path


def produce(bootstrap, topic, events):
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for key, value in events:
        producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0


def serve_until(env, recovery, expected, seconds=120):
    """Run the service on ``recovery`` until its committed state is ``expected``; kill -9."""
    proc = start_service(env, recovery)
    want = {k: comparable(v) for k, v in expected.items()}
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(1.0)
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            if {k: comparable(v) for k, v in read_states(recovery).items()} == want:
                return
        raise AssertionError(f"{recovery} did not reach the expected state")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def test_the_state_moves_to_a_new_store_and_the_service_goes_on_exactly(kafka_bootstrap, tmp_path):
    events = event_stream(random.Random(7))
    half = len(events) // 2
    topic, sel_topic, dlq_topic = (unique_topic(n) for n in ("ev", "sel", "dlq"))
    create_topic(kafka_bootstrap, topic, 3)
    create_topic(kafka_bootstrap, sel_topic, 3)
    create_topic(kafka_bootstrap, dlq_topic, 1)
    registry_path = tmp_path / "registry.toml"
    registry_path.write_text(REGISTRY_TOML)
    env = service_env(kafka_bootstrap, registry_path, topic, sel_topic, dlq_topic)
    registry = Registry.from_toml(REGISTRY_TOML)

    produce(kafka_bootstrap, topic, events[:half])
    old = new_store(tmp_path / "old")
    serve_until(env, old, reference_states(registry, events[:half]))

    runner = CliRunner()
    exported = runner.invoke(
        app, ["state", "export", str(tmp_path / "state.tsi"), "--recovery-dir", str(old)]
    )
    assert exported.exit_code == 0, exported.output
    new = tmp_path / "new"
    imported = runner.invoke(
        app, ["state", "import", str(tmp_path / "state.tsi"), "--recovery-dir", str(new)]
    )
    assert imported.exit_code == 0, imported.output
    assert input_offsets(seeded_inputs(new)) == store_offsets(old)  # where the new one starts

    produce(kafka_bootstrap, topic, events[half:])
    serve_until(env, new, reference_states(registry, events))  # exactly once, all of it

    assert_served_once_each(kafka_bootstrap, sel_topic, dlq_topic)


def test_import_refuses_a_store_in_use_and_a_file_cut_short(tmp_path):
    used = new_store(tmp_path / "used")
    (tmp_path / "empty").mkdir()
    header_only = tmp_path / "state.tsi"
    from flows.service.shards.shard_log import encode

    header = {"format": "tsi.state", "version": 1, "inputs": {}, "instances": 2}
    header_only.write_bytes(encode([header]))
    with pytest.raises(StateFileError, match="holds 0 of 2 instances"):
        read_state_file(header_only)
    header_only.write_bytes(encode([{**header, "instances": 0}]))
    with pytest.raises(StateFileError, match="is in use"):
        import_state(header_only, [tmp_path / "empty", used])
    assert not (tmp_path / "empty" / "shards").exists()  # nothing written anywhere
    cut = tmp_path / "cut.tsi"
    cut.write_bytes(header_only.read_bytes()[:-3])
    result = CliRunner().invoke(app, ["state", "import", str(cut), "--recovery-dir", "x"])
    assert result.exit_code == 2 and "not a whole tsi state file" in result.output


TSI = str(Path(sys.executable).parent / "tsi")


def tsi_run(args, recovery_dirs, timeout=240):
    """``tsi run ARGS --stop-at-end`` as one process or a cluster (a directory each), to
    the end of the input; every process must end with exit status 0."""
    addresses = ";".join(f"127.0.0.1:{free_port()}" for _ in recovery_dirs)
    procs = []
    for index, directory in enumerate(recovery_dirs):
        cluster = ["--process-id", str(index), "--addresses", addresses]
        more = cluster if len(recovery_dirs) > 1 else []
        cmd = [TSI, "run", *args, "--recovery-dir", str(directory), "--stop-at-end", *more]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    try:
        for proc in procs:
            _, err = proc.communicate(timeout=timeout)
            assert proc.returncode == 0, err.decode()[-2000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()


def markers(directory):
    """The shards whose committed marker lies in ``directory``'s partitions (a key group's
    row holds several shards' markers)."""
    return set(committed_shard_states(directory, "tsi.shards"))


def tsi_state(*args):
    done = subprocess.run([TSI, "state", *map(str, args)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def dirs_args(dirs):
    return [a for d in dirs for a in ("--recovery-dir", str(d))]


def test_one_to_two_to_one_processes_with_a_directory_each_equal_an_uninterrupted_run(
    kafka_bootstrap, tmp_path
):
    events = event_stream(random.Random(11))
    cuts = [0, 180, 360, 540, len(events)]
    topic, sel_topic, dlq_topic = (unique_topic(n) for n in ("ev", "sel", "dlq"))
    create_topic(kafka_bootstrap, topic, 4)
    create_topic(kafka_bootstrap, sel_topic, 4)
    create_topic(kafka_bootstrap, dlq_topic, 1)
    registry_path = tmp_path / "registry.toml"
    registry_path.write_text(REGISTRY_TOML)
    registry = Registry.from_toml(REGISTRY_TOML)
    group = f"group-{uuid.uuid4().hex[:8]}"
    args = [
        "--registry", str(registry_path), "--brokers", kafka_bootstrap, "--events-topic", topic,
        "--selections-topic", sel_topic, "--dlq-topic", dlq_topic, "--group-id", group,
        "--snapshot-every", "0.5",
    ]  # fmt: skip

    def serve(part, dirs):
        produce(kafka_bootstrap, topic, events[cuts[part] : cuts[part + 1]])
        tsi_run(args, dirs)
        want = reference_states(registry, events[: cuts[part + 1]])
        got = read_states(dirs)
        assert {k: comparable(v) for k, v in got.items()} == {
            k: comparable(v) for k, v in want.items()
        }

    one = [tmp_path / "one"]
    serve(0, one)
    tsi_state("export", tmp_path / "1.tsi", *dirs_args(one))
    two = [tmp_path / "two-0", tmp_path / "two-1"]
    assert "into 2 recovery directories" in tsi_state("import", tmp_path / "1.tsi", *dirs_args(two))
    serve(1, two)  # the imported store: no partitions to make, no new group, no --fresh
    serve(2, two)  # the cluster restarts on its own directories
    crossed = [
        shard
        for index, directory in enumerate(two)
        for shard in markers(directory)
        if list((two[1 - index] / "shards").glob(f"{shard}.*.log"))
    ]
    assert crossed  # a marker in one process's directory, its log in the other's
    with pytest.raises(NotOneClusterError, match="every process"):
        read_states(two[:1])  # a directory left out is refused, not read as a whole
    tsi_state("export", tmp_path / "2.tsi", *dirs_args(two))
    final = [tmp_path / "final"]
    tsi_state("import", tmp_path / "2.tsi", *dirs_args(final))
    serve(3, final)

    ends = {(topic, p): len(msgs) for p, msgs in consume_all(kafka_bootstrap, topic).items()}
    assert store_offsets(final[0]) == ends  # every event read once, where a run ends
    assert group_offsets([kafka_bootstrap], {}, group, [topic]) == ends
    assert_served_once_each(kafka_bootstrap, sel_topic, dlq_topic)


def state_file(path, instances=0):
    """A state file holding nothing but input positions."""
    from flows.service.shards.shard_log import encode

    inputs = {"tsi.events_in.kafka_input/0-ev": 7}
    header = {"format": "tsi.state", "version": 1, "inputs": inputs, "instances": instances}
    path.write_bytes(encode([header]))
    return path


def holder(directory, process=0):
    """Another process holding ``directory``'s recovery lock, as a running service does."""
    code = (
        "import sys, time; from flows.service.runtime.dir_lock import hold_directory; "
        f"hold_directory({str(directory)!r}, {process}); print('held', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_import_makes_the_partitions_tsi_run_starts_from(tmp_path):
    source = state_file(tmp_path / "state.tsi")
    shared, each = tmp_path / "shared", [tmp_path / "p0", tmp_path / "p1"]
    import_state(source, [shared], processes=3)  # one directory the 3 processes share
    assert sorted(p.name for p in shared.glob("part-*")) == [f"part-{i}.sqlite3" for i in range(3)]
    import_state(source, each)  # one directory per process, each as `tsi run` makes it
    for directory in each:
        assert check_recovery_dir(directory, processes=2) == [
            directory / f"part-{i}.sqlite3" for i in range(2)
        ]
        assert input_offsets(seeded_inputs(directory)) == {("ev", 0): 7}
    with pytest.raises(StateFileError, match="2 recovery directories for 3 processes"):
        import_state(source, [tmp_path / "a", tmp_path / "b"], processes=3)
    with pytest.raises(StateFileError, match="given twice"):
        import_state(source, [tmp_path / "a", tmp_path / "." / "a"])
    assert not (tmp_path / "a").exists()  # nothing written


def test_export_and_import_refuse_a_directory_a_service_holds(tmp_path):
    source = state_file(tmp_path / "state.tsi")
    store = tmp_path / "store"
    import_state(source, [store])
    running = holder(store)
    try:
        done = CliRunner().invoke(
            app, ["state", "export", str(tmp_path / "out.tsi"), "--recovery-dir", str(store)]
        )
        assert done.exit_code == 2 and "stop the service first" in done.output, done.output
        assert len(done.output.strip().splitlines()) == 1
        assert not (tmp_path / "out.tsi").exists()
    finally:
        running.kill()
        running.wait()
    empty = tmp_path / "empty"
    empty.mkdir()
    running = holder(empty, process=1)
    try:
        with pytest.raises(StateFileError, match="process id 1\\): stop the service first"):
            import_state(source, [tmp_path / "new", empty], processes=2)
        assert not (tmp_path / "new").exists() and not (empty / "shards").exists()
    finally:
        running.kill()
        running.wait()
    assert export_state([store], tmp_path / "out.tsi").input_partitions == 1
    holder(store).kill()  # the export let go of the directory


def tsi_run_refusal(recovery_dir, *cluster):
    """``tsi run`` on ``recovery_dir``: its exit status and what it said (the recovery
    directory is checked before any broker is asked)."""
    registry = recovery_dir.parent / "registry.toml"
    registry.write_text(REGISTRY_TOML)
    args = ["--registry", str(registry), "--brokers", "127.0.0.1:1", "--connect-timeout", "1"]
    cmd = [TSI, "run", *args, "--recovery-dir", str(recovery_dir), *cluster]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    return done.returncode, done.stderr.strip().splitlines()


def test_tsi_run_refuses_a_store_without_partitions_or_of_another_cluster(tmp_path):
    source = state_file(tmp_path / "state.tsi")
    store = tmp_path / "store"
    import_state(source, [store])
    for part in store.glob("part-*"):
        part.unlink()  # the shards' seeds alone, as imports before this release left them
    status, said = tsi_run_refusal(store)
    assert status == 2 and len(said) == 1 and "but no Bytewax recovery partitions" in said[0]
    two = tmp_path / "two"
    import_state(source, [two], processes=2)
    status, said = tsi_run_refusal(two)  # one process on a 2-process cluster's directory
    assert status == 2 and len(said) == 1, said
    assert "of a cluster of 2 processes" in said[0] and "this one has 1" in said[0]
    one = tmp_path / "one"
    import_state(source, [one])
    addresses = f"127.0.0.1:{free_port()};127.0.0.1:{free_port()}"
    status, said = tsi_run_refusal(one, "--process-id", "0", "--addresses", addresses)
    assert status == 2 and len(said) == 1 and "this one has 2" in said[0], said


def test_export_refuses_a_set_with_a_directory_left_out_or_of_two_clusters(tmp_path):
    runner = CliRunner()
    mixed = [tmp_path / "a", tmp_path / "b"]
    import_state(state_file(tmp_path / "state.tsi"), mixed[:1])
    import_state(state_file(tmp_path / "state.tsi"), mixed[1:], processes=2)
    out = str(tmp_path / "out.tsi")
    done = runner.invoke(app, ["state", "export", out, *dirs_args(mixed)])
    assert done.exit_code == 2 and "partitions of different clusters" in done.output, done.output
    done = runner.invoke(app, ["inspect", *dirs_args(mixed)])
    assert done.exit_code == 2 and "partitions of different clusters" in done.output, done.output
