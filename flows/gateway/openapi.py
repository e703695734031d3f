"""The gateway's OpenAPI 3.1 description, written here (``GET /openapi.json``), its
OpenFeature routes (OFREP) as the protocol's own description declares them; the fields
of each body are declared once, in ``DECIDE_FIELDS`` and ``FEEDBACK_FIELDS``, which the
gateway also checks bodies against (with ``DECIDE_REQUIRED`` and ``FEEDBACK_REQUIRED``).

The calls but ``/healthz``, ``/ready`` and ``/openapi.json`` take an API key (with
``tsi serve --keys``): a bearer token, or the same in ``X-API-Key``; a 401 without one, a
403 without its scope.

>>> sorted(openapi()["paths"])[:3]
['/healthz', '/ofrep/v1/evaluate/flags', '/ofrep/v1/evaluate/flags/{key}']
>>> sorted(openapi()["components"]["securitySchemes"])
['apiKey', 'bearer']
"""

from __future__ import annotations

from typing import Any

from flows.service.instances.registry_keys import spec_schema

_ID = {"type": "string", "minLength": 1, "maxLength": 256}
_TIMEOUT = {"type": "number", "exclusiveMinimum": 0, "description": "seconds to wait"}
_ARM = {"oneOf": [{"type": "string"}, {"type": "integer", "minimum": 0}]}

#: The fields of a decision request (docs/explanation/wire-protocol.md).
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


_OFREP_CONTEXT = {
    "type": "object",
    "description": "targetingKey: the unit; the attributes the experiment's contexts name "
    "(or an integer context); others are ignored",
}
_OFREP_REQUEST = {
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "properties": {"context": _OFREP_CONTEXT},
                "additionalProperties": False,
            }
        }
    }
}
_OFREP_SUCCESS = {
    "type": "object",
    "required": ["key", "value", "variant", "reason"],
    "properties": {
        "key": {"type": "string", "description": "the experiment"},
        "value": {"type": "string", "description": "the arm to serve"},
        "variant": {"type": "string", "description": "the arm to serve"},
        "reason": {"enum": ["SPLIT", "DEFAULT", "STATIC"]},
        "metadata": {
            "type": "object",
            "description": "prob, why, round, and the request_id its feedback names",
        },
    },
}
_OFREP_FAILURE = {
    "type": "object",
    "required": ["errorCode"],
    "properties": {
        "key": {"type": "string"},
        "errorCode": {
            "enum": [
                "PARSE_ERROR",
                "TARGETING_KEY_MISSING",
                "INVALID_CONTEXT",
                "FLAG_NOT_FOUND",
                "GENERAL",
            ]
        },
        "errorDetails": {"type": "string"},
    },
}


def _ofrep(schema: dict[str, Any], text: str) -> dict[str, Any]:
    return {"description": text, "content": {"application/json": {"schema": schema}}}


def _error(text: str) -> dict[str, Any]:
    return {"description": text, "content": {"application/json": {"schema": _ERROR}}}


def _body(fields: dict[str, Any], required: tuple[str, ...]) -> dict[str, Any]:
    schema = {"type": "object", "properties": fields, "required": list(required)}
    schema["additionalProperties"] = False
    return {"required": True, "content": {"application/json": {"schema": schema}}}


#: How a call presents its API key (``flows.gateway.access``).
SECURITY_SCHEMES = {
    "bearer": {"type": "http", "scheme": "bearer", "description": "a token of tsi keys create"},
    "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
}
#: A call with the ``decide`` scope, by either scheme (the others are open).
_DECIDE = [{"bearer": ["decide"]}, {"apiKey": ["decide"]}]
#: The access rules' refusals, in the gateway's error shape (``flows.gateway.access``).
_REFUSED = {
    "401": _error("no API key, or one no key has (with --keys)"),
    "403": _error("the key lacks the scope decide (with --keys)"),
}


def _scoped(scope: str) -> dict[str, Any]:
    """An operation's ``security`` (``scope`` by either scheme) and its refusals, which
    the caller merges into its responses."""
    return {
        "security": [{"bearer": [scope]}, {"apiKey": [scope]}],
        "responses": {
            "401": _error("no API key, or one no key has (with --keys)"),
            "403": _error(f"the key lacks the scope {scope} (with --keys)"),
        },
    }


def _ofrep_paths() -> dict[str, Any]:
    """The OpenFeature routes (``flows.gateway.ofrep``)."""
    return {
        "/ofrep/v1/evaluate/flags/{key}": {
            "post": {
                "summary": "OpenFeature (OFREP): the arm of experiment {key}",
                "security": _DECIDE,
                "parameters": [{"name": "key", "in": "path", "required": True, "schema": _ID}],
                "requestBody": _OFREP_REQUEST,
                "responses": {
                    "200": _ofrep(_OFREP_SUCCESS, "the decision"),
                    "400": _ofrep(_OFREP_FAILURE, "a bad body or context"),
                    **_REFUSED,
                    "404": _ofrep(_OFREP_FAILURE, "FLAG_NOT_FOUND: no such experiment"),
                    "500": _ofrep(_OFREP_FAILURE, "Kafka away or no answer in time"),
                },
            }
        },
        "/ofrep/v1/evaluate/flags": {
            "post": {
                "summary": "OpenFeature (OFREP): every experiment of --registry",
                "security": _DECIDE,
                "requestBody": _OFREP_REQUEST,
                "responses": {
                    "200": _ofrep(
                        {
                            "type": "object",
                            "properties": {
                                "flags": {
                                    "type": "array",
                                    "items": {"oneOf": [_OFREP_SUCCESS, _OFREP_FAILURE]},
                                }
                            },
                        },
                        "each experiment's decision or failure",
                    ),
                    "400": _ofrep(_OFREP_FAILURE, "a bad body (PARSE_ERROR)"),
                    **_REFUSED,
                    "500": _ofrep(_OFREP_FAILURE, "no --registry, or Kafka away"),
                },
            }
        },
    }


#: The experiments API's answers (``flows.gateway.experiments``).
_EXPERIMENT_OK = {
    "200": {"description": "the experiment after the change, changed or not, its diff"}
}
_EXPERIMENT_ERRORS = {
    "400": _error("a bad body; the detail names the field"),
    "404": _error("no such experiment"),
    "422": _error("refused: the detail names the bad key, value or transition"),
    "503": _error("Kafka is unreachable"),
}
_PUT_BODY = {
    "type": "object",
    "properties": {
        "spec": spec_schema(),
        "expected_version": {"type": "integer", "minimum": 0},
    },
    "required": ["spec"],
    "additionalProperties": False,
}
_ARM_BODY = {"type": "object", "properties": {"arm": {"type": "string"}}}


def _operation(
    summary: str, scope: str, responses: dict[str, Any], body: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One operation of the experiments API: its scope, refusals and optional body (required
    when it names ``required`` fields)."""
    scoped = _scoped(scope)
    needed = bool(body and body.get("required"))
    content = {} if body is None else {"requestBody": {"required": needed, "content": _json(body)}}
    merged = {**responses, **scoped["responses"]}
    return {"summary": summary, "security": scoped["security"], **content, "responses": merged}


def _experiment_paths() -> dict[str, Any]:
    """The experiments API's paths (``flows.gateway.experiments``)."""
    changed = {**_EXPERIMENT_OK, **_EXPERIMENT_ERRORS}

    def action(summary: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"post": _operation(summary, "admin", changed, body)}

    put = {
        **changed,
        "201": {"description": "created"},
        "409": _error("another version than the expected one"),
    }
    base = "/v1/experiments"
    return {
        base: {"get": _operation("Every experiment", "read", _EXPERIMENT_OK)},
        f"{base}/{{name}}": {
            "get": _operation("One experiment", "read", changed),
            "put": _operation(
                "Create or change (expected_version: 409 when another)", "admin", put, _PUT_BODY
            ),
        },
        f"{base}/{{name}}/pause": action("Serve the control arm (arm, or the first)", _ARM_BODY),
        f"{base}/{{name}}/resume": action("Serve and learn again"),
        f"{base}/{{name}}/stop": action("Serve arm to everyone from now on", _ARM_BODY),
        f"{base}/{{name}}/archive": action("Serve it no more; its history stays"),
        f"{base}/{{name}}/history": {
            "get": _operation("Every change: who, when, diff", "read", changed)
        },
    }


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def openapi(experiments: bool = False) -> dict[str, Any]:
    """The description served at ``/openapi.json`` (``experiments``: with the experiments
    API's paths)."""
    common = {
        "400": _error("a bad body; the detail names the field"),
        **_REFUSED,
        "413": _error("a body over 64 KiB, refused as it is read"),
        "503": _error("Kafka is unreachable or did not take the message"),
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "tsi gateway", "version": "1"},
        "components": {"securitySchemes": SECURITY_SCHEMES},
        "paths": {
            "/v1/decide": {
                "post": {
                    "summary": "The arm to serve",
                    "security": _DECIDE,
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
                    "security": _DECIDE,
                    "requestBody": _body(FEEDBACK_FIELDS, FEEDBACK_REQUIRED),
                    "responses": {
                        "202": {"description": "the broker has it"},
                        **common,
                        "422": _error("the registry lacks its experiment or arm (--registry)"),
                    },
                }
            },
            **_ofrep_paths(),
            **(_experiment_paths() if experiments else {}),
            "/healthz": {"get": {"responses": {"200": {"description": "the gateway runs"}}}},
            "/ready": {
                "get": {
                    "responses": {
                        "200": {"description": "connected, and the service answers"},
                        "503": {"description": "not: the detail names what is not"},
                    },
                }
            },
        },
    }
