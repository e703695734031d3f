"""``tsi serve``: the HTTP gateway in front of the running service (``flows.gateway``)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from flows.cli.base import app, fail
from flows.cli.options import with_options
from flows.client.settings import OPTIONS, ClientSettings
from flows.service.runtime.options import (
    ConfigError,
    Option,
    comma_list,
    name,
    optional,
    path,
    port_number,
    seconds,
)
from flows.service.runtime.settings import option

HOST = Option("TSI_SERVE_HOST", "--host", "Address the gateway listens on.", name, "127.0.0.1")
PORT = Option("TSI_SERVE_PORT", "--port", "Port the gateway listens on.", port_number, "8080")
METRICS_URL = Option(
    "TSI_SERVE_METRICS_URL",
    "--metrics-url",
    "The service's Prometheus endpoint the live page (/experiments) reads; repeat (or "
    "comma-separate) for each process of a cluster, the page sums them.",
    comma_list,
    "http://127.0.0.1:9108/metrics",  # tsi run --metrics-port 9108, the port of deploy/
    kind="list",
)
READ_TIMEOUT = Option(
    "TSI_SERVE_READ_TIMEOUT",
    "--read-timeout",
    "Seconds a client has to send a whole request, from its connection or its last answer: "
    "an idle or slow connection is closed then.",
    seconds(0.1),
    "10",
)
LIVE_EVERY = Option(
    "TSI_SERVE_LIVE_EVERY",
    "--live-every",
    "Seconds between two samples of the metrics for the live page (it keeps 6 hours).",
    seconds(0.1),
    "10",
)


def _guardrail_action(text: str) -> str:
    if text not in GUARDRAIL_ACTIONS:
        raise ValueError(f"must be one of {', '.join(GUARDRAIL_ACTIONS)}, got {text!r}")
    return text


GUARDRAIL_ACTIONS = ("pause", "report")
GUARDRAILS = Option(
    "TSI_SERVE_GUARDRAILS",
    "--guardrails",
    "What a breached guardrail does (docs/guides/guardrails.md): pause (write force_arm = the "
    "holdout's arm into the registry file; the service applies it on its next reload) or "
    "report (the live page, the log and tsi_guardrail_breaches_total only). Needs --registry.",
    _guardrail_action,
    "pause",
)


REGISTRY = replace(
    option("registry"),  # tsi run's variable and flag, optional here
    help="The service's registry (TOML): a call naming an experiment or an arm it lacks is "
    "refused at once (422); read again when the file changes. None: the service refuses them.",
    parse=optional(path),
    default="",
)


@app.command("serve")
@with_options(*OPTIONS, HOST, PORT, READ_TIMEOUT, REGISTRY, METRICS_URL, LIVE_EVERY, GUARDRAILS)
def serve_gateway(env: Mapping[str, str]) -> None:
    """Serve decisions over HTTP: POST /v1/decide and /v1/feedback, GET /openapi.json,
    and the live page GET /experiments (its numbers: GET /experiments.json).

    Takes the brokers, Kafka settings and topics of tsi run (the same options and
    variables); each replica reads every answer and keeps its own.
    """
    import uvicorn

    from flows.gateway.app import gateway
    from flows.gateway.deadlines import with_timeout
    from flows.gateway.known import Known
    from flows.gateway.live import Live
    from flows.service.instances.registry import RegistryError

    try:
        settings = ClientSettings.from_env(env)
        host, port = HOST.read(env), PORT.read(env)
        protocol = with_timeout(READ_TIMEOUT.read(env))
        registry = REGISTRY.read(env)
        known = None if registry is None else Known(registry)
        controller = _controller(known, GUARDRAILS.read(env))
        live = Live(METRICS_URL.read(env), LIVE_EVERY.read(env), controller)
    except (ConfigError, RegistryError) as exc:
        fail("serve", str(exc))
    print(describe_serve(settings, host, port), file=sys.stderr, flush=True)
    uvicorn.run(
        gateway(settings, live, known),
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        http=protocol,  # idle and slow clients closed (``gateway.deadlines``)
    )


def _controller(known: Any, action: str) -> Any:
    """The guardrails' controller over the registry file (None without one): ``pause``
    writes ``force_arm`` into that file, ``report`` only says."""
    from flows.guardrails.control import Controller
    from flows.guardrails.file_action import ForceArmInFile

    if known is None:
        return None
    pause = ForceArmInFile(known.path) if action == "pause" else None
    return Controller(known.current, pause)


def describe_serve(settings: ClientSettings, host: str, port: int) -> str:
    """The line ``tsi serve`` prints when it starts: where it listens, what it reads.

    >>> from flows.client.settings import ClientSettings
    >>> describe_serve(ClientSettings(brokers="k:9092"), "127.0.0.1", 8080)  # doctest: +ELLIPSIS
    'tsi serve: http://127.0.0.1:8080 (POST /v1/decide, /v1/feedback; GET /experiments) ...'
    """
    topics = settings.topics
    inputs = topics.events or f"{topics.requests}, {topics.feedback}"
    return (
        f"tsi serve: http://{host}:{port} (POST /v1/decide, /v1/feedback; GET /experiments) "
        f"for brokers {settings.brokers}: requests to {inputs}, answers from "
        f"{topics.selections}"
    )
