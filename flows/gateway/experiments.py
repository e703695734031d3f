"""The gateway's experiments API over an ``ExperimentStore``: list, read, create or change
(``PUT``, optionally with ``expected_version``), pause, resume, stop, archive and the
history of experiments (``routes``). Who made a change is the request's
``request.state.principal`` when an auth layer set it, else "anonymous".

Errors are ``{"error": ..., "detail": ...}``: 400 a bad body, 404 no such experiment, 409
a version other than the expected one, 413 a body too large, 422 a change the model
refuses (the detail names the bad key or value, or the transition), 503 Kafka away.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from flows.experiments import model
from flows.experiments.model import (
    MAX_SPEC_BYTES,
    ConflictError,
    ExperimentError,
    NotFoundError,
    check_name,
)
from flows.experiments.store import ExperimentStore, StoreError

#: The longest body read: a spec at its largest, and room for the rest.
MAX_BODY = MAX_SPEC_BYTES + 4096
Handler = Callable[[Request], Awaitable[Response]]


class BadBodyError(Exception):
    """A body that is not what the endpoint takes: (status, error, detail)."""


def _reply(status: int, body: dict[str, Any]) -> Response:
    return Response(orjson.dumps(body), status, media_type="application/json")


def who(request: Request) -> str:
    """The identity an auth layer set on ``request.state.principal``, else "anonymous"."""
    principal = getattr(request.state, "principal", None)
    return "anonymous" if principal in (None, "") else str(principal)


async def _json_body(request: Request, fields: frozenset[str]) -> dict[str, Any]:
    """The request's JSON object (empty when there is no body), its fields among
    ``fields`` (``BadBodyError`` naming the problem)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY:
        raise BadBodyError(413, "body_too_large", f"the body is over the {MAX_BODY} bytes allowed")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise BadBodyError(413, "body_too_large", f"the body is over {MAX_BODY} bytes")
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        body = orjson.loads(raw) if raw.strip() else {}
    except orjson.JSONDecodeError as exc:
        raise BadBodyError(400, "malformed_json", f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadBodyError(400, "wrong_type", "the body must be a JSON object")
    unknown = sorted(set(body) - fields)
    if unknown:
        known = ", ".join(sorted(fields)) or "none"
        raise BadBodyError(400, "unknown_field", f"field {unknown[0]!r} is unknown ({known})")
    return body


def _answering(handler: Handler) -> Handler:
    """``handler`` with the model's and the store's errors as HTTP answers."""

    async def answer(request: Request) -> Response:
        try:
            return await handler(request)
        except BadBodyError as exc:
            status, error, detail = exc.args
            return _reply(status, {"error": error, "detail": detail})
        except NotFoundError as exc:
            return _reply(404, {"error": "not_found", "detail": str(exc)})
        except ConflictError as exc:
            return _reply(409, {"error": "version_conflict", "detail": str(exc)})
        except ExperimentError as exc:
            return _reply(422, {"error": "refused", "detail": str(exc)})
        except StoreError as exc:
            return _reply(503, {"error": "kafka_unavailable", "detail": str(exc)})

    return answer


class ExperimentRoutes:
    """The handlers over one store; the store's calls block, so each runs in a thread."""

    def __init__(self, store: ExperimentStore) -> None:
        self.store = store

    async def _call(self, function: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, function, *args)

    async def list(self, _request: Request) -> Response:
        found = await self._call(self.store.current)
        return _reply(200, {"experiments": [r.to_json() for _, r in sorted(found.items())]})

    async def show(self, request: Request) -> Response:
        name = check_name(request.path_params["name"])
        return _reply(200, (await self._call(self.store.get, name)).to_json())

    async def history(self, request: Request) -> Response:
        name = check_name(request.path_params["name"])
        records = await self._call(self.store.history, name)
        if not records:
            raise NotFoundError(f"no experiment {name!r}")
        return _reply(200, {"history": [a.to_json() for a in records]})

    async def put(self, request: Request) -> Response:
        name = check_name(request.path_params["name"])
        body = await _json_body(request, frozenset({"spec", "expected_version"}))
        expected = body.get("expected_version")
        if expected is not None and (isinstance(expected, bool) or not isinstance(expected, int)):
            raise BadBodyError(
                400, "bad_value", f"expected_version must be an integer, got {expected!r}"
            )
        if "spec" not in body:
            raise BadBodyError(400, "missing_field", "field 'spec' is required")
        step = functools.partial(
            model.apply, name=name, spec=body["spec"], who=who(request), expected_version=expected
        )
        return await self._change(name, step, created=True)

    async def act(self, action: str, request: Request) -> Response:
        """pause (optional ``arm``), resume, stop (``arm``), archive."""
        name = check_name(request.path_params["name"])
        arms = {"pause": {"arm"}, "stop": {"arm"}}.get(action, set())
        body = await _json_body(request, frozenset(arms))
        if action == "stop" and not isinstance(body.get("arm"), str):
            raise BadBodyError(400, "missing_field", "field 'arm' (a string) is required")
        extra = {"arm": body["arm"]} if "arm" in body else {}
        step = functools.partial(getattr(model, action), who=who(request), **extra)
        return await self._change(name, step)

    async def _change(self, name: str, step: Callable[..., Any], created: bool = False) -> Response:
        resource, audit = await self._call(self.store.change, name, step)
        status = 201 if created and audit is not None and audit.action == "create" else 200
        return _reply(
            status,
            {
                "experiment": resource.to_json(),
                "changed": audit is not None,
                "diff": {} if audit is None else audit.diff,
            },
        )


def routes(store: ExperimentStore) -> list[Route]:
    """The experiments API's routes over ``store``."""
    handlers = ExperimentRoutes(store)
    base = "/v1/experiments"
    actions = [
        Route(
            f"{base}/{{name}}/{action}",
            _answering(functools.partial(handlers.act, action)),
            methods=["POST"],
        )
        for action in ("pause", "resume", "stop", "archive")
    ]
    return [
        Route(base, _answering(handlers.list), methods=["GET"]),
        Route(f"{base}/{{name}}", _answering(handlers.show), methods=["GET"]),
        Route(f"{base}/{{name}}", _answering(handlers.put), methods=["PUT"]),
        *actions,
        Route(f"{base}/{{name}}/history", _answering(handlers.history), methods=["GET"]),
    ]
