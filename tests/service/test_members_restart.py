"""A member killed before any input position of its own was committed (it was rebuilding
its shards from the changelog): its store's committed positions are still the inputs'
start (nothing in ``store_offsets``), and the group is ahead on them. With a changelog it
restarts (it reads them again from their start, the shards' guards drop what they
applied: ``test_state_members_live``); without one it is refused as before."""

import pytest

from flows.service.connectors.members import Members
from flows.service.runtime.startup import StartupError
from tests.service.test_members import check_reset

COMMITTED = {("tsi.requests", 1): 33, ("tsi.requests", 3): 30}


def test_a_member_with_no_position_of_its_own_yet_restarts_with_a_changelog(tmp_path, monkeypatch):
    check_reset(tmp_path, monkeypatch, {}, COMMITTED, Members(2, 1), TSI_TOPIC_CHANGELOG="c")
    partly = {("tsi.requests", 1): 33}  # one partition read since, the other not yet
    check_reset(tmp_path, monkeypatch, partly, COMMITTED, Members(2, 1), TSI_TOPIC_CHANGELOG="c")


def test_without_a_changelog_it_is_refused(tmp_path, monkeypatch):
    with pytest.raises(StartupError, match=r"behind consumer group .* on tsi\.requests\[1\]"):
        check_reset(tmp_path, monkeypatch, {}, COMMITTED, Members(2, 1), TSI_NO_CHANGELOG="1")
    with pytest.raises(StartupError, match=r"behind consumer group .* on tsi\.requests\[1\]"):
        check_reset(tmp_path, monkeypatch, {("tsi.requests", 1): 3}, COMMITTED, Members(2, 1),
                    TSI_TOPIC_CHANGELOG="c")  # fmt: skip
