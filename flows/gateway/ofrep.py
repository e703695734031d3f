"""OpenFeature's remote evaluation protocol (OFREP) on the gateway: any OpenFeature SDK with
an OFREP provider asks ``tsi serve`` for the arm to serve (docs/guides/openfeature.md).

``POST /ofrep/v1/evaluate/flags/{key}``: the flag key is the experiment, the evaluation
context's ``targetingKey`` the unit (required by a per-unit experiment), its attributes
named by the experiment's ``contexts`` its named context (else an integer ``context``, its
index); other attributes are ignored (with ``--registry``; without one, every attribute but
``targetingKey`` and ``context`` is the named context). The answer is the arm's name as
``value`` and ``variant``, the reason (``REASONS``) and ``{prob, why, request_id, round}``
as metadata: feedback goes to ``POST /v1/feedback`` with that ``request_id`` (the protocol
has no tracking call). Every evaluation is a decision, a draw the service records.

``POST /ofrep/v1/evaluate/flags``: every experiment of the registry (``--registry``), each
decided as above, its failures in the list beside the others' answers; no ETag (no two
answers are the same draw).

Errors are the protocol's: ``{key, errorCode, errorDetails}``, a 404 ``FLAG_NOT_FOUND``,
400 ``PARSE_ERROR`` (the body), ``INVALID_CONTEXT``, ``TARGETING_KEY_MISSING``, 500
``GENERAL`` (Kafka away, no answer in time, a refusal that is not the caller's).

>>> reason_of("bandit"), reason_of("holdout"), reason_of("forced")
('SPLIT', 'DEFAULT', 'STATIC')
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from flows.client import (
    AsyncDecider,
    BadRequestError,
    DeadLetterError,
    Decision,
    DecisionTimeoutError,
    KafkaUnavailableError,
)
from flows.gateway.body import BodyTooLargeError, read_body
from flows.gateway.known import Known
from flows.service.instances.registry import Experiment, unit_required
from flows.service.wire.fields import identifier_ok

__all__ = ["REASONS", "FlagError", "Ofrep", "reason_of"]

#: The OpenFeature reason of each ``why`` of a decision: a draw (the bandit's, or burn-in's
#: uniform one) is a split; a holdout serves the experiment's default arm; a forced arm
#: is served to everyone.
REASONS = {"bandit": "SPLIT", "burn_in": "SPLIT", "holdout": "DEFAULT", "forced": "STATIC"}
#: The service's refusals that are about the evaluation context.
CONTEXT_REFUSALS = frozenset(
    {"context_mismatch", "context_out_of_range", "unknown_context_attribute", "missing_field"}
)
NO_REGISTRY = (
    "the gateway knows no experiments: start it with --registry (tsi run's file) "
    "to evaluate them all"
)
TARGETING_KEY = "targetingKey"
INDEX = "context"


def reason_of(why: str) -> str:
    """The OpenFeature reason of a decision's ``why`` (``UNKNOWN`` for one not listed)."""
    return REASONS.get(why, "UNKNOWN")


class FlagError(Exception):
    """An OFREP error: its HTTP status, ``errorCode`` and ``errorDetails``."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.status, self.code, self.detail = status, code, detail

    def body(self, key: str | None) -> dict[str, str]:
        """The error's JSON object (a bulk call's own failure has no ``key``).

        >>> FlagError(404, "FLAG_NOT_FOUND", "no experiment 'x'").body("x")["errorCode"]
        'FLAG_NOT_FOUND'
        """
        head = {} if key is None else {"key": key}
        return {**head, "errorCode": self.code, "errorDetails": self.detail}


def _json(status: int, body: dict[str, Any]) -> Response:
    return Response(orjson.dumps(body), status, media_type="application/json")


class Ofrep:
    """The OFREP routes over the gateway's client (``decider``) and registry (``known``)."""

    def __init__(
        self, decider: Callable[[], Awaitable[AsyncDecider]], known: Known | None = None
    ) -> None:
        self.decider = decider
        self.known = known

    def routes(self) -> list[Route]:
        """The routes the gateway mounts."""
        return [
            Route("/ofrep/v1/evaluate/flags/{key}", self.evaluate, methods=["POST"]),
            Route("/ofrep/v1/evaluate/flags", self.bulk, methods=["POST"]),
        ]

    async def evaluate(self, request: Request) -> Response:
        """``POST /ofrep/v1/evaluate/flags/{key}``: one flag."""
        key = request.path_params["key"]
        try:
            context = await evaluation_context(request)
            experiment = self._experiment(key)  # unknown: a 404 even while Kafka is away
            decider = await self._connected()
            return _json(200, await self._flag(decider, key, experiment, context))
        except FlagError as exc:
            return _json(exc.status, exc.body(key))

    async def bulk(self, request: Request) -> Response:
        """``POST /ofrep/v1/evaluate/flags``: every experiment of the registry."""
        try:
            if self.known is None:
                raise FlagError(500, "GENERAL", NO_REGISTRY)
            context = await evaluation_context(request)
            decider = await self._connected()
        except FlagError as exc:
            return _json(exc.status, exc.body(None))
        names = list(self.known.current().experiments)
        flags = await asyncio.gather(*(self._entry(decider, name, context) for name in names))
        return _json(200, {"flags": flags})

    async def _entry(self, decider: AsyncDecider, key: str, context: dict) -> dict[str, Any]:
        """A bulk call's entry for ``key``: its answer or its failure."""
        try:
            return await self._flag(decider, key, self._experiment(key), context)
        except FlagError as exc:
            return exc.body(key)

    async def _connected(self) -> AsyncDecider:
        try:
            return await self.decider()
        except KafkaUnavailableError as exc:
            raise FlagError(500, "GENERAL", f"Kafka is unavailable: {exc}") from None

    async def _flag(
        self, decider: AsyncDecider, key: str, experiment: Experiment | None, context: dict
    ) -> dict[str, Any]:
        """The evaluation of flag ``key``, of ``experiment`` in the registry (None without
        one): ``FlagError`` when it fails."""
        unit = targeting_key(context)
        if experiment is not None and experiment.per_unit and unit is None:
            raise FlagError(400, "TARGETING_KEY_MISSING", _per_unit(key))
        chosen = decide_context(experiment, context)
        try:
            decision = await decider.decide(key, unit, context=chosen)
        except BadRequestError as exc:
            raise FlagError(400, "INVALID_CONTEXT", exc.detail) from None
        except DeadLetterError as exc:
            raise refusal(key, exc) from None
        except DecisionTimeoutError as exc:
            raise FlagError(500, "GENERAL", f"no answer within {exc.seconds:g} s") from None
        except KafkaUnavailableError as exc:
            raise FlagError(500, "GENERAL", f"Kafka is unavailable: {exc}") from None
        return success(key, decision)

    def _experiment(self, key: str) -> Experiment | None:
        """``key``'s experiment in the registry (None without one); ``FlagError`` 404
        when ``key`` cannot be or is not one of its experiments."""
        if not identifier_ok(key):
            raise FlagError(404, "FLAG_NOT_FOUND", f"flag key {key!r} is no experiment's name")
        if self.known is None:
            return None
        experiment = self.known.current().get(key)
        if experiment is None:
            raise FlagError(404, "FLAG_NOT_FOUND", f"no experiment {key!r} in the registry")
        return experiment


def _per_unit(key: str) -> str:
    return f"experiment {key!r} keeps one bandit per unit: the context's targetingKey is required"


async def evaluation_context(request: Request) -> dict[str, Any]:
    """The ``context`` of an OFREP request's body (``{}`` when absent; ``FlagError`` 400
    ``PARSE_ERROR`` naming what is wrong with the body)."""
    try:
        raw = await read_body(request)
        body = orjson.loads(raw) if raw.strip() else {}
    except BodyTooLargeError as exc:
        raise FlagError(400, "PARSE_ERROR", str(exc)) from None
    except orjson.JSONDecodeError as exc:
        raise FlagError(400, "PARSE_ERROR", f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise FlagError(400, "PARSE_ERROR", f"the body must be a JSON object, got {body!r}")
    unknown = sorted(set(body) - {"context"})
    if unknown:
        raise FlagError(400, "PARSE_ERROR", f"field {unknown[0]!r} is unknown (known: context)")
    context = body.get("context", {})
    if not isinstance(context, dict):
        raise FlagError(400, "PARSE_ERROR", f"context must be a JSON object, got {context!r}")
    return context


def targeting_key(context: dict[str, Any]) -> str | None:
    """The unit: the context's ``targetingKey`` (None when absent or empty, as the SDKs
    send none; ``FlagError`` ``INVALID_CONTEXT`` when it is not a string).

    >>> targeting_key({"targetingKey": "u1"}), targeting_key({})
    ('u1', None)
    """
    unit = context.get(TARGETING_KEY)
    if unit is None or unit == "":
        return None
    if not isinstance(unit, str):
        raise FlagError(400, "INVALID_CONTEXT", f"targetingKey must be a string, got {unit!r}")
    return unit


def decide_context(experiment: Experiment | None, context: dict[str, Any]) -> Any:
    """What a decision gets as ``context``: the attributes the experiment's named contexts
    read (``FlagError`` ``INVALID_CONTEXT`` naming one missing), else the integer
    ``context`` attribute; without the registry (``experiment`` None), that integer, else
    every attribute but ``targetingKey``.

    >>> decide_context(None, {"targetingKey": "u", "device": "ios"})
    {'device': 'ios'}
    >>> decide_context(None, {"targetingKey": "u", "context": 2, "device": "ios"})
    2
    """
    if experiment is None:
        named = {k: v for k, v in context.items() if k != TARGETING_KEY}
        return context.get(INDEX, named or None)
    if experiment.contexts is None:
        return context.get(INDEX)
    names = [name for name, _ in experiment.contexts.attributes]
    missing = [name for name in names if name not in context]
    if missing:
        raise FlagError(
            400,
            "INVALID_CONTEXT",
            f"experiment {experiment.name!r} reads the context attributes {names}: "
            f"{missing[0]!r} is missing",
        )
    return {name: context[name] for name in names}


def refusal(key: str, exc: DeadLetterError) -> FlagError:
    """The OFREP error of the service's refusal of an evaluation of ``key``.

    >>> refusal("x", DeadLetterError("r1", "unknown_experiment", "no experiment 'x'")).status
    404
    """
    if exc.reason == "unknown_experiment":
        return FlagError(404, "FLAG_NOT_FOUND", exc.detail)
    if exc.detail == unit_required(key):  # without --registry
        return FlagError(400, "TARGETING_KEY_MISSING", _per_unit(key))
    if exc.reason in CONTEXT_REFUSALS:
        return FlagError(400, "INVALID_CONTEXT", exc.detail)
    return FlagError(500, "GENERAL", f"the service refused it: {exc.reason}: {exc.detail}")


def success(key: str, decision: Decision) -> dict[str, Any]:
    """The OFREP answer of a decision: the arm's name as value and variant.

    >>> answer = success("shop", Decision("shop", None, "r1", 1, "b", 0.25, 7, "bandit"))
    >>> answer["value"], answer["reason"], answer["metadata"]["request_id"]
    ('b', 'SPLIT', 'r1')
    """
    return {
        "key": key,
        "value": decision.arm_name,
        "variant": decision.arm_name,
        "reason": reason_of(decision.why),
        "metadata": {
            "prob": decision.prob,
            "why": decision.why,
            "request_id": decision.request_id,
            "round": decision.round,
        },
    }
