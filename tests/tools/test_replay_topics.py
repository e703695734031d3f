"""``tsi replay --topic`` on the service's default two-topic setup: its internal topic (the
copies read as the service reads them) or its two input topics (merged by Kafka time)
replay what was served; a topic read as something it is not, like any log whose every
line becomes a dead letter, exits non-zero (see ``flows.tools.replay_input.TopicLog``)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer
from typer.testing import CliRunner

from flows.cli import app
from flows.service.connectors.kafka import FEEDBACK_TAG, REQUEST_TAG
from flows.service.wire._records import internal_copy
from flows.service.wire.events import Origin
from flows.service.wire.keys import instance_key
from flows.testing.kafka_broker import consume_all, create_topic, unique_topic

TOML = (
    '[experiments.e]\narms = ["a", "b"]\nseed = 3\n'
    '[experiments.u]\narms = ["x", "y", "z"]\nper_unit = true\nseed = 4\n'
)
REQUESTS = 90


def cli(*args: Any, env: dict[str, str] | None = None):
    return CliRunner(env=env).invoke(app, [str(a) for a in args])


def said_lines(stderr: str) -> list[str]:
    """What a command said on stderr (the progress bar leaves a blank line off a terminal)."""
    return [line for line in stderr.splitlines() if line]


def lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines()


def closed(out: Path) -> list[tuple[str, str, str]]:
    """What the end of the log closed, but for where each line came from."""
    letters = map(orjson.loads, lines(out / "pending_at_end.jsonl"))
    return [(d["reason"], d["instance"], d["detail"]) for d in letters]


def traffic() -> list[tuple[str, dict[str, Any]]]:
    """(kind, event) as clients send them to the two topics (no 'type', no 'ts'): each
    request's feedback three requests later, so that later answers depend on it."""
    out: list[tuple[str, dict[str, Any]]] = []
    asked = []
    for i in range(REQUESTS):
        event = {"experiment": "e", "request_id": f"r{i}"}
        if i % 3:
            event = {"experiment": "u", "unit": f"n{i % 4}", "request_id": f"r{i}"}
        out.append(("request", event))
        asked.append(event)
        if i >= 3:
            answered = asked[i - 3]
            out.append(("feedback", {**answered, "loss": (i * 7919) % 5 / 2}))
    return out


def key_of(event: dict[str, Any]) -> str:
    return instance_key(event["experiment"], event.get("unit"))


def written(events: list[tuple[str, dict[str, Any]]], bootstrap: str) -> dict[str, str]:
    """The traffic written as the service's setup holds it: the two input topics (one
    partition each), the internal topic its copy stage writes (two partitions keyed by
    instance, ``internal_copy``) with a second copy a crash would add and a message
    someone else wrote; Kafka times in the traffic's order."""
    names = {"request": unique_topic("q"), "feedback": unique_topic("f")}
    internal = unique_topic("internal")
    for topic in names.values():
        create_topic(bootstrap, topic, 1)
    create_topic(bootstrap, internal, 2)
    tags = {names["request"]: REQUEST_TAG, names["feedback"]: FEEDBACK_TAG}
    producer = Producer({"bootstrap.servers": bootstrap})
    base_ms = int(time.time() * 1000) - 3_600_000  # brokers refuse times in the future
    offsets = {"request": 0, "feedback": 0}
    copies = []
    for i, (kind, event) in enumerate(events):
        raw, at = orjson.dumps(event), base_ms + 10 * i
        producer.produce(names[kind], raw, key=key_of(event), timestamp=at)
        origin = Origin(names[kind], 0, offsets[kind], at / 1000)
        offsets[kind] += 1
        key, value, headers = internal_copy((key_of(event), raw, origin), tags)
        copies.append((zlib.crc32(key) % 2, key, value, headers))
        producer.produce(internal, value, key, zlib.crc32(key) % 2, timestamp=at, headers=headers)
    late = base_ms + 10 * len(events)
    part, key, value, headers = copies[5]  # a request copied again
    producer.produce(internal, value, key, part, timestamp=late, headers=headers)
    producer.produce(internal, b'{"not": "a copy"}', b"k", 0, timestamp=late + 1)
    assert producer.flush(30) == 0
    return {"requests": names["request"], "feedback": names["feedback"], "internal": internal}


def test_the_internal_topic_and_the_two_input_topics_replay_what_one_log_gives(
    kafka_bootstrap, tmp_path
):
    events = traffic()
    registry, log = tmp_path / "r.toml", tmp_path / "events.jsonl"
    registry.write_text(TOML)
    log.write_bytes(b"".join(orjson.dumps({"type": k, **e}) + b"\n" for k, e in events))
    done = cli("replay", "--registry", registry, "--events", log, "--out", tmp_path / "ref")
    assert done.exit_code == 0, done.output
    reference = lines(tmp_path / "ref" / "selections.jsonl")
    assert len(reference) == REQUESTS
    # the feedback moved the policies: an order that put it elsewhere would answer otherwise
    assert len({orjson.loads(s)["prob"] for s in reference}) > 10
    topics = written(events, kafka_bootstrap)
    names = ("--requests-topic", topics["requests"], "--feedback-topic", topics["feedback"])
    names += ("--internal-topic", topics["internal"], "--brokers", kafka_bootstrap)
    base = ("replay", "--registry", registry, *names, "--no-report")

    done = cli(*base, "--topic", topics["feedback"], "--topic", topics["requests"], "--out",
               tmp_path / "two")  # fmt: skip
    assert done.exit_code == 0, done.stderr
    assert f"{len(events)} lines" in done.stdout and "0 dead letters" in done.stdout
    assert lines(tmp_path / "two" / "selections.jsonl") == reference
    assert closed(tmp_path / "two") == closed(tmp_path / "ref")

    done = cli(*base, "--topic", topics["internal"], "--out", tmp_path / "internal")
    assert done.exit_code == 0, done.stderr
    assert f"{len(events) + 1} lines" in done.stdout  # the second copy is no line
    assert lines(tmp_path / "internal" / "selections.jsonl") == reference
    [letter] = map(orjson.loads, lines(tmp_path / "internal" / "dead_letters.jsonl"))
    assert (letter["reason"], letter["source"]) == ("not_a_copy", topics["internal"])
    inputs = orjson.loads((tmp_path / "internal" / "inputs.json").read_bytes())
    assert inputs["topics"] == [topics["internal"]] and inputs["brokers"] == kafka_bootstrap

    # the requests topic read as combined events (its name not given as the requests
    # topic's): every line a dead letter, said in one line, exit 2, the outputs written
    out = tmp_path / "combined"
    done = cli("replay", "--registry", registry, "--topic", topics["requests"],
               "--brokers", kafka_bootstrap, "--out", out)  # fmt: skip
    assert done.exit_code == 2, done.stdout
    [said] = said_lines(done.stderr)
    assert said.startswith(f"tsi replay: every one of the {REQUESTS} lines became a dead letter")
    assert "field 'type' must be 'request' or 'feedback'" in said and str(out) in said
    assert said.endswith(
        f"({topics['requests']} read as combined events: name the service's topics with "
        "--requests-topic, --feedback-topic, --internal-topic, as for tsi run)"
    )
    assert len(lines(out / "dead_letters.jsonl")) == REQUESTS and (out / "REPORT.md").exists()


@pytest.mark.parametrize(
    ("topics", "message"),
    [
        (["tsi.requests"], "--topic tsi.requests (the requests topic) needs the feedback "
         "topic tsi.feedback too, or replay the internal topic tsi.events.internal alone"),
        (["tsi.feedback", "tsi.events.internal"], "the internal topic tsi.events.internal "
         "holds copies of both input topics: replay it alone (without tsi.feedback)"),
        (["tsi.events", "tsi.events"], "--topic tsi.events is given twice"),
        (["tsi.events", ""], "--topic must name a topic, got ['tsi.events', '']"),
    ],
)  # fmt: skip
def test_topics_that_cannot_be_replayed_together_are_refused_naming_them(tmp_path, topics, message):
    registry = tmp_path / "r.toml"
    registry.write_text(TOML)
    args = [a for t in topics for a in ("--topic", t)]
    done = cli("replay", "--registry", registry, *args, "--out", tmp_path / "out")
    assert done.exit_code == 2 and done.stderr == f"tsi replay: {message}\n"
    assert not (tmp_path / "out").exists()


def test_a_log_whose_every_line_is_a_dead_letter_exits_non_zero_with_its_outputs(tmp_path):
    log, registry, out = tmp_path / "requests.jsonl", tmp_path / "r.toml", tmp_path / "out"
    registry.write_text(TOML)
    # a requests log (no 'type') given as the combined log, and a line that is no JSON
    log.write_bytes(b'{"experiment": "e", "request_id": "r1"}\n{\n')
    done = cli("replay", "--registry", registry, "--events", log, "--out", out)
    assert done.exit_code == 2
    assert done.stdout.startswith("2 lines from") and "0 selections" in done.stdout
    assert said_lines(done.stderr) == [
        "tsi replay: every one of the 2 lines became a dead letter (1 missing_field, "
        "1 malformed_json), the first missing_field: field 'type' must be 'request' or "
        f"'feedback', got None; see {out}"
    ]
    assert len(lines(out / "dead_letters.jsonl")) == 2 and (out / "REPORT.md").exists()
    # one line served is a replay: exit 0
    log.write_bytes(b'{"type": "request", "experiment": "e", "request_id": "r1"}\n{\n')
    assert cli("replay", "--registry", registry, "--events", log, "--out", out).exit_code == 0


SERVICE_TOML = '[experiments.shop]\narms = ["a", "b", "c"]\nper_unit = true\nseed = 5\n'


def test_a_two_topic_service_run_replays_to_what_it_served(kafka_bootstrap, tmp_path):
    """The real service on its default setup (two input topics copied to its internal
    topic): its topics replay to its selections, byte for byte."""
    from tests.service.streams import start_service
    from tests.service.test_two_topics import two_topic_env

    topics = {n: unique_topic(n) for n in ("requests", "feedback", "sel", "dlq", "internal")}
    for name, topic in topics.items():
        create_topic(kafka_bootstrap, topic, 1 if name == "dlq" else 2)
    registry, recovery = tmp_path / "registry.toml", tmp_path / "recovery"
    registry.write_text(SERVICE_TOML)
    recovery.mkdir()
    subprocess.run([sys.executable, "-m", "bytewax.recovery", str(recovery), "1"], check=True)
    proc = start_service(two_topic_env(kafka_bootstrap, registry, topics), recovery)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})

    def send(kind: str, batch: list[dict[str, Any]]) -> None:
        for event in batch:
            producer.produce(topics[kind], orjson.dumps(event), key=key_of(event))
        assert producer.flush(10) == 0

    def wait_for(topic: str, count: int) -> list[bytes]:
        deadline = time.monotonic() + 90
        while True:
            got = [v for part in consume_all(kafka_bootstrap, topic).values() for _, v, _ in part]
            if len(got) >= count:
                return got
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()[-2000:]
            time.sleep(0.3)

    first = [{"experiment": "shop", "unit": f"u{i % 4}", "request_id": f"r{i}"} for i in range(20)]
    later = [{**e, "request_id": f"r{i + 20}"} for i, e in enumerate(first)]
    try:
        send("requests", first)
        answers = {orjson.loads(s)["request_id"]: s for s in wait_for(topics["sel"], 20)}
        send("feedback", [{**e, "loss": float(orjson.loads(answers[e["request_id"]])["arm"])}
                          for e in first])  # fmt: skip
        wait_for(topics["internal"], 40)  # the feedback is in the log served from
        send("requests", later)
        served = wait_for(topics["sel"], 40)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert {orjson.loads(s)["prob"] for s in served} != {1 / 3}  # the feedback counted
    env = {"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap}  # and the topics' names, as tsi run's
    env |= {f"TSI_TOPIC_{n.upper()}": topics[n] for n in ("requests", "feedback", "internal")}
    for given in ([topics["internal"]], [topics["requests"], topics["feedback"]]):
        out = tmp_path / "-".join(given)
        args = (a for t in given for a in ("--topic", t))
        done = cli("replay", "--registry", registry, *args, "--out", out, "--no-report", env=env)
        assert done.exit_code == 0, done.stderr
        assert "60 lines" in done.stdout and "20 feedback applied, 0 dead letters" in done.stdout
        assert sorted(lines(out / "selections.jsonl")) == sorted(served)
