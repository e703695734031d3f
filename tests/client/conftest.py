from collections.abc import Iterator

import pytest

from tests.client.service import Service


@pytest.fixture(scope="package")
def service(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """One ``tsi run`` for the client's and the gateway's tests."""
    running = Service(kafka_bootstrap, tmp_path_factory.mktemp("service"))
    try:
        yield running
    finally:
        running.stop()
