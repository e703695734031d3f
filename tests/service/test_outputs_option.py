"""``tsi run --outputs``: selections and dead letters written to another sink than their
Kafka topics, chosen by one option (``settings.OUTPUT_SINKS``)."""

import orjson
import pytest

from flows.service.runtime.settings import OUTPUT_SINKS, ConfigError, Settings, output_sink
from flows.testing.kafka_broker import create_topic, unique_topic
from tests.service.test_operating import produce, requests, run_args, shop, tsi


def test_the_option_names_a_known_sink_and_its_target():
    assert output_sink("files:/tmp/x") == ("files", "/tmp/x")
    for bad in ("redis:x", "files", "files:", ":x"):
        with pytest.raises(ConfigError, match=f"--outputs / TSI_OUTPUTS must be .*got '{bad}'"):
            Settings.from_env({"TSI_REGISTRY": "r.toml", "TSI_OUTPUTS": bad})
    assert set(OUTPUT_SINKS) == {"files"}


def test_tsi_run_writes_its_outputs_to_files_and_needs_no_output_topics(kafka_bootstrap, tmp_path):
    """The events topic alone exists: the selections and dead letters go to JSON lines,
    each a line, the malformed message a dead letter with its reason."""
    registry = tmp_path / "registry.toml"
    registry.write_text(shop("ab"))
    names = {"ev": unique_topic("ev"), "sel": unique_topic("sel"), "dlq": unique_topic("dlq")}
    create_topic(kafka_bootstrap, names["ev"], 1)  # no selections or dead-letter topic
    produce(kafka_bootstrap, names["ev"], requests(["r0", "r1", "r2"]))
    produce(kafka_bootstrap, names["ev"], [{"type": "request", "experiment": "nope"}])
    out = tmp_path / "out"
    args = run_args(kafka_bootstrap, names, registry, "--recovery-dir", tmp_path / "rec")
    done = tsi("run", *args, "--stop-at-end", "--outputs", f"files:{out}")
    assert done.returncode == 0, done.stderr
    selections = [
        orjson.loads(line) for line in (out / "selections.jsonl").read_bytes().splitlines()
    ]
    letters = [
        orjson.loads(line) for line in (out / "dead_letters.jsonl").read_bytes().splitlines()
    ]
    assert sorted(s["request_id"] for s in selections) == ["r0", "r1", "r2"]
    assert [d["reason"] for d in letters] == ["missing_field"]
