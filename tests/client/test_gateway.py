"""``tsi serve`` as an application meets it: HTTP in front of a running service on the
real broker."""

import http.client
import subprocess
from concurrent.futures import ThreadPoolExecutor

import orjson
import psutil
import pytest

from flows.testing.kafka_broker import free_port
from tests.client.service import get, post
from tests.service.test_operating import TSI
from tests.waiting import wait_for


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
        ({"experiment": "shop", "timeout": 1e9}, "at most 60 s, got 1000000000.0"),
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
    assert set(decide["responses"]) == {"200", "400", "401", "403", "413", "422", "503", "504"}
    assert decide["security"] == [{"bearer": ["decide"]}, {"apiKey": ["decide"]}]
    refused = spec["paths"]["/v1/feedback"]["post"]["responses"]
    assert set(refused) == {"202", "400", "401", "403", "413", "422", "503"}
    feedback = spec["paths"]["/v1/feedback"]["post"]["requestBody"]["content"]
    schema = feedback["application/json"]["schema"]
    assert schema["required"] == ["experiment", "request_id"]
    assert {"loss", "reward", "arm"} <= set(schema["properties"])


def _answer(connection: http.client.HTTPConnection) -> tuple[int, dict]:
    response = connection.getresponse()
    return response.status, orjson.loads(response.read())


def test_a_body_over_the_limit_is_a_413_refused_as_it_is_read(gateways):
    """Declared too long: refused from its headers, before a byte of it; streamed (chunked,
    no length): refused once past the limit; the gateway never holds it (its memory stays
    flat while 200 MiB are offered)."""
    port = gateways[0]
    gateway = next(
        p for p in psutil.process_iter(["cmdline"]) if str(port) in (p.info["cmdline"] or [])
    )
    before = gateway.memory_info().rss
    declared = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    declared.putrequest("POST", "/v1/decide")
    declared.putheader("content-type", "application/json")
    declared.putheader("content-length", str(200 * 2**20))
    declared.endheaders()
    status, answer = _answer(declared)
    assert (status, answer["error"]) == (413, "body_too_large")
    assert str(200 * 2**20) in answer["detail"]
    streamed = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    streamed.putrequest("POST", "/v1/feedback")
    streamed.putheader("transfer-encoding", "chunked")
    streamed.endheaders()
    piece = b"x" * 2**16
    try:
        for _ in range(32):  # 2 MiB, unless the gateway has answered and closed before
            streamed.send(b"%x\r\n%s\r\n" % (len(piece), piece))
    except (BrokenPipeError, ConnectionResetError):
        pass
    status, answer = _answer(streamed)
    assert (status, answer["error"]) == (413, "body_too_large")
    assert gateway.memory_info().rss - before < 16 * 2**20
    assert post(port, "/v1/decide", {"experiment": "shop"})[0] == 200  # and it serves on


def test_tsi_serve_says_where_it_listens_and_what_it_reads(service):
    proc, port = serve(*service.options)
    try:
        line = proc.stderr.readline()
        assert line.startswith(f"tsi serve: http://127.0.0.1:{port} "), line
        assert service.options[service.options.index("--brokers") + 1] in line
        assert service.options[service.options.index("--events-topic") + 1] in line
    finally:
        proc.kill()
        proc.wait()


def test_idle_and_slow_connections_are_closed_at_the_read_deadline():
    """A connection that sends nothing, and one that sends its request a byte at a time,
    are closed once the read time-out passes; the gateway answers others meanwhile."""
    import socket
    import time

    proc, port = serve("--brokers", f"127.0.0.1:{free_port()}", "--read-timeout", "1")
    try:
        idle = socket.create_connection(("127.0.0.1", port), timeout=10)
        slow = socket.create_connection(("127.0.0.1", port), timeout=10)
        started = time.monotonic()
        request = b"POST /v1/decide HTTP/1.1\r\nhost: x\r\ncontent-length: 20\r\n\r\n{}"
        closed_after = None
        for byte in request:
            try:
                slow.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed_after = time.monotonic() - started
                break
            time.sleep(0.1)
        assert _closed(idle)  # by the gateway, nothing answered
        assert time.monotonic() - started < 5
        assert closed_after is not None or _closed(slow)
        assert get(port, "/healthz")[0] == 200
    finally:
        proc.kill()
        proc.wait()


def _closed(sock) -> bool:
    """Whether the other end closed ``sock`` (it reads the end, or a reset)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_ready_says_whether_the_brokers_and_the_service_answer(service):
    """/healthz only says the gateway is up; /ready is 200 when it is connected and the
    service's own /ready answers, else 503 naming what is not."""
    metrics = f"http://127.0.0.1:{service.metrics_port}/metrics"
    dead = f"http://127.0.0.1:{free_port()}/metrics"
    up, up_port = serve(*service.options, "--metrics-url", metrics)
    down, down_port = serve(*service.options, "--metrics-url", dead)
    away, away_port = serve("--brokers", f"127.0.0.1:{free_port()}", "--metrics-url", metrics)
    try:
        wait_for(lambda: get(up_port, "/ready")[0] == 200, up, 30, "the gateway's /ready")
        status, answer = _status(down_port, "/ready")
        assert status == 503 and dead.replace("/metrics", "/ready") in answer["detail"]
        assert get(down_port, "/healthz")[0] == 200  # up, but not ready
        status, answer = _status(away_port, "/ready")
        assert status == 503 and "not connected to the brokers" in answer["detail"]
    finally:
        for proc in (up, down, away):
            proc.kill()
            proc.wait()


def _status(port: int, path: str) -> tuple[int, dict]:
    """(status, JSON body) of a GET, error statuses included."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("GET", path)
    return _answer(connection)


def test_with_the_registry_what_it_lacks_is_refused_at_once(service, tmp_path):
    """Given the service's registry, a call naming an experiment or an arm it lacks is a
    422 at once (feedback no longer 202 then a dead letter); the file read again when it
    changes; a request id the service has not answered stays asynchronous (202)."""
    from tests.client.service import REGISTRY

    registry = tmp_path / "registry.toml"
    registry.write_text(REGISTRY)
    proc, port = serve(*service.options, "--registry", registry)
    try:
        for body, reason in [
            ({"experiment": "blog", "request_id": "k1", "loss": 1}, "unknown_experiment"),
            ({"experiment": "shop", "request_id": "k2", "loss": 1, "arm": "z"}, "unknown_arm"),
            ({"experiment": "shop", "request_id": "k3", "loss": 1, "arm": 9}, "unknown_arm"),
        ]:
            status, answer = post(port, "/v1/feedback", body)
            assert (status, answer["error"], answer["request_id"]) == (
                422,
                reason,
                body["request_id"],
            )
        status, answer = post(port, "/v1/decide", {"experiment": "blog", "request_id": "k4"})
        assert (status, answer["error"]) == (422, "unknown_experiment")
        unanswered = {"experiment": "shop", "request_id": "never-asked", "loss": 1, "arm": "a"}
        assert post(port, "/v1/feedback", unanswered)[0] == 202
        registry.write_text(REGISTRY + '\n[experiments.blog]\narms = ["p", "q"]\n')
        blog = {"experiment": "blog", "request_id": "k5", "loss": 1}
        # the file is looked at once a second: the gateway knows it then (the service not)
        wait_for(lambda: post(port, "/v1/feedback", blog)[0] == 202, proc, 10, "a reread")
    finally:
        proc.kill()
        proc.wait()
