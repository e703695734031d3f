"""The OFREP routes' answers that need no broker: what the registry alone decides is said
even while Kafka is away (no broker here: the client cannot connect)."""

from __future__ import annotations

import httpx
import pytest
from starlette.applications import Starlette

from flows.client import KafkaUnavailableError
from flows.gateway.known import Known
from flows.gateway.ofrep import Ofrep


async def _away():
    raise KafkaUnavailableError("no broker")


@pytest.fixture
def client(tmp_path):
    registry = tmp_path / "registry.toml"
    registry.write_text('[experiments.shop]\narms = ["a", "b"]\nper_unit = true\n')
    app = Starlette(routes=Ofrep(_away, Known(registry)).routes())
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("key", "body", "status", "code"),
    [
        ("nope", {"context": {"targetingKey": "u1"}}, 404, "FLAG_NOT_FOUND"),
        ("k" * 300, {}, 404, "FLAG_NOT_FOUND"),
        ("shop", {"context": {}}, 500, "GENERAL"),  # known: it needs the broker
        ("shop", {"context": []}, 400, "PARSE_ERROR"),
    ],
)
async def test_what_the_registry_decides_is_said_while_kafka_is_away(
    client, key, body, status, code
):
    answer = await client.post(f"/ofrep/v1/evaluate/flags/{key}", json=body)
    assert (answer.status_code, answer.json()["errorCode"]) == (status, code), answer.json()
    if code == "GENERAL":
        assert "Kafka is unavailable" in answer.json()["errorDetails"]


@pytest.fixture
def anyio_backend():
    return "asyncio"
