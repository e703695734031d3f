"""An operator's first hour with ``tsi run`` on the real broker, as the docs tell it:
fresh topics from ``tsi topics create``, requests whose feedback never comes, a second
process started on the same recovery directory, Ctrl-C and SIGTERM."""

import signal
import time
import urllib.error
import urllib.request

import orjson

from flows.service.runtime.recovery import read_states
from flows.testing.kafka_broker import consume_all, unique_topic
from tests.service.streams import comparable
from tests.service.test_operating import (
    free_port,
    messages,
    produce,
    requests,
    start,
    tsi,
)
from tests.waiting import wait_for

TTL_REGISTRY = """
[experiments.shop]
arms = ["a", "b", "c"]
per_unit = true
feedback_ttl = 3
"""


def default_topics(bootstrap, partitions=3):
    """The default two-topic setup, created as the docs say (``tsi topics create``)."""
    names = {n: unique_topic(n) for n in ("req", "fb", "sel", "dlq", "int")}
    options = [
        *("--brokers", bootstrap, "--requests-topic", names["req"]),
        *("--feedback-topic", names["fb"], "--selections-topic", names["sel"]),
        *("--dlq-topic", names["dlq"], "--internal-topic", names["int"]),
    ]
    done = tsi("topics", "create", *options, "--partitions", partitions)
    assert done.returncode == 0, done.stderr
    return names, options


def scrape(port, path="/metrics"):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except urllib.error.URLError:  # not listening yet
        return 0, ""


def metric(text, prefix):
    lines = [line for line in text.splitlines() if line.startswith(prefix)]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def test_tickets_expire_in_a_process_started_while_input_partitions_are_empty(
    kafka_bootstrap, tmp_path
):
    names, options = default_topics(kafka_bootstrap)
    (tmp_path / "registry.toml").write_text(TTL_REGISTRY)
    port = free_port()
    proc = start(
        "--registry", tmp_path / "registry.toml", *options,
        "--recovery-dir", tmp_path / "rec", "--metrics-port", port, "--snapshot-every", "1",
        log_file=tmp_path / "run.log",
    )  # fmt: skip
    try:
        wait_for(lambda: scrape(port, "/ready")[0] == 200, proc, what="readiness")
        # one unit: one requests partition gets them all, the others and feedback stay empty
        produce(kafka_bootstrap, names["req"], requests([f"r{i}" for i in range(20)]))
        expired = 'tsi_feedback_total{experiment="shop",outcome="expired_ticket"}'
        wait_for(lambda: metric(scrape(port)[1], expired) == 20, proc, 60, "expiry")
        text = scrape(port)[1]
        assert metric(text, "tsi_pending_tickets") == 0
        assert metric(text, "tsi_expiry_held_back{") == 0
        assert metric(text, "tsi_expiry_delay_seconds") < 5
        wait_for(lambda: len(messages(kafka_bootstrap, names["dlq"])) >= 20, proc, 30, "DLQ")
    finally:
        proc.kill()
        proc.wait()
    letters = messages(kafka_bootstrap, names["dlq"])
    assert sorted(d["reason"] for d in letters) == ["ticket_expired"] * 20
    answered = [m for part in consume_all(kafka_bootstrap, names["sel"]).values() for m in part]
    assert len(answered) == 20


def serve(tmp_path, options, port, recovery="rec", log="run.log"):
    return start(
        "--registry", tmp_path / "registry.toml", *options, "--recovery-dir", tmp_path / recovery,
        "--metrics-port", port, "--snapshot-every", "0.5",
        log_file=tmp_path / log,
    )  # fmt: skip


def selections(bootstrap, topic):
    return [orjson.loads(v) for part in consume_all(bootstrap, topic).values() for _, v, _ in part]


def test_a_second_process_on_the_same_recovery_directory_is_refused_in_one_line(
    kafka_bootstrap, tmp_path
):
    names, options = default_topics(kafka_bootstrap)
    (tmp_path / "registry.toml").write_text(TTL_REGISTRY.replace("feedback_ttl = 3", ""))
    port = free_port()
    first = serve(tmp_path, options, port)
    try:
        wait_for(lambda: scrape(port, "/ready")[0] == 200, first, what="readiness")
        second = tsi(
            "run", "--registry", tmp_path / "registry.toml", *options,
            "--recovery-dir", tmp_path / "rec", "--log-file", tmp_path / "second.log",
        )  # fmt: skip
        assert second.returncode == 2
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and "is in use by another process" in lines[0], lines
        produce(kafka_bootstrap, names["req"], requests([f"r{i}" for i in range(10)]))
        wait_for(lambda: len(selections(kafka_bootstrap, names["sel"])) >= 10, first)
        time.sleep(2.0)  # a second writer would answer each request a second time
    finally:
        first.kill()
        first.wait()
    answers = selections(kafka_bootstrap, names["sel"])
    assert sorted(a["request_id"] for a in answers) == sorted(f"r{i}" for i in range(10))


APPLIED = 'tsi_feedback_total{experiment="shop",outcome="applied"}'


def serve_then_stop(bootstrap, tmp_path, names, options, unit, sig):
    """Start, serve 30 requests of ``unit`` with their feedback, stop with ``sig``: the
    stop's exit status and the lines the terminal got."""
    port = free_port()
    proc = serve(tmp_path, options, port)
    ids = [f"{unit}-{i}" for i in range(30)]
    produce(bootstrap, names["req"], requests(ids, unit=unit))
    feedback = [{**event, "type": "feedback", "loss": 1.0} for event in requests(ids, unit)]
    produce(bootstrap, names["fb"], feedback)
    wait_for(lambda: metric(scrape(port)[1], APPLIED) == len(ids), proc, what="feedback")
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err.strip().splitlines()


def test_ctrl_c_and_sigterm_stop_cleanly_with_the_epoch_committed(kafka_bootstrap, tmp_path):
    names, options = default_topics(kafka_bootstrap)
    (tmp_path / "registry.toml").write_text(TTL_REGISTRY.replace("feedback_ttl = 3", ""))
    for unit, sig in (("u1", signal.SIGINT), ("u2", signal.SIGTERM)):
        status, lines = serve_then_stop(kafka_bootstrap, tmp_path, names, options, unit, sig)
        assert status == 0, lines
        assert len(lines) == 2 and lines[1] == (
            f"tsi run: stopped ({sig.name} received): the last epoch is committed"
        ), lines
    log = (tmp_path / "run.log").read_text()
    assert "Traceback" not in log and "panic" not in log.lower()
    states = read_states(tmp_path / "rec")  # every feedback in the committed state, once
    assert sum(s["bandit"]["n_updates"] for s in states.values()) == 60


def test_a_damaged_recovery_directory_is_refused_and_rebuild_restores_every_state(
    kafka_bootstrap, tmp_path
):
    names, options = default_topics(kafka_bootstrap)
    options = [*options, "--no-changelog"]  # the way out without one: --rebuild
    (tmp_path / "registry.toml").write_text(TTL_REGISTRY.replace("feedback_ttl = 3", ""))
    for unit in ("u1", "u2"):
        status, lines = serve_then_stop(
            kafka_bootstrap, tmp_path, names, options, unit, signal.SIGTERM
        )
        assert status == 0, lines
    served = {a["request_id"]: a for a in selections(kafka_bootstrap, names["sel"])}
    before = {key: comparable(state) for key, state in read_states(tmp_path / "rec").items()}
    assert sum(state[0]["n_updates"] for state in before.values()) == 60
    (tmp_path / "rec" / "part-0.sqlite3").write_bytes(b"damaged" * 100)
    args = ["run", "--registry", tmp_path / "registry.toml", *options]
    refused = tsi(*args, "--recovery-dir", tmp_path / "rec")
    assert refused.returncode == 2
    assert "--rebuild" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    not_empty = tsi(*args, "--recovery-dir", tmp_path / "rec", "--rebuild")
    assert not_empty.returncode == 2 and "move it aside" in not_empty.stderr
    (tmp_path / "rec").rename(tmp_path / "rec.damaged")
    port = free_port()
    proc = serve(tmp_path, [*options, "--rebuild"], port)
    try:
        wait_for(lambda: metric(scrape(port)[1], APPLIED) == 60, proc, what="the rebuild")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    finally:
        proc.kill()
    after = {key: comparable(state) for key, state in read_states(tmp_path / "rec").items()}
    assert after == before
    answers = selections(kafka_bootstrap, names["sel"])
    assert len(answers) == 120  # every answer sent again, identical
    assert all(answer == served[answer["request_id"]] for answer in answers)
