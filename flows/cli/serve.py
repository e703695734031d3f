"""``tsi serve``: the HTTP gateway in front of the running service (``flows.gateway``)."""

from __future__ import annotations

from collections.abc import Mapping

from flows.cli.base import app, fail
from flows.cli.options import with_options
from flows.client.settings import OPTIONS, ClientSettings
from flows.service.runtime.options import ConfigError, Option, name, port_number

HOST = Option("TSI_SERVE_HOST", "--host", "Address the gateway listens on.", name, "127.0.0.1")
PORT = Option("TSI_SERVE_PORT", "--port", "Port the gateway listens on.", port_number, "8080")


@app.command("serve")
@with_options(*OPTIONS, HOST, PORT)
def serve_gateway(env: Mapping[str, str]) -> None:
    """Serve decisions over HTTP: POST /v1/decide and /v1/feedback, GET /openapi.json.

    Takes the brokers, Kafka settings and topics of tsi run (the same options and
    variables); each replica reads every answer and keeps its own.
    """
    import uvicorn

    from flows.gateway.app import gateway

    try:
        settings = ClientSettings.from_env(env)
        host, port = HOST.read(env), PORT.read(env)
    except ConfigError as exc:
        fail("serve", str(exc))
    uvicorn.run(gateway(settings), host=host, port=port, log_level="warning", access_log=False)
