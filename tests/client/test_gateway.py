"""``tsi serve`` as an application meets it: HTTP in front of a running service on the
real broker."""

import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from flows.testing.kafka_broker import free_port
from tests.client.service import get, post
from tests.service.test_operating import TSI, wait_for


def serve(*options):
    """``tsi serve OPTIONS`` on a free port, once it answers /healthz."""
    port = free_port()
    proc = subprocess.Popen(
        [TSI, "serve", *map(str, options), "--port", str(port), "--connect-timeout", "5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: get(port, "/healthz")[0] == 200, proc, 60, "tsi serve")
    return proc, port


@pytest.fixture(scope="module")
def gateways(service):
    """Two replicas of the gateway in front of the service."""
    started = [serve(*service.options, "--decide-timeout", "20") for _ in range(2)]
    yield [port for _, port in started]
    for proc, _ in started:
        proc.kill()
        proc.wait()


def test_a_decision_its_retry_and_its_feedback_over_http(service, gateways):
    port = gateways[0]
    status, decision = post(port, "/v1/decide", {"experiment": "shop", "unit": "web-1"})
    assert status == 200, decision
    assert decision["arm_name"] in ("a", "b", "c") and 0 < decision["prob"] <= 1
    assert decision["why"] == "bandit" and decision["experiment"] == "shop"
    retry = {"experiment": "shop", "unit": "web-1", "request_id": decision["request_id"]}
    assert post(port, "/v1/decide", retry) == (200, decision)
    assert post(gateways[1], "/v1/decide", retry) == (200, decision)  # any replica
    applied = 'tsi_feedback_total{experiment="shop",outcome="applied"}'
    before = service.metric(applied)
    feedback = {**retry, "reward": 1, "arm": decision["arm_name"]}
    status, accepted = post(port, "/v1/feedback", feedback)
    assert (status, accepted) == (202, {"accepted": True, "request_id": retry["request_id"]})
    wait_for(lambda: service.metric(applied) == before + 1, service.proc, 30, "feedback")


def test_two_gateways_at_once_each_get_their_own_answers(gateways):
    asks = [(port, f"g{port}-{i}") for i in range(20) for port in gateways]
    with ThreadPoolExecutor(16) as pool:
        answers = list(
            pool.map(
                lambda ask: post(
                    ask[0], "/v1/decide", {"experiment": "shop", "request_id": ask[1]}
                ),
                asks,
            )
        )
    assert [status for status, _ in answers] == [200] * len(asks)
    assert [body["request_id"] for _, body in answers] == [rid for _, rid in asks]


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (b"{not json", "not JSON"),
        (b"[1]", "must be a JSON object"),
        ({"experimnt": "shop"}, "field 'experimnt' is unknown"),
        ({}, "field 'experiment' is required"),
        ({"experiment": "shop", "context": "x"}, "context"),
        ({"experiment": "shop", "eligible": "a"}, "eligible"),
        ({"experiment": "shop", "timeout": 0}, "timeout must be a number above 0"),
    ],
)
def test_a_bad_body_is_a_400_naming_the_field(gateways, body, named):
    status, answer = post(gateways[0], "/v1/decide", body)
    assert status == 400 and named in answer["detail"], answer


def test_bad_feedback_is_a_400_naming_the_field(gateways):
    status, answer = post(gateways[0], "/v1/feedback", {"experiment": "shop", "request_id": "r"})
    assert status == 400 and "'loss' or 'reward'" in answer["detail"], answer


def test_a_refused_request_is_a_422_with_the_services_reason(gateways):
    status, answer = post(gateways[0], "/v1/decide", {"experiment": "nope", "request_id": "n1"})
    assert (status, answer["error"], answer["request_id"]) == (422, "unknown_experiment", "n1")
    status, answer = post(gateways[0], "/v1/decide", {"experiment": "shop", "eligible": []})
    assert (status, answer["error"]) == (422, "ineligible_arms")
    assert "eligible must name distinct arms" in answer["detail"]


def test_no_answer_in_time_is_a_504_and_kafka_away_a_503(service):
    options = service.options[:]
    options[options.index("--events-topic") + 1] = service.unserved()
    late, late_port = serve(*options, "--decide-timeout", "0.5")
    away, away_port = serve("--brokers", f"127.0.0.1:{free_port()}")
    try:
        status, answer = post(late_port, "/v1/decide", {"experiment": "shop", "request_id": "z"})
        assert (status, answer["error"], answer["request_id"]) == (504, "timeout", "z")
        assert "within 0.5 s" in answer["detail"]
        status, answer = post(away_port, "/v1/decide", {"experiment": "shop"})
        assert (status, answer["error"]) == (503, "kafka_unavailable"), answer
        assert get(away_port, "/healthz") == (200, {"status": "ok", "connected": False})
    finally:
        for proc in (late, away):
            proc.kill()
            proc.wait()


def test_the_openapi_description_names_both_calls(gateways):
    status, spec = get(gateways[0], "/openapi.json")
    assert status == 200 and spec["openapi"].startswith("3.")
    decide = spec["paths"]["/v1/decide"]["post"]
    assert set(decide["responses"]) == {"200", "400", "422", "503", "504"}
    feedback = spec["paths"]["/v1/feedback"]["post"]["requestBody"]["content"]
    schema = feedback["application/json"]["schema"]
    assert schema["required"] == ["experiment", "request_id"]
    assert {"loss", "reward", "arm"} <= set(schema["properties"])
