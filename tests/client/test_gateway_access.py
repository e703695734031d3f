"""``tsi serve --keys --tls-cert --tls-key`` as an application meets it: HTTPS in front of
a running service on the real broker, API keys made and revoked with ``tsi keys``."""

import http.client
import signal
import ssl
import subprocess

import orjson
import pytest

from flows.testing.kafka_broker import free_port
from tests.service.test_operating import TSI
from tests.waiting import wait_for


def tsi_keys(*args) -> str:
    """``tsi keys ARGS``'s output (a new key's token), checked."""
    done = subprocess.run([TSI, "keys", *map(str, args)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


class Https:
    """``tsi serve`` over TLS with a keys file, and calls to it trusting its certificate."""

    def __init__(self, tmp_path, options) -> None:
        self.keys = tmp_path / "keys.toml"
        self.tokens = {
            scope: tsi_keys("create", f"{scope}-key", "--scope", scope, "--file", self.keys)
            for scope in ("decide", "read")
        }
        cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
             "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key, "-out", cert,
             "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
            check=True, capture_output=True,
        )  # fmt: skip
        self.context = ssl.create_default_context(cafile=cert)
        self.port = free_port()
        self.log = tmp_path / "serve.log"
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                [TSI, "serve", *map(str, options), "--port", str(self.port),
                 "--connect-timeout", "5", "--decide-timeout", "20", "--keys", self.keys,
                 "--tls-cert", cert, "--tls-key", key],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.wait(self.up, "tsi serve over TLS")

    def wait(self, condition, what: str) -> None:
        """Until ``condition()``, while the gateway runs (60 s at most)."""

        def running() -> bool:
            assert self.proc.poll() is None, f"{what}: it stopped: {self.log.read_text()}"
            return condition()

        wait_for(running, None, 60, what)

    def up(self) -> bool:
        try:
            return self.call("GET", "/healthz")[0] == 200
        except OSError:
            return False

    def call(self, method, path, body=None, headers=()) -> tuple[int, dict, dict]:
        """(status, headers, JSON body) of one call over HTTPS; ``headers`` raw pairs."""
        connection = http.client.HTTPSConnection(
            "127.0.0.1", self.port, timeout=30, context=self.context
        )
        try:
            data = orjson.dumps(body) if body is not None else b""
            connection.putrequest(method, path)
            for name, value in [("content-type", "application/json"), *headers]:
                connection.putheader(name, value)
            connection.putheader("content-length", str(len(data)))
            connection.endheaders(data)
            response = connection.getresponse()
            return response.status, dict(response.getheaders()), orjson.loads(response.read())
        finally:
            connection.close()

    def decide(self, token: str | bytes, request_id: str) -> tuple[int, dict, dict]:
        auth = b"Bearer " + (token if isinstance(token, bytes) else token.encode())
        body = {"experiment": "shop", "request_id": request_id}
        return self.call("POST", "/v1/decide", body, [("authorization", auth)])

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="module")
def https(service, tmp_path_factory):
    gateway = Https(tmp_path_factory.mktemp("https"), service.options)
    yield gateway
    gateway.stop()


def test_over_https_a_decide_key_decides_a_read_key_is_403_and_no_key_401(https):
    status, _, decision = https.decide(https.tokens["decide"], "tls-1")
    assert status == 200 and decision["request_id"] == "tls-1", decision
    status, _, answer = https.decide(https.tokens["read"], "tls-2")
    assert (status, answer["error"]) == (403, "insufficient_scope")
    assert "key 'read-key' lacks scope 'decide'" in answer["detail"]
    status, headers, answer = https.call("POST", "/v1/decide", {"experiment": "shop"})
    assert (status, answer["error"], headers["www-authenticate"]) == (401, "missing_key", "Bearer")
    by_header = [("x-api-key", https.tokens["decide"])]
    assert https.call("POST", "/v1/decide", {"experiment": "shop"}, by_header)[0] == 200
    assert https.call("GET", "/healthz")[0] == 200  # open


def test_plain_http_is_not_answered_on_the_tls_port(https):
    plain = http.client.HTTPConnection("127.0.0.1", https.port, timeout=10)
    with pytest.raises((http.client.HTTPException, OSError)):
        plain.request("GET", "/healthz")
        plain.getresponse().read()


@pytest.mark.parametrize(
    "token",
    [b"", b" ", b"x" * 16_000, "tsi_\u00e9t\u00e9".encode(), b"tsi_\xff\xfe", b"Bearer x"],
)
def test_hostile_tokens_are_a_401_never_a_500(https, token):
    status, headers, answer = https.decide(token, "hostile")
    assert (status, headers["www-authenticate"]) == (401, "Bearer"), answer
    assert answer["error"] in ("missing_key", "unknown_key")


def test_a_revoked_key_is_refused_once_the_file_is_read_and_a_bad_file_keeps_the_keys(
    service, tmp_path
):
    """Revoked with ``tsi keys revoke`` and SIGHUP: its token is a 401; then a damaged
    file on SIGHUP: logged, the last good keys go on answering."""
    gateway = Https(tmp_path, service.options)
    try:
        assert gateway.decide(gateway.tokens["decide"], "rv-1")[0] == 200
        tsi_keys("revoke", "decide-key", "--file", gateway.keys)
        gateway.proc.send_signal(signal.SIGHUP)
        gateway.wait(
            lambda: gateway.decide(gateway.tokens["decide"], "rv-2")[0] == 401, "the revocation"
        )
        gateway.keys.write_text("[keys.broken\n")
        gateway.proc.send_signal(signal.SIGHUP)
        gateway.wait(lambda: "the last good keys (1) stay" in gateway.log.read_text(), "a log")
        read_key = [("authorization", f"Bearer {gateway.tokens['read']}")]
        assert gateway.call("GET", "/experiments.json", headers=read_key)[0] == 200
        assert gateway.decide(gateway.tokens["decide"], "rv-3")[0] == 401
    finally:
        gateway.stop()
    log = gateway.log.read_text()
    assert f"tsi serve: https://127.0.0.1:{gateway.port} " in log
    assert f"API keys from {gateway.keys} (2 now)" in log
    assert f"keys file {gateway.keys}:" in log
