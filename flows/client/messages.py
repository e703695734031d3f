"""The client's messages as the service reads and writes them
(docs/explanation/wire-protocol.md): requests and feedback checked by the service's own
parser before they are sent, answers and dead letters matched back to their request.

>>> key, value = request_message("shop", "u1", "r1", None, None, combined=False)
>>> key, value
(b'shop\\x1fu1', b'{"experiment":"shop","unit":"u1","request_id":"r1"}')
>>> request_message("shop", None, "", None, None, combined=False)
Traceback (most recent call last):
...
flows.client.errors.BadRequestError: bad_value: request_id must have 1 to 256 characters
>>> answer_of(b'{"experiment":"shop","request_id":"r1","arm":0}')
(('shop', 'r1'), {'experiment': 'shop', 'request_id': 'r1', 'arm': 0})
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

import orjson

from flows.client.errors import BadRequestError
from flows.service.wire.events import DeadLetter, Origin, parse_feedback, parse_request
from flows.service.wire.keys import instance_key

_HERE = Origin("client")

#: An answer's identity: (experiment, request_id).
Match = tuple[str, str]


def request_message(
    experiment: str,
    unit: str | None,
    request_id: str,
    context: Any,
    eligible: Any,
    combined: bool,
) -> tuple[bytes, bytes]:
    """(key, value) of a request; ``combined``: for the events topic (``"type"``).
    ``BadRequestError`` when the service would refuse it."""
    data: dict[str, Any] = {"experiment": experiment, "unit": unit, "request_id": request_id}
    data |= {"context": context, "eligible": eligible}
    return _checked(parse_request, _present(data), "request", combined)


def feedback_message(
    experiment: str,
    unit: str | None,
    request_id: str,
    loss: float | None,
    reward: float | None,
    arm: str | int | None,
    combined: bool,
    guardrails: Mapping[str, float] | None = None,
) -> tuple[bytes, bytes]:
    """(key, value) of a feedback, with its guardrail metrics (``{"latency_ms": 120.5}``)
    if any; ``BadRequestError`` when the service would refuse it."""
    data = {"experiment": experiment, "unit": unit, "request_id": request_id}
    data |= {"loss": loss, "reward": reward, "arm": arm, "guardrails": guardrails}
    return _checked(parse_feedback, _present(data), "feedback", combined)


def _present(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if v is not None}


def _checked(parse: Any, data: dict[str, Any], kind: str, combined: bool) -> tuple[bytes, bytes]:
    try:
        value = orjson.dumps(data)
    except TypeError as exc:
        raise BadRequestError("wrong_type", f"{kind} is not JSON: {exc}") from None
    parsed = parse(value, _HERE)
    if isinstance(parsed, DeadLetter):
        raise BadRequestError(parsed.reason, parsed.detail)
    if combined:
        value = orjson.dumps({"type": kind, **data})
    # the instance's key keeps its messages in order on one partition (a shared
    # experiment's units differ in key: a request and its feedback still share theirs)
    return instance_key(data["experiment"], data.get("unit")).encode(), value


def answer_of(value: bytes) -> tuple[Match, dict[str, Any]] | None:
    """(the request a selection answers, the selection), or None for another message."""
    try:
        data = orjson.loads(value)
        match = _match(data["experiment"], data["request_id"])
        return (match, data) if match else None
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None


def refused_request(value: bytes) -> tuple[Match, str, str] | None:
    """(the request, reason, detail) of a dead letter holding a request (not a feedback:
    that has ``loss`` or ``reward``), or None."""
    try:
        letter = orjson.loads(value)
        raw = orjson.loads(base64.b64decode(letter["raw_b64"], validate=True))
        if "loss" in raw or "reward" in raw or raw.get("type") == "feedback":
            return None
        match = _match(raw["experiment"], raw["request_id"])
        return (match, letter["reason"], letter.get("detail", "")) if match else None
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError, binascii.Error):
        return None


def _match(experiment: Any, request_id: Any) -> Match | None:
    ok = isinstance(experiment, str) and isinstance(request_id, str)
    return (experiment, request_id) if ok else None
