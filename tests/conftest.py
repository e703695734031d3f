"""Shared pytest fixtures, and the ``kafka`` marker on every test that needs the broker."""

from collections.abc import Iterator

import pytest

from flows.testing.kafka_broker import BrokerStartError, broker_session


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap address of a real Kafka broker (see flows/testing/kafka_broker.py); a broker
    that cannot start FAILS the session with what to install."""
    try:
        yield from broker_session(tmp_path_factory.mktemp("kafka"))
    except BrokerStartError as exc:
        pytest.fail(str(exc), pytrace=False)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests that use the broker: ``pytest -m "not kafka"`` is the fast loop."""
    for item in items:
        if "kafka_bootstrap" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.kafka)
