"""The gateway's access rules and keys, on the application itself (no broker: the routes
answer, or are refused, before a call reaches Kafka)."""

import asyncio
import hashlib
import logging
import os
import re

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from flows.client import ClientSettings
from flows.gateway import access, app
from flows.gateway.keys import SCOPES, Keys, KeysError, create, load, revoke, token_hash
from flows.gateway.live import Live
from flows.testing.kafka_broker import free_port

HOSTILE = [
    (b"authorization", b"Bearer "),
    (b"authorization", b"Bearer"),
    (b"authorization", b"Bearer " + b"x" * 60_000),
    (b"authorization", "Bearer tsi_\u00e9t\u00e9".encode()),
    (b"authorization", b"Bearer \xff\xfe\x00"),
    (b"authorization", b"Basic dXNlcjpwYXNz"),
    (b"x-api-key", b""),
    (b"x-api-key", "\u00ff".encode() * 300),
]


@pytest.fixture()
def keyring(tmp_path):
    """(the keys file, {scope set: token}) with one key per useful set of scopes."""
    path = tmp_path / "keys.toml"
    tokens = {
        scopes: create(path, name, scopes.split("+"))
        for name, scopes in [("app", "decide"), ("viewer", "read"), ("ops", "admin")]
    }
    return path, tokens


@pytest.fixture(autouse=True)
def unconnected(monkeypatch):
    """The gateway never tries the brokers here: a call let through is a 503 at once."""
    monkeypatch.setattr(app.Gateway, "_begin", lambda _self: None)


def _gateway(keys: Keys | None) -> Starlette:
    """The gateway (its live page too) with ``keys``, no broker behind it."""
    live = Live(["http://127.0.0.1:1/metrics"], 60)
    return app.gateway(ClientSettings(brokers=f"127.0.0.1:{free_port()}"), live, keys=keys)


def call(asgi, method: str, path: str, *headers: tuple[bytes, bytes]) -> tuple[int, dict, dict]:
    """(status, headers, JSON body or {}) of one call of the ASGI application ``asgi``."""
    sent = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b'{"experiment": "shop"}', "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "scheme": "http",
        "method": method, "path": path, "raw_path": path.encode(), "root_path": "",
        "query_string": b"", "headers": list(headers), "client": ("127.0.0.1", 9),
        "server": ("127.0.0.1", 80),
    }  # fmt: skip
    asyncio.run(asgi(scope, receive, send))
    body = b"".join(m.get("body", b"") for m in sent[1:])
    start = sent[0]
    is_json = (b"content-type", b"application/json") in start["headers"]
    return start["status"], dict(start["headers"]), orjson.loads(body) if is_json else {}


def bearer(token: str) -> tuple[bytes, bytes]:
    return b"authorization", f"Bearer {token}".encode()


def _served(routes) -> list[tuple[str, str]]:
    return [
        (method, route.path)
        for route in routes
        if isinstance(route, Route)
        for method in sorted(route.methods - {"HEAD"})
    ]


def test_the_scope_matrix_over_every_route_of_the_gateway(keyring):
    """Each route the gateway serves, each key: open routes answer all; the others are a
    401 with no key, a 403 naming the scope with a key lacking it, and let through (not
    401/403) with one having it; admin reads, but does not decide."""
    path, tokens = keyring
    gateway = _gateway(Keys(path))
    routes = _served(gateway.routes)
    assert {p for _, p in routes} >= {"/v1/decide", "/experiments", "/healthz", "/ready"}
    for method, route in routes:
        scope = access.needed(method, route)
        status, headers, _ = call(gateway, method, route)
        if scope is None:
            assert status not in (401, 403), (method, route)
            continue
        assert (status, headers[b"www-authenticate"]) == (401, b"Bearer"), (method, route)
        for scopes, token in tokens.items():
            status, _, answer = call(gateway, method, route, bearer(token))
            if scope == scopes or (scope == "read" and scopes == "admin"):
                assert status not in (401, 403), (method, route, scopes)
            else:
                assert status == 403, (method, route, scopes)
                assert answer["error"] == "insufficient_scope"
                assert f"scope {scope!r}" in answer["detail"]


@pytest.mark.parametrize(
    ("method", "path", "scope"),
    [
        ("POST", "/v1/decide", "decide"),
        ("POST", "/v1/feedback", "decide"),
        ("POST", "/ofrep/v1/evaluate/flags/f", "decide"),
        ("GET", "/experiments", "read"),
        ("GET", "/experiments.json", "read"),
        ("GET", "/v1/experiments", "read"),
        ("HEAD", "/v1/experiments/shop", "read"),
        ("POST", "/v1/experiments", "admin"),
        ("PUT", "/v1/experiments/shop", "admin"),
        ("DELETE", "/v1/experiments/shop/arms/a", "admin"),
        ("POST", "/experiments", "admin"),
        ("GET", "/anything-else", "admin"),
        ("GET", "/healthz", None),
        ("GET", "/ready", None),
        ("GET", "/openapi.json", None),
    ],
)
def test_the_rules_by_path_and_method(method, path, scope):
    assert access.needed(method, path) == scope


def test_routes_added_later_are_covered_by_their_prefix(keyring):
    """A route the gateway does not have yet (the experiments' admin) is behind the rules:
    a read key may GET it, only an admin key POST to it; the key's name is the principal."""
    path, tokens = keyring

    async def echo(request: Request) -> JSONResponse:
        return JSONResponse({"principal": request.state.principal})

    gateway = _gateway(Keys(path))
    gateway.router.routes.append(Route("/v1/experiments", echo, methods=["GET", "POST"]))
    admin, read, decide = (bearer(tokens[scope]) for scope in ("admin", "read", "decide"))
    assert call(gateway, "GET", "/v1/experiments", read)[2] == {"principal": "viewer"}
    assert call(gateway, "POST", "/v1/experiments", read)[0] == 403
    assert call(gateway, "POST", "/v1/experiments", admin)[2] == {"principal": "ops"}
    assert call(gateway, "POST", "/v1/experiments", decide)[0] == 403
    assert call(gateway, "POST", "/v1/experiments")[0] == 401
    by_header = (b"x-api-key", tokens["admin"].encode())
    assert call(gateway, "POST", "/v1/experiments", by_header)[2] == {"principal": "ops"}


def test_without_keys_all_is_open():
    gateway = _gateway(None)
    assert call(gateway, "GET", "/experiments.json")[0] == 200
    assert call(gateway, "POST", "/v1/decide")[0] == 503  # through, to the absent brokers


@pytest.mark.parametrize("header", HOSTILE)
def test_hostile_tokens_are_a_401_never_a_500(keyring, header):
    status, headers, answer = call(_gateway(Keys(keyring[0])), "POST", "/v1/decide", header)
    assert (status, headers[b"www-authenticate"]) == (401, b"Bearer"), answer
    assert answer["error"] in ("missing_key", "unknown_key")


def test_a_revoked_key_is_refused_and_the_others_stay(keyring):
    path, tokens = keyring
    keys = Keys(path, look_every=0)
    assert keys.principal(tokens["decide"].encode()).name == "app"
    revoke(path, "app")
    assert keys.principal(tokens["decide"].encode()) is None
    assert keys.principal(tokens["read"].encode()).name == "viewer"
    with pytest.raises(KeysError, match=re.escape("no key named 'app' (keys: ops, viewer)")):
        revoke(path, "app")


def test_the_file_holds_only_hashes_and_create_refuses_a_taken_name(keyring):
    path, tokens = keyring
    text = path.read_text()
    for token in tokens.values():
        assert token not in text and token_hash(token.encode()) in text
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    with pytest.raises(KeysError, match="a key named 'app' exists"):
        create(path, "app", ["read"])
    with pytest.raises(KeysError, match="unknown scope 'write'"):
        create(path, "new", ["write"])
    with pytest.raises(KeysError, match="a name is letters"):
        create(path, "bad name", ["read"])
    assert path.read_text() == text  # each refusal changed nothing


@given(st.binary(min_size=1, max_size=64), st.binary(min_size=1, max_size=64))
def test_a_tokens_hash_never_equals_another_keys_stored_text(token, other):
    """The stored text of a key is not a token that opens it (presenting a stolen file's
    hash gets nothing), and two tokens' stored texts differ."""
    stored = token_hash(other)
    assert token_hash(stored.encode()) != stored
    if token != other:
        assert token_hash(token) != stored
    assert token_hash(token) == hashlib.sha256(token).hexdigest()


def test_the_stored_hash_is_not_a_token(keyring):
    path, _ = keyring
    keys = Keys(path)
    for _, stored in load(path).values():
        assert keys.principal(stored.encode()) is None


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[keys.a\n", "keys file"),
        ("[other]\nx = 1\n", "unknown table 'other'"),
        ('[keys.a]\nscopes = []\nsha256 = "' + "0" * 64 + '"\n', "at least one, got []"),
        ('[keys.a]\nscopes = ["root"]\nsha256 = "' + "0" * 64 + '"\n', "unknown scope 'root'"),
        ('[keys.a]\nscopes = ["read"]\nsha256 = "abc"\n', "64 lowercase hex digits, got 'abc'"),
        ('[keys.a]\nscopes = ["read"]\nsha256 = "' + "0" * 64 + '"\ntoken = "t"\n', "'token'"),
        ('[keys."a b"]\nscopes = ["read"]\nsha256 = "' + "0" * 64 + '"\n', "key 'a b'"),
        (
            '[keys.a]\nscopes = ["read"]\nsha256 = "' + "0" * 64 + '"\n'
            '[keys.b]\nscopes = ["read"]\nsha256 = "' + "0" * 64 + '"\n',
            "keys 'a' and 'b' share a hash",
        ),
    ],
)
def test_a_bad_file_is_a_clear_error_and_the_last_good_keys_stay(keyring, caplog, text, named):
    path, tokens = keyring
    keys = Keys(path, look_every=0)
    path.write_text(text)
    with pytest.raises(KeysError, match=re.escape(named)):
        load(path)
    with caplog.at_level(logging.WARNING):
        assert keys.principal(tokens["decide"].encode()).name == "app"
    assert named.split("'")[0] in caplog.text and "the last good keys (3) stay" in caplog.text
    with pytest.raises(KeysError, match=str(path)):
        Keys(path)


def test_a_changed_file_is_read_again_and_a_missing_one_keeps_the_keys(keyring):
    path, _ = keyring
    keys = Keys(path, look_every=0)
    token = create(path, "late", ["decide"])
    assert keys.principal(token.encode()).name == "late"
    os.remove(path)
    assert keys.principal(token.encode()).name == "late"
    assert len(keys) == 4 and set(SCOPES) == {"decide", "read", "admin"}


def test_reload_reads_the_file_at_once_between_looks(keyring):
    """``reload`` (SIGHUP) reads the file even before the next look at its time."""
    path, tokens = keyring
    keys = Keys(path, look_every=3600)
    revoke(path, "viewer")
    assert keys.principal(tokens["read"].encode()).name == "viewer"  # not looked at yet
    keys.reload()
    assert keys.principal(tokens["read"].encode()) is None
