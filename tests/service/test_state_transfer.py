"""Another number of processes: the state moves to new recovery directories
(``tsi state export`` / ``import``) and the service goes on exactly where it was.

The service runs as a real process on the project's Kafka broker; the first store is
killed (-9) mid-stream, its committed state exported and imported into a new store,
which then serves the rest of the stream: every feedback is applied exactly once and
every re-emitted selection is identical.
"""

import random
import signal
import subprocess
import sys
import time

import pytest
from confluent_kafka import Producer
from typer.testing import CliRunner

from flows.cli import app
from flows.service.recovery import input_offsets, read_states, seeded_inputs, store_offsets
from flows.service.registry import Registry
from flows.testing.kafka_broker import create_topic, unique_topic
from flows.tools.state import StateFileError, import_state, read_state_file
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
    new_store(new)

    produce(kafka_bootstrap, topic, events[half:])
    serve_until(env, new, reference_states(registry, events))  # exactly once, all of it

    assert_served_once_each(kafka_bootstrap, sel_topic, dlq_topic)


def test_import_refuses_a_store_in_use_and_a_file_cut_short(tmp_path):
    used = new_store(tmp_path / "used")
    (tmp_path / "empty").mkdir()
    header_only = tmp_path / "state.tsi"
    from flows.service.shard_store import encode

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
