"""A service's identity is its application id (the consumer group): the topics it owns
are named from it, its changelog's markers carry it, and a start on another
application's changelog refuses, naming both; a store whose changelog lacks its last
marker (a new topic) writes its state there again instead of trusting an empty log."""

import pytest

from flows.service.instances.resting import Entry
from flows.service.runtime.restore import restore
from flows.service.runtime.settings import ConfigError, Settings, topics_from_env
from flows.service.shards.changelog import (
    ForeignChangelogError,
    Marker,
    MemoryChangelog,
    encode,
    replay,
    start,
)

SHARD = "shard-000-of-001"


def written(changelog, entries, marker):
    """``entries`` and ``marker`` written and acknowledged in ``changelog``'s one shard."""
    mirror = changelog.mirror(SHARD)
    for entry in entries:
        mirror.append(entry.key, encode([entry]))
    mirror.mark(marker)
    return mirror.acknowledged()


def entry(key):
    return Entry(key, "e", "state", {"n": key})


def test_the_topics_a_service_owns_are_named_from_its_group():
    assert topics_from_env({}).changelog == "tsi.changelog"
    assert topics_from_env({}).internal == "tsi.events.internal"
    shop = topics_from_env({"TSI_GROUP_ID": "shop"})
    assert (shop.changelog, shop.internal) == ("shop.changelog", "shop.events.internal")
    assert shop.requests == "tsi.requests"  # the inputs are the producers', not its own
    given = topics_from_env({"TSI_GROUP_ID": "shop", "TSI_TOPIC_CHANGELOG": "mine"})
    assert given.changelog == "mine"
    assert topics_from_env({"TSI_GROUP_ID": "shop", "TSI_TOPIC_INTERNAL": ""}).internal is None


def test_two_groups_with_default_settings_never_share_a_topic():
    one = Settings.from_env({"TSI_REGISTRY": "r.toml", "TSI_GROUP_ID": "a"})
    two = Settings.from_env({"TSI_REGISTRY": "r.toml", "TSI_GROUP_ID": "b"})
    assert (one.application, two.application) == ("a", "b")
    owned = {one.topics.changelog, one.topics.internal}
    assert owned.isdisjoint({two.topics.changelog, two.topics.internal})


def test_a_group_that_is_no_topic_name_is_refused_naming_it():
    with pytest.raises(ConfigError, match="bad/name"):
        Settings.from_env({"TSI_REGISTRY": "r.toml", "TSI_GROUP_ID": "bad/name"})


@pytest.mark.parametrize("held", [False, True])
def test_a_start_on_another_applications_changelog_refuses_naming_both(held):
    changelog = MemoryChangelog(application="blog", name="shared")
    written(changelog, [entry("e\x1fu")], Marker(1, {}, "x", application="shop"))
    mirrored = {"seq": 0, "offset": None, "lineage": "mine", "seen": {}} if held else None
    before = list(changelog.logs[SHARD])
    with pytest.raises(ForeignChangelogError, match=r"'shop'.*'blog'") as refused:
        start(changelog, SHARD, {"e\x1fv": entry("e\x1fv")} if held else {}, None, mirrored)
    assert "shared[0]" in str(refused.value)
    assert changelog.logs[SHARD] == before  # nothing written


def test_markers_from_before_application_ids_are_this_applications():
    changelog = MemoryChangelog(application="shop")
    written(changelog, [entry("e\x1fu")], Marker(1, {("in", 0): 4}, "old"))
    begun = start(changelog, SHARD, {}, None, None)
    assert begun.rebuilt and list(begun.entries) == ["e\x1fu"]
    assert begun.guard == {("in", 0): 4}
    assert replay(changelog.read(SHARD)).marker.application == "shop"  # marked as its own


def test_a_store_whose_changelog_lacks_its_marker_writes_its_state_there_again():
    old = MemoryChangelog()
    offset = written(old, [entry("e\x1fu")], Marker(1, {("in", 0): 9}, "mine", "tsi"))
    mirrored = {"seq": 1, "offset": offset, "lineage": "mine", "seen": {("in", 0): 9}}
    new = MemoryChangelog()  # another topic: renamed, or deleted and made again
    local = {"e\x1fu": entry("e\x1fu"), "e\x1fw": entry("e\x1fw")}
    begun = start(new, SHARD, local, None, mirrored)
    assert begun.entries == local and not begun.rebuilt
    found = replay(new.read(SHARD))
    assert found.entries == local  # a lost directory now rebuilds all of it
    assert found.marker.seen == {("in", 0): 9} and found.marker.application == "tsi"


def test_a_store_whose_changelog_holds_its_marker_keeps_it_without_rewriting():
    changelog = MemoryChangelog()
    offset = written(changelog, [entry("e\x1fu")], Marker(1, {}, "mine", "tsi"))
    mirrored = {"seq": 1, "offset": offset, "lineage": "mine", "seen": {}}
    before = len(changelog.logs[SHARD])
    begun = start(changelog, SHARD, {"e\x1fu": entry("e\x1fu")}, None, mirrored)
    assert begun.mirrored.offset == offset and len(changelog.logs[SHARD]) == before


def test_restore_reads_every_owned_shard_once_and_refuses_a_foreign_one(tmp_path):
    changelog = MemoryChangelog(application="shop")
    for index in range(4):
        shard = f"shard-{index:03d}-of-004"
        mirror = changelog.mirror(shard)
        mirror.append(f"k{index}", encode([entry(f"k{index}")]))
        mirror.mark(Marker(1, {}, "l", "shop" if index != 3 else "blog"))
        mirror.acknowledged()
    assert restore(changelog, tmp_path, 4, lambda index: index < 3) == 6  # 3 shards, 2 each
    with pytest.raises(ForeignChangelogError, match="memory\\[3\\]"):
        restore(changelog, tmp_path, 4, None)
