"""``tsi serve``: the HTTP gateway in front of the running service (``flows.gateway``)."""

from __future__ import annotations

import functools
import signal
import ssl
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
    from flows.gateway.keys import Keys

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

KEYS = Option(
    "TSI_SERVE_KEYS",
    "--keys",
    "The API keys file (tsi keys create): every call but /healthz, /ready and /openapi.json "
    "then needs a key with its scope; read again when the file changes or on SIGHUP. None: "
    "open to anyone who reaches the port.",
    optional(path),
)
TLS_CERT = Option(
    "TSI_SERVE_TLS_CERT",
    "--tls-cert",
    "The TLS certificate (PEM, its chain after it): serve HTTPS. Give --tls-key with it.",
    optional(path),
)
TLS_KEY = Option(
    "TSI_SERVE_TLS_KEY", "--tls-key", "The TLS certificate's private key (PEM).", optional(path)
)


def _guardrail_action(text: str) -> str:
    if text not in GUARDRAIL_ACTIONS:
        raise ValueError(f"must be one of {', '.join(GUARDRAIL_ACTIONS)}, got {text!r}")
    return text


GUARDRAIL_ACTIONS = ("pause", "report")
GUARDRAILS = Option(
    "TSI_SERVE_GUARDRAILS",
    "--guardrails",
    "What a breached guardrail does (docs/guides/guardrails.md): pause (the experiment paused "
    "to the holdout's arm: through the experiments topic with --experiments-topic, with its "
    "audit record; else force_arm written into the --registry file, which the service applies "
    "on its next reload) or report (the live page, the log and tsi_guardrail_breaches_total "
    "only).",
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


EXPERIMENTS = replace(
    option("experiments_topic"),  # tsi run's variable and flag
    help="Serve the experiments API (/v1/experiments: list, create or change, pause, resume, "
    "stop, archive, history) on the application's experiments topic `{app}.experiments` "
    "(created when missing).",
)

#: Every option of ``tsi serve`` (its flags and the variables it reads).
SERVE_OPTIONS = (
    *OPTIONS,
    HOST,
    PORT,
    READ_TIMEOUT,
    REGISTRY,
    KEYS,
    TLS_CERT,
    TLS_KEY,
    METRICS_URL,
    LIVE_EVERY,
    GUARDRAILS,
    GROUP_OPTION,
    EXPERIMENTS,
)


@app.command("serve")
@with_options(*SERVE_OPTIONS)
def serve_gateway(env: Mapping[str, str]) -> None:
    """Serve decisions over HTTP: POST /v1/decide and /v1/feedback, GET /openapi.json,
    and the live page GET /experiments (its numbers: GET /experiments.json); behind API
    keys with --keys, over HTTPS with --tls-cert and --tls-key.

    Takes the brokers, Kafka settings and topics of tsi run (the same options and
    variables); each replica reads every answer and keeps its own.
    """
    import uvicorn

    from flows.experiments.store import StoreError
    from flows.gateway.app import gateway
    from flows.gateway.deadlines import with_timeout
    from flows.gateway.keys import Keys, KeysError
    from flows.gateway.known import Known
    from flows.gateway.live import Live
    from flows.service.instances.registry import RegistryError

    try:
        settings = ClientSettings.from_env(env)
        host, port = HOST.read(env), PORT.read(env)
        protocol = with_timeout(READ_TIMEOUT.read(env))
        registry = REGISTRY.read(env)
        known = None if registry is None else Known(registry)
        keys_file = KEYS.read(env)
        keys = None if keys_file is None else Keys(keys_file)
        tls = tls_files(TLS_CERT.read(env), TLS_KEY.read(env))
        store = experiment_store(env, settings) if EXPERIMENTS.read(env) else None
        controller = _controller(known, store, GUARDRAILS.read(env))
        live = Live(METRICS_URL.read(env), LIVE_EVERY.read(env), controller)
    except (ConfigError, RegistryError, StoreError, KeysError) as exc:
        fail("serve", str(exc))
    if keys is not None:
        signal.signal(signal.SIGHUP, lambda *_: keys.reload())
    print(describe_serve(settings, host, port, keys, tls is not None), file=sys.stderr, flush=True)
    uvicorn.run(
        gateway(settings, live, known, keys, store),
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        http=protocol,  # idle and slow clients closed (``gateway.deadlines``)
        ssl_certfile=None if tls is None else tls[0],
        ssl_keyfile=None if tls is None else tls[1],
    )


def experiment_store(env: Mapping[str, str], settings: ClientSettings) -> ExperimentStore:
    """The store of the application ``env`` names, its topics created when missing."""
    from flows.experiments.store import ExperimentStore

    brokers = settings.brokers.split(",")
    store = ExperimentStore(brokers, application_id(env), settings.consumer, CONNECT_WAIT)
    store.ensure_topics()
    return store


def tls_files(cert: Path | None, key: Path | None) -> tuple[Path, Path] | None:
    """(certificate, key) for HTTPS, None for HTTP; ``ConfigError`` when only one is
    given, or they do not load as a pair.

    >>> tls_files(None, None) is None
    True
    >>> try:
    ...     tls_files(Path("cert.pem"), None)
    ... except ConfigError as exc:
    ...     print(exc)
    give --tls-cert and --tls-key together, got only --tls-cert
    """
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        given = "--tls-cert" if key is None else "--tls-key"
        raise ConfigError(f"give --tls-cert and --tls-key together, got only {given}")
    for flag, file in (("--tls-cert", cert), ("--tls-key", key)):
        try:
            file.open("rb").close()
        except OSError as exc:
            raise ConfigError(f"{flag} {file} cannot be read: {exc.strerror}") from None
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"--tls-cert {cert} / --tls-key {key} do not load: {' '.join(str(exc).split())}"
        ) from None
    return cert, key


def _controller(known: Any, store: Any, action: str) -> Any:
    """The guardrails' controller (None with neither a registry file nor the experiments
    topic): ``pause`` changes the experiment in the topic (with its audit record) or writes
    ``force_arm`` into the file; ``report`` only says."""
    from flows.guardrails.control import Controller
    from flows.guardrails.file_action import ForceArmInFile
    from flows.guardrails.store_action import PauseInStore, store_registry

    if store is not None:
        pause = PauseInStore(store) if action == "pause" else None
        return Controller(functools.partial(store_registry, store), pause)
    if known is None:
        return None
    pause = ForceArmInFile(known.path) if action == "pause" else None
    return Controller(known.current, pause)


def describe_serve(
    settings: ClientSettings, host: str, port: int, keys: Keys | None = None, tls: bool = False
) -> str:
    """The line ``tsi serve`` prints when it starts: where it listens, what it reads, who
    may call.

    >>> from flows.client.settings import ClientSettings
    >>> describe_serve(ClientSettings(brokers="k:9092"), "127.0.0.1", 8080)  # doctest: +ELLIPSIS
    'tsi serve: http://127.0.0.1:8080 (POST /v1/decide, /v1/feedback; GET /experiments) ...'
    >>> describe_serve(ClientSettings(brokers="k:9092"), "h", 1).split("; ")[-1]
    'open: no --keys, anyone who reaches the port may call'
    """
    topics = settings.topics
    inputs = topics.events or f"{topics.requests}, {topics.feedback}"
    scheme = "https" if tls else "http"
    access = (
        "open: no --keys, anyone who reaches the port may call"
        if keys is None
        else f"API keys from {keys.path} ({len(keys)} now)"
    )
    return (
        f"tsi serve: {scheme}://{host}:{port} (POST /v1/decide, /v1/feedback; GET "
        f"/experiments) for brokers {settings.brokers}: requests to {inputs}, answers from "
        f"{topics.selections}; {access}"
    )
