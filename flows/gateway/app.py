"""The HTTP gateway: ``POST /v1/decide`` and ``POST /v1/feedback`` over an
``AsyncDecider``, OpenFeature's remote evaluation (``/ofrep/v1/...``, ``flows.gateway.ofrep``),
``GET /openapi.json``, ``GET /healthz`` (the gateway is up), ``GET /ready`` (it is
connected and, with a ``Live``, the service's own ``/ready`` at each metrics address answers
200); with a ``Live``, the live page ``GET /experiments`` (and ``/experiments.json``,
``flows.gateway.live``).

Starlette on uvicorn: an ASGI stack (uvicorn's event loop and HTTP parser are the fast ones
of Python's servers, Starlette a thin router), both well kept. A bad body is a 400 naming
the field, a body over ``MAX_BODY`` bytes a 413 (refused as it is read: never held whole),
no answer in time a 504, Kafka away a 503, no API key a 401 and one without the scope a
403 (with ``--keys``: ``flows.gateway.access``); each error body is
``{"error": ..., "detail": ...}`` (and ``request_id`` when there is one). The client
connects at start; while it is not connected (the brokers were away) every call is a 503
at once and an attempt to connect runs in the background, one at a time, at most one each
``RECONNECT_COOLDOWN``: no call waits for an attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from flows.client import (
    AsyncDecider,
    BadRequestError,
    ClientSettings,
    DeadLetterError,
    DecisionTimeoutError,
    KafkaUnavailableError,
)
from flows.experiments.store import ExperimentStore
from flows.gateway.access import Access
from flows.gateway.body import BodyTooLargeError, read_body
from flows.gateway.experiments import routes as experiment_routes
from flows.gateway.keys import Keys
from flows.gateway.known import Known
from flows.gateway.live import Live, fetch
from flows.gateway.ofrep import Ofrep
from flows.gateway.openapi import (
    DECIDE_FIELDS,
    DECIDE_REQUIRED,
    FEEDBACK_FIELDS,
    FEEDBACK_REQUIRED,
    openapi,
)

Handler = Callable[[Request], Awaitable[Response]]

#: Seconds after a failed connection attempt during which calls are answered 503 at once.
RECONNECT_COOLDOWN = 2.0
#: The longest ``timeout`` a call may ask for, in seconds: a caller waits no longer.
MAX_TIMEOUT = 60.0
#: Seconds ``/ready`` waits for the service's own ``/ready``.
READY_TIMEOUT = 2.0


def reply(status: int, body: dict[str, Any]) -> Response:
    return Response(orjson.dumps(body), status, media_type="application/json")


class Gateway:
    """The routes over one ``AsyncDecider``, built when the brokers answer."""

    def __init__(
        self, settings: ClientSettings, known: Known | None = None, experiments: bool = False
    ) -> None:
        self.settings = settings
        self.experiments = experiments  # the experiments API is served (its OpenAPI paths)
        self.known = known  # the registry: calls naming what it lacks refused at once
        self._decider: AsyncDecider | None = None
        self._attempt: asyncio.Task | None = None
        self._failed: tuple[float, KafkaUnavailableError] | None = None  # (when, why)

    async def connect(self) -> None:
        """Try to connect now, and wait for that attempt (the gateway's start)."""
        self._begin()
        if self._attempt is not None:
            await self._attempt

    async def decider(self) -> AsyncDecider:
        """The connected client; while there is none, ``KafkaUnavailableError`` at once,
        and an attempt to connect begun in the background (``_begin``)."""
        if self._decider is not None:
            return self._decider
        self._begin()
        raise self._not_connected()

    def _begin(self) -> None:
        """An attempt in the background, unless one runs or the last failed under
        ``RECONNECT_COOLDOWN`` seconds ago."""
        if self._attempt is not None and not self._attempt.done():
            return
        if self._failed is not None and time.monotonic() - self._failed[0] < RECONNECT_COOLDOWN:
            return
        self._attempt = asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            self._decider = await loop.run_in_executor(None, AsyncDecider, self.settings)
            self._failed = None
        except KafkaUnavailableError as exc:
            self._failed = (time.monotonic(), exc)

    def _not_connected(self) -> KafkaUnavailableError:
        """Why a call finds no client: the last attempt's error, or one under way."""
        if self._failed is None:
            return KafkaUnavailableError(f"connecting to Kafka at {self.settings.brokers}")
        when, why = self._failed
        ago = time.monotonic() - when
        return KafkaUnavailableError(
            f"{why} (the last attempt, {ago:.1f} s ago; the next one after "
            f"{RECONNECT_COOLDOWN:g} s)"
        )

    async def close(self) -> None:
        if self._decider is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._decider.close)

    async def decide(self, request: Request) -> Response:
        body = self._checked(await _body(request, DECIDE_FIELDS, DECIDE_REQUIRED))
        decider = await self.decider()
        decision = await decider.decide(**body)
        return reply(200, decision.__dict__)

    async def feedback(self, request: Request) -> Response:
        body = self._checked(await _body(request, FEEDBACK_FIELDS, FEEDBACK_REQUIRED))
        decider = await self.decider()
        await decider.feedback(**body)
        return reply(202, {"accepted": True, "request_id": body["request_id"]})

    def _checked(self, body: dict[str, Any]) -> dict[str, Any]:
        """``body``, or ``DeadLetterError`` (a 422) when it names an experiment or an arm
        the registry lacks (``known``)."""
        refusal = None if self.known is None else self.known.refusal(body)
        if refusal is not None:
            raise DeadLetterError(str(body.get("request_id", "")), *refusal)
        return body

    async def healthz(self, _request: Request) -> Response:
        return reply(200, {"status": "ok", "connected": self._decider is not None})

    async def ready(self, service: list[str], _request: Request) -> Response:
        """200 when the brokers answered and every address of ``service`` (the service's
        ``/ready`` URLs) answers 200; else 503 naming each problem."""
        problems = [] if self._decider is not None else ["not connected to the brokers"]
        loop = asyncio.get_running_loop()
        answers = await asyncio.gather(
            *(loop.run_in_executor(None, fetch, url, READY_TIMEOUT) for url in service)
        )
        problems += [
            f"the service at {url} is not ready: {answer}"
            for url, answer in zip(service, answers, strict=True)
            if isinstance(answer, Exception)
        ]
        if problems:
            return reply(503, {"status": "not ready", "detail": "; ".join(problems)})
        return reply(200, {"status": "ready"})

    async def spec(self, _request: Request) -> Response:
        return reply(200, openapi(self.experiments))


async def _body(
    request: Request, known: dict[str, Any], required: tuple[str, ...]
) -> dict[str, Any]:
    """The JSON object of a request, its fields among ``known``, the ``required`` ones
    there (else ``BadRequestError`` naming one: a 400)."""
    try:
        body = orjson.loads(await read_body(request))
    except orjson.JSONDecodeError as exc:
        raise BadRequestError("malformed_json", f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequestError("wrong_type", f"the body must be a JSON object, got {body!r}")
    unknown = sorted(set(body) - set(known))
    if unknown:
        raise BadRequestError(
            "unknown_field", f"field {unknown[0]!r} is unknown (known: {', '.join(known)})"
        )
    missing = [field for field in required if field not in body]
    if missing:
        raise BadRequestError("missing_field", f"field {missing[0]!r} is required")
    timeout = body.get("timeout")
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not 0 < timeout <= MAX_TIMEOUT
    ):
        raise BadRequestError(
            "bad_value",
            f"timeout must be a number above 0 and at most {MAX_TIMEOUT:g} s, got {timeout!r}",
        )
    return body


def _answering(handler: Handler) -> Handler:
    """``handler`` with the client's errors as HTTP answers."""

    async def answer(request: Request) -> Response:
        try:
            return await handler(request)
        except BadRequestError as exc:
            return reply(400, {"error": exc.reason, "detail": exc.detail})
        except BodyTooLargeError as exc:
            return reply(413, {"error": "body_too_large", "detail": str(exc)})
        except DeadLetterError as exc:
            body = {"error": exc.reason, "detail": exc.detail, "request_id": exc.request_id}
            return reply(422, body)
        except DecisionTimeoutError as exc:
            detail = f"no answer within {exc.seconds:g} s: serve a fallback, send no feedback"
            return reply(504, {"error": "timeout", "detail": detail, "request_id": exc.request_id})
        except KafkaUnavailableError as exc:
            return reply(503, {"error": "kafka_unavailable", "detail": str(exc)})

    return answer


def gateway(
    settings: ClientSettings,
    live: Live | None = None,
    known: Known | None = None,
    keys: Keys | None = None,
    store: ExperimentStore | None = None,
) -> Starlette:
    """The ASGI application of ``tsi serve`` (with ``live``: its live page too; with
    ``known``: calls naming what the registry lacks refused at once; with ``keys``: every
    route but the open ones behind its API keys, ``flows.gateway.access``; with ``store``:
    the experiments API, ``flows.gateway.experiments``)."""
    routes = Gateway(settings, known, store is not None)
    service = [] if live is None else [ready_url(url) for url in live.urls]

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        sampling = None if live is None else asyncio.create_task(live.run())
        await routes.connect()  # 503s until the brokers answer
        yield
        if sampling is not None:
            sampling.cancel()
        await routes.close()

    return Starlette(
        routes=[
            Route("/v1/decide", _answering(routes.decide), methods=["POST"]),
            Route("/v1/feedback", _answering(routes.feedback), methods=["POST"]),
            Route("/healthz", routes.healthz, methods=["GET"]),
            Route("/ready", functools.partial(routes.ready, service), methods=["GET"]),
            Route("/openapi.json", routes.spec, methods=["GET"]),
            *Ofrep(routes.decider, known).routes(),
            *([] if live is None else live.routes()),
            *([] if store is None else experiment_routes(store)),
        ],
        middleware=[Middleware(Access, keys=keys)],
        lifespan=lifespan,
    )


def ready_url(metrics: str) -> str:
    """The service's ``/ready`` beside its metrics address.

    >>> ready_url("http://10.0.0.7:9108/metrics")
    'http://10.0.0.7:9108/ready'
    """
    parts = urllib.parse.urlsplit(metrics)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, "/ready", "", ""))
