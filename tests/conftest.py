"""Shared pytest fixtures, and the ``kafka`` marker on every test that needs the broker."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from flows.testing.kafka_broker import (
    BrokerStartError,
    broker_session,
    start_broker,
    stop_broker,
    unique_topic,
)


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap address of a real Kafka broker (see flows/testing/kafka_broker.py); a broker
    that cannot start FAILS the session with what to install."""
    try:
        yield from broker_session(tmp_path_factory.mktemp("kafka"))
    except BrokerStartError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="module")
def own_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """(its directory, its address): a broker of the module's own, which its tests may
    pause, kill and start again (``kafka_broker.restart_broker``)."""
    data = tmp_path_factory.mktemp("own-kafka")
    try:
        bootstrap = start_broker(data)
    except BrokerStartError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield data, bootstrap
    finally:
        stop_broker(data)


@pytest.fixture(autouse=True)
def own_changelog(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each broker test its own changelog topic: the service mirrors its shards to one by
    default (created as it starts), and a name shared between tests would rebuild one
    test's shards from another's changelog."""
    if "kafka_bootstrap" in request.fixturenames:
        monkeypatch.setenv("TSI_TOPIC_CHANGELOG", unique_topic("changelog"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests that use the broker: ``pytest -m "not kafka"`` is the fast loop."""
    for item in items:
        names = getattr(item, "fixturenames", ())
        if "kafka_bootstrap" in names or "own_broker" in names:
            item.add_marker(pytest.mark.kafka)
