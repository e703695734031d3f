"""The gateway's OpenAPI document against the routes it serves."""

from starlette.routing import Route

from flows.client import ClientSettings
from flows.gateway import app
from flows.gateway.access import needed
from flows.gateway.openapi import openapi
from flows.testing.kafka_broker import free_port


def test_the_openapi_document_names_every_route_of_the_gateway():
    """Each route the gateway serves is in its OpenAPI document, and nothing else (the
    document itself and the live page aside)."""
    routes = app.gateway(ClientSettings(brokers=f"127.0.0.1:{free_port()}")).routes
    served = {route.path for route in routes if isinstance(route, Route)}
    assert served - {"/openapi.json"} == set(openapi()["paths"])


def test_the_document_declares_the_scope_each_call_needs():
    """Each operation declares the scope the access rules ask of it, and its 401 and 403;
    an open one declares neither."""
    for path, operations in openapi()["paths"].items():
        for method, operation in operations.items():
            scope = needed(method.upper(), path)
            requirements = operation.get("security", [])
            declared = {s for requirement in requirements for v in requirement.values() for s in v}
            assert declared == ({scope} if scope else set()), (method, path)
            refusals = {"401", "403"} <= set(operation["responses"])
            assert refusals == (scope is not None), (method, path)
