"""The gateway's OpenAPI 3.1 description, written here (``GET /openapi.json``); the fields
of each body are declared once, in ``DECIDE_FIELDS`` and ``FEEDBACK_FIELDS``, which the
gateway also checks bodies against (with ``DECIDE_REQUIRED`` and ``FEEDBACK_REQUIRED``).

>>> sorted(openapi()["paths"])
['/healthz', '/ready', '/v1/decide', '/v1/feedback']
"""

from __future__ import annotations

from typing import Any

_ID = {"type": "string", "minLength": 1, "maxLength": 256}
_TIMEOUT = {"type": "number", "exclusiveMinimum": 0, "description": "seconds to wait"}
_ARM = {"oneOf": [{"type": "string"}, {"type": "integer", "minimum": 0}]}

#: The fields of a decision request (README, "Integrating an application").
DECIDE_FIELDS: dict[str, Any] = {
    "experiment": _ID,
    "unit": {**_ID, "description": "required by a per-unit experiment"},
    "request_id": {**_ID, "description": "drawn (UUID 4) when absent; a retry sends it again"},
    "context": {
        "oneOf": [{"type": "integer", "minimum": 0}, {"type": "object"}],
        "description": "an index, or named attributes",
    },
    "eligible": {"type": "array", "items": _ARM, "description": "the arms allowed"},
    "timeout": _TIMEOUT,
}

DECIDE_REQUIRED = ("experiment",)

#: The fields of a feedback (``loss`` or ``reward``, not both).
FEEDBACK_FIELDS: dict[str, Any] = {
    "experiment": _ID,
    "request_id": _ID,
    "unit": _ID,
    "loss": {"type": "number"},
    "reward": {"type": "number", "description": "a reward r is the loss -r"},
    "arm": {**_ARM, "description": "the arm served (refused when another was drawn)"},
    "guardrails": {
        "type": "object",
        "additionalProperties": {"type": "number"},
        "description": 'guardrail metrics of the decision, e.g. {"latency_ms": 120.5}',
    },
    "timeout": _TIMEOUT,
}

FEEDBACK_REQUIRED = ("experiment", "request_id")

_DECISION = {
    "type": "object",
    "properties": {
        "experiment": {"type": "string"},
        "unit": {"type": ["string", "null"]},
        "request_id": {"type": "string"},
        "arm": {"type": "integer"},
        "arm_name": {"type": "string", "description": "the arm to serve"},
        "prob": {"type": "number", "description": "the probability it was served with"},
        "round": {"type": "integer"},
        "why": {"enum": ["bandit", "holdout", "burn_in", "forced"]},
    },
}
_ERROR = {
    "type": "object",
    "properties": {
        "error": {"type": "string"},
        "detail": {"type": "string"},
        "request_id": {"type": "string"},
    },
}


def _error(text: str) -> dict[str, Any]:
    return {"description": text, "content": {"application/json": {"schema": _ERROR}}}


def _body(fields: dict[str, Any], required: tuple[str, ...]) -> dict[str, Any]:
    schema = {"type": "object", "properties": fields, "required": list(required)}
    schema["additionalProperties"] = False
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def openapi() -> dict[str, Any]:
    """The description served at ``/openapi.json``."""
    common = {
        "400": _error("a bad body; the detail names the field"),
        "413": _error("a body over 64 KiB, refused as it is read"),
        "503": _error("Kafka is unreachable or did not take the message"),
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "tsi gateway", "version": "1"},
        "paths": {
            "/v1/decide": {
                "post": {
                    "summary": "The arm to serve",
                    "requestBody": _body(DECIDE_FIELDS, DECIDE_REQUIRED),
                    "responses": {
                        "200": {
                            "description": "the decision",
                            "content": {"application/json": {"schema": _DECISION}},
                        },
                        **common,
                        "422": _error("the service refused the request (its dead letter)"),
                        "504": _error("no answer in time: serve a fallback, send no feedback"),
                    },
                }
            },
            "/v1/feedback": {
                "post": {
                    "summary": "The loss or reward of a decision",
                    "requestBody": _body(FEEDBACK_FIELDS, FEEDBACK_REQUIRED),
                    "responses": {
                        "202": {"description": "the broker has it"},
                        **common,
                        "422": _error("the registry lacks its experiment or arm (--registry)"),
                    },
                }
            },
            "/healthz": {"get": {"responses": {"200": {"description": "the gateway runs"}}}},
            "/ready": {
                "get": {
                    "responses": {
                        "200": {"description": "connected, and the service answers"},
                        "503": {"description": "not: the detail names what is not"},
                    }
                }
            },
        },
    }
