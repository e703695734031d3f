"""Experiments managed by API on the real broker: the CLI and the gateway write the
experiments topic, a running ``tsi run --experiments-topic`` serves what they say (the
control arm once paused, nothing once archived), and the history says who changed what."""

import subprocess

import orjson
import pytest
from confluent_kafka import Producer

from flows.testing.kafka_broker import free_port, unique_topic
from tests.client.service import get, post
from tests.service.test_first_hour import metric, scrape
from tests.service.test_operating import TSI, service_topics, start
from tests.waiting import wait_for

SPEC = """
[experiments.shop]
arms = ["control", "green", "blue"]
feedback_ttl = 600
"""


def tsi(*args):
    """``tsi ARGS``: (exit status, stdout, stderr)."""
    done = subprocess.run(
        [TSI, *map(str, args)], capture_output=True, text=True, timeout=120, check=False
    )
    return done.returncode, done.stdout, done.stderr


def put(port, path, body):
    """(status, JSON body) of a PUT to the gateway."""
    import urllib.error
    import urllib.request

    data = body if isinstance(body, bytes) else orjson.dumps(body)
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data, {"content-type": "application/json"}, method="PUT"
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, orjson.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, orjson.loads(exc.read())


@pytest.fixture
def stack(kafka_bootstrap, tmp_path):
    """(the CLI's options, the gateway's port, the service's decide): an application of
    its own, its experiment applied by the CLI before the service starts."""
    app = unique_topic("app")
    names = service_topics(kafka_bootstrap, partitions=1)
    common = ["--brokers", kafka_bootstrap, "--group-id", app]
    spec = tmp_path / "shop.toml"
    spec.write_text(SPEC)
    status, out, err = tsi("experiments", "apply", "-f", spec, *common, "--who", "alice")
    assert status == 0, err
    assert "shop: create, version 1" in out and 'spec.arms: (none) -> ["control"' in out
    assert tsi("experiments", "apply", "-f", spec, *common)[1] == "shop: unchanged (version 1)\n"
    topics = [*("--events-topic", names["ev"]), *("--selections-topic", names["sel"])]
    topics += ["--dlq-topic", names["dlq"]]
    metrics = free_port()
    service = start(
        "--experiments-topic", *common, *topics, "--snapshot-every", "0.5",
        "--recovery-dir", tmp_path / "rec", "--metrics-port", metrics,
        log_file=tmp_path / "run.log",
    )  # fmt: skip
    port = free_port()
    gateway = subprocess.Popen(
        [TSI, "serve", "--experiments-topic", *common, *topics, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: scrape(metrics, "/ready")[0] == 200, service, what="tsi run")
        wait_for(lambda: get(port, "/healthz")[0] == 200, gateway, 60, "tsi serve")
        yield common, port, metrics
    finally:
        for proc in (service, gateway):
            proc.kill()
            proc.wait()


def decide(port, unit):
    return post(port, "/v1/decide", {"experiment": "shop", "unit": unit, "timeout": 20})


def test_pause_serves_the_control_arm_and_archive_refuses_with_a_history(stack):
    common, port, metrics = stack
    status, decision = decide(port, "u0")
    assert status == 200 and decision["why"] == "bandit", decision

    status, paused = post(port, "/v1/experiments/shop/pause", {})
    assert status == 200 and paused["experiment"]["version"] == 2, paused
    assert paused["diff"] == {"status": ["active", "paused"], "arm": [None, "control"]}
    forced = []

    def serves_control():
        status, answer = decide(port, f"u{len(forced)}")
        forced.append(answer)
        return status == 200 and answer["why"] == "forced" and answer["arm_name"] == "control"

    wait_for(serves_control, None, 60, "the pause")

    producer = Producer({"bootstrap.servers": common[1]})
    producer.produce(f"{common[3]}.experiments", b"{not json", b"shop")
    assert producer.flush(30) == 0
    refused_records = "tsi_experiment_records_refused_total"
    wait_for(lambda: metric(scrape(metrics)[1], refused_records) == 1, None, 60, "a bad record")

    status, out, err = tsi("experiments", "archive", "shop", *common, "--who", "bob")
    assert status == 0 and "shop: archive, version 3" in out, err

    def refused():
        status, answer = decide(port, f"r{len(forced)}")
        forced.append(answer)
        return status == 422

    wait_for(refused, None, 60, "the archive")
    status, out, err = tsi("experiments", "history", "shop", *common)
    assert status == 0, err
    history = [orjson.loads(line) for line in out.splitlines()]
    assert [(h["version"], h["who"], h["action"]) for h in history] == [
        (1, "alice", "create"),
        (2, "anonymous", "pause"),
        (3, "bob", "archive"),
    ]
    assert history[2]["diff"] == {"status": ["paused", "archived"], "arm": ["control", None]}
    assert get(port, "/v1/experiments/shop/history")[1]["history"] == history
    status, resumed = post(port, "/v1/experiments/shop/resume", {})
    assert status == 422 and "archived" in resumed["detail"]
    assert tsi("experiments", "pause", "shop", *common)[0] == 2


HOSTILE = [
    ("/v1/experiments/bad%20name", {"spec": {"arms": ["a"]}}, 422, "bad experiment name"),
    ("/v1/experiments/shop", {"spec": {"arms": ["a"], "gama": 2}}, 422, "gama"),
    ("/v1/experiments/shop", {"spec": {"arms": "a"}}, 422, "arms must be"),
    ("/v1/experiments/shop", {"spec": [1]}, 422, "JSON object"),
    ("/v1/experiments/shop", {"spec": {"arms": ["a"]}, "who": "x"}, 400, "'who'"),
    ("/v1/experiments/shop", {"spec": {"arms": ["a"]}, "expected_version": 9}, 409, "9"),
    ("/v1/experiments/shop", {"spec": {"arms": ["a"]}, "expected_version": "1"}, 400, "'1'"),
    ("/v1/experiments/shop", b"{not json", 400, "not JSON"),
    ("/v1/experiments/shop", {"spec": {"arms": ["x" * 80] * 2000}}, 413, "bytes"),
]


def test_hostile_changes_are_refused_naming_the_problem_and_change_nothing(stack):
    _, port, _ = stack
    for path, body, expected, named in HOSTILE:
        status, answer = put(port, path, body)
        assert status == expected and named in answer["detail"], (path, body, answer)
    status, shop = get(port, "/v1/experiments/shop")
    assert (status, shop["version"], shop["spec"]["arms"][0]) == (200, 1, "control")
    assert post(port, "/v1/experiments/shop/stop", {"arm": "purple"})[0] == 422
    assert post(port, "/v1/experiments/nope/pause", {})[0] == 404
    assert get(port, "/v1/experiments")[1]["experiments"] == [shop]
    status, changed = put(port, "/v1/experiments/shop", {"spec": {"arms": ["control", "blue"]}})
    assert status == 200 and changed["diff"]["spec.arms"][1] == ["control", "blue"], changed
