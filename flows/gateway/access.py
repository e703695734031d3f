"""Who may call the gateway: one ASGI middleware over every route, by rules of the path and
the method alone (``needed``), so a route added later is covered without a word here.

- ``/healthz``, ``/ready``, ``/openapi.json``: open.
- ``/v1/decide``, ``/v1/feedback``, anything under ``/ofrep/``: scope ``decide``.
- ``GET`` (or ``HEAD``) of ``/experiments*`` (the live page) or ``/v1/experiments*``: ``read``.
- any other method under ``/v1/experiments``, and every path not named above: ``admin``.

``admin`` implies ``read`` (whoever changes the experiments may see them), not ``decide``:
an operator's key is not an application's (``keys.Key.allows``).

The token comes in ``Authorization: Bearer <token>`` or ``X-API-Key: <token>``. None, or one
no key has, is a 401 with ``WWW-Authenticate: Bearer``; a key without the scope a 403 naming
it. A key let through is ``request.state.principal`` (its name; None where the gateway is
open or the path is). Without keys (``tsi serve`` without ``--keys``) all is open.

>>> needed("POST", "/v1/decide"), needed("GET", "/v1/experiments/shop")
('decide', 'read')
>>> needed("DELETE", "/v1/experiments/shop"), needed("GET", "/healthz")
('admin', None)
"""

from __future__ import annotations

from collections.abc import Iterable

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from flows.gateway.keys import Keys

__all__ = ["Access", "needed", "presented"]

OPEN = frozenset({"/healthz", "/ready", "/openapi.json"})
DECIDE = frozenset({"/v1/decide", "/v1/feedback"})
READING = frozenset({"GET", "HEAD"})


def needed(method: str, path: str) -> str | None:
    """The scope a call of ``method`` on ``path`` needs (None: open).

    >>> needed("GET", "/experiments.json"), needed("POST", "/ofrep/v1/evaluate/flags/x")
    ('read', 'decide')
    >>> needed("GET", "/metrics")
    'admin'
    """
    if path in OPEN:
        return None
    if path in DECIDE or path == "/ofrep" or path.startswith("/ofrep/"):
        return "decide"
    reading = method in READING
    if path.startswith("/experiments") and reading:
        return "read"
    if path.startswith("/v1/experiments"):
        return "read" if reading else "admin"
    return "admin"


def presented(headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """The token of a request's raw ``headers`` (``Authorization: Bearer``, else
    ``X-API-Key``); empty when there is none.

    >>> presented([(b"authorization", b"Bearer tsi_abc")])
    b'tsi_abc'
    >>> presented([(b"authorization", b"Basic dTpw"), (b"x-api-key", b"tsi_x")])
    b''
    """
    by_name: dict[bytes, bytes] = {}
    for name, value in headers:
        by_name.setdefault(name.lower(), value)
    if b"authorization" in by_name:
        scheme, _, token = by_name[b"authorization"].strip().partition(b" ")
        return token.strip() if scheme.lower() == b"bearer" else b""
    return by_name.get(b"x-api-key", b"").strip()


class Access:
    """The middleware: ``app`` behind the rules, with ``keys`` (None: open to all)."""

    def __init__(self, app: ASGIApp, keys: Keys | None) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        state["principal"] = None
        scope_needed = needed(scope["method"], scope["path"])
        if self.keys is None or scope_needed is None:
            await self.app(scope, receive, send)
            return
        token = presented(scope["headers"])
        key = self.keys.principal(token) if token else None
        if key is None:
            why = "unknown or revoked API key" if token else "no API key"
            detail = f"{why}: send 'Authorization: Bearer <token>' (or 'X-API-Key: <token>')"
            error = "unknown_key" if token else "missing_key"
            await _refuse(send, 401, error, detail, b"Bearer")
        elif not key.allows(scope_needed):
            detail = (
                f"key {key.name!r} lacks scope {scope_needed!r}, needed for "
                f"{scope['method']} {scope['path']}"
            )
            challenge = f'Bearer error="insufficient_scope", scope="{scope_needed}"'
            await _refuse(send, 403, "insufficient_scope", detail, challenge.encode())
        else:
            state["principal"] = key.name
            await self.app(scope, receive, send)


async def _refuse(send: Send, status: int, error: str, detail: str, challenge: bytes) -> None:
    """Answer ``status`` in the gateway's error shape, with ``WWW-Authenticate``."""
    body = orjson.dumps({"error": error, "detail": detail})
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"www-authenticate", challenge),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
