"""A short seeded fault campaign (``chaos.Campaign``) on a broker of its own: two members
to start with, every kind of fault once (a member killed -9, killed again while it
restores, its directory lost, a rescale, the broker killed -9 and paused), under load.
Nothing is lost, doubled or changed, and no member stops on its own. ``bench/chaos.py``
runs the same campaign for minutes and many seeds."""

import pytest

from flows.testing.kafka_broker import start_broker, stop_broker
from tests.service.chaos import FAULTS, Campaign


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """(its directory, its address): a broker the campaign kills, pauses and restarts."""
    data = tmp_path_factory.mktemp("chaos-kafka")
    bootstrap = start_broker(data)
    try:
        yield data, bootstrap
    finally:
        stop_broker(data)


def test_a_short_seeded_campaign_loses_doubles_and_changes_nothing(broker, tmp_path):
    data, bootstrap = broker
    campaign = Campaign(bootstrap, data, tmp_path, seed=5, seconds=40.0, pace=0.05, cover=True)
    verdict = campaign.run()
    assert sorted(f.split(" ", 1)[1] for f in verdict.faults[: len(FAULTS)]) == sorted(FAULTS)
    assert verdict.requests >= 500
    assert verdict.clean(), verdict
