"""Shared pytest fixtures."""

from collections.abc import Iterator

import pytest

from tests.kafka_broker import broker_session


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap address of a real Kafka broker (see tests/kafka_broker.py); fails if none."""
    yield from broker_session(tmp_path_factory.mktemp("kafka"))
