"""``tsi serve``: the HTTP gateway in front of the running service (``flows.gateway``)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from flows.cli.base import app, fail
from flows.cli.options import with_options
from flows.client.settings import OPTIONS, ClientSettings
from flows.service.runtime.kafka_options import GROUP_OPTION, application_id
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

if TYPE_CHECKING:
    from flows.experiments.store import ExperimentStore

#: Seconds the experiments store waits for the brokers at each call.
CONNECT_WAIT = 10.0

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


REGISTRY = replace(
    option("registry"),  # tsi run's variable and flag, optional here
    help="The service's registry (TOML): a call naming an experiment or an arm it lacks is "
    "refused at once (422); read again when the file changes. None: the service refuses them.",
    parse=optional(path),
    default="",
)


EXPERIMENTS = replace(
    option("experiments_topic"),  # tsi run's variable and flag
    help="Serve the experiments API (/v1/experiments: list, create or change, pause, resume, "
    "stop, archive, history) on the application's experiments topic `{app}.experiments` "
    "(created when missing).",
)


@app.command("serve")
@with_options(
    *OPTIONS, GROUP_OPTION, HOST, PORT, READ_TIMEOUT, REGISTRY, METRICS_URL, LIVE_EVERY, EXPERIMENTS
)
def serve_gateway(env: Mapping[str, str]) -> None:
    """Serve decisions over HTTP: POST /v1/decide and /v1/feedback, GET /openapi.json,
    and the live page GET /experiments (its numbers: GET /experiments.json).

    Takes the brokers, Kafka settings and topics of tsi run (the same options and
    variables); each replica reads every answer and keeps its own.
    """
    import uvicorn

    from flows.experiments.store import StoreError
    from flows.gateway.app import gateway
    from flows.gateway.deadlines import with_timeout
    from flows.gateway.known import Known
    from flows.gateway.live import Live
    from flows.service.instances.registry import RegistryError

    try:
        settings = ClientSettings.from_env(env)
        host, port = HOST.read(env), PORT.read(env)
        protocol = with_timeout(READ_TIMEOUT.read(env))
        live = Live(METRICS_URL.read(env), LIVE_EVERY.read(env))
        registry = REGISTRY.read(env)
        known = None if registry is None else Known(registry)
        store = experiment_store(env, settings) if EXPERIMENTS.read(env) else None
    except (ConfigError, RegistryError, StoreError) as exc:
        fail("serve", str(exc))
    print(describe_serve(settings, host, port), file=sys.stderr, flush=True)
    uvicorn.run(
        gateway(settings, live, known, store),
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        http=protocol,  # idle and slow clients closed (``gateway.deadlines``)
    )


def experiment_store(env: Mapping[str, str], settings: ClientSettings) -> ExperimentStore:
    """The store of the application ``env`` names, its topics created when missing."""
    from flows.experiments.store import ExperimentStore

    brokers = settings.brokers.split(",")
    store = ExperimentStore(brokers, application_id(env), settings.consumer, CONNECT_WAIT)
    store.ensure_topics()
    return store


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
