"""A short seeded fault campaign (``chaos.Campaign``) on a broker of its own: 1 to 3
members, a rescale 2 -> 1 -> 2 (member 1 comes back to partitions member 0 served while
it was away), then every kind of fault once (a member killed -9, killed again while it
restores, its directory lost, a rescale, the broker killed -9 and paused), under load.
Nothing is lost, doubled or changed, and no member stops on its own. ``bench/chaos.py``
runs the same campaign for minutes and many seeds."""

from tests.service.chaos import FAULTS, Campaign


def test_a_short_seeded_campaign_loses_doubles_and_changes_nothing(own_broker, tmp_path):
    data, bootstrap = own_broker
    campaign = Campaign(
        bootstrap, data, tmp_path, seed=5, seconds=40.0, pace=0.05, cover=True,
        script=("rescale:1", "rescale:2"), first_count=2,  # member 1 comes back behind
    )  # fmt: skip
    verdict = campaign.run()
    played = [f.split(" ", 1)[1] for f in verdict.faults]
    assert played[:2] == ["rescale:1", "rescale:2"]
    assert sorted(played[2 : 2 + len(FAULTS)]) == sorted(FAULTS)
    assert verdict.requests >= 500
    assert verdict.clean(), verdict
