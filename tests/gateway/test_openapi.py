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
    for path, operations in openapi(experiments=True)["paths"].items():
        for method, operation in operations.items():
            scope = needed(method.upper(), path)
            requirements = operation.get("security", [])
            declared = {s for requirement in requirements for v in requirement.values() for s in v}
            assert declared == ({scope} if scope else set()), (method, path)
            refusals = {"401", "403"} <= set(operation["responses"])
            assert refusals == (scope is not None), (method, path)


def test_with_the_experiments_api_the_document_names_its_routes_too():
    """The experiments API, when mounted, is in the document (each path and method)."""
    from flows.experiments.store import ExperimentStore

    brokers = [f"127.0.0.1:{free_port()}"]
    store = ExperimentStore(brokers, "app")
    routes = app.gateway(ClientSettings(brokers=brokers[0]), store=store).routes
    served = {}
    for route in routes:
        if isinstance(route, Route) and route.path != "/openapi.json":
            served.setdefault(route.path, set()).update(m.lower() for m in route.methods)
    paths = openapi(experiments=True)["paths"]
    assert set(served) == set(paths)
    for path, methods in served.items():
        assert methods - {"head"} == set(paths[path]), path


def test_who_is_the_principal_an_auth_layer_set_else_anonymous():
    from starlette.requests import Request

    from flows.gateway.experiments import who

    assert who(Request({"type": "http", "state": {"principal": "key:alice"}})) == "key:alice"
    assert who(Request({"type": "http", "state": {}})) == "anonymous"
