"""The changelog on the real broker: ``tsi topics create`` makes it compacted with one
partition a shard, the start-up check creates a missing one so and refuses one that is
not, a shard's mirror writes to its own partition and is acknowledged with its marker's
offset, and a shard whose recovery directory is gone is rebuilt from it, an instance
over the broker's message limit too (in chunks)."""

from __future__ import annotations

import orjson
import pytest
from confluent_kafka.admin import AdminClient

from flows.service.connectors.kafka_admin import (
    BROKER_DEFAULT,
    BROKER_DEFAULT_MAX_MESSAGE_BYTES,
    TopicError,
    create_topics,
    ensure_changelog,
)
from flows.service.connectors.kafka_changelog import KafkaChangelog
from flows.service.instances.registry import Registry
from flows.service.instances.resting import open_tickets
from flows.service.shards.changelog import MARKER_KEY, Marker, encode, replay
from flows.service.shards.changelog_chunks import base_key
from flows.service.shards.logic import logic_builder
from flows.service.wire.events import Origin, parse_request
from flows.service.wire.keys import shard_of
from flows.testing.kafka_broker import create_topic, unique_topic
from tests.service.test_changelog import build, events_of, held, run
from tests.service.test_topics import create_with_config, topic_config


def test_topics_create_makes_the_changelog_compacted_one_partition_a_shard(kafka_bootstrap):
    name = unique_topic("changelog")
    [line] = create_topics([kafka_bootstrap], {}, [name], changelog=(name, 8))
    assert line.startswith(f"{name}: created, 8 partitions")
    assert topic_config(kafka_bootstrap, name, "cleanup.policy") == "compact"
    assert int(topic_config(kafka_bootstrap, name, "min.compaction.lag.ms")) > 0
    assert ensure_changelog([kafka_bootstrap], {}, name, 8, 30.0) is None  # exists, fit
    [again] = create_topics([kafka_bootstrap], {}, [name], changelog=(name, 8))
    assert again.startswith(f"{name}: exists")


def test_the_start_up_check_refuses_a_changelog_of_another_shape(kafka_bootstrap):
    uncompacted = create_topic(kafka_bootstrap, unique_topic("changelog"), 4)
    with pytest.raises(TopicError, match=r"cleanup\.policy=delete, not compact"):
        ensure_changelog([kafka_bootstrap], {}, uncompacted, 4, 30.0)
    compacted = create_with_config(
        kafka_bootstrap, unique_topic("changelog"), {"cleanup.policy": "compact"}, 3
    )
    with pytest.raises(TopicError, match="has 3 partitions, not one a shard \\(4\\)"):
        ensure_changelog([kafka_bootstrap], {}, compacted, 4, 30.0)
    with pytest.raises(TopicError, match="has 3 partitions"):
        create_topics([kafka_bootstrap], {}, [compacted], changelog=(compacted, 4))
    with pytest.raises(TopicError, match=f"changelog topic {compacted} has 3 .*--changelog-topic"):
        ensure_changelog([kafka_bootstrap], {}, compacted, 4, 30.0)


def test_the_start_up_check_creates_a_missing_changelog(kafka_bootstrap):
    absent = unique_topic("absent")
    made = ensure_changelog([kafka_bootstrap], {}, absent, 4, 30.0)
    assert made is not None and made.startswith(f"{absent}: created, 4 partitions")
    assert topic_config(kafka_bootstrap, absent, "cleanup.policy") == "compact"
    assert int(topic_config(kafka_bootstrap, absent, "min.compaction.lag.ms")) > 0
    assert ensure_changelog([kafka_bootstrap], {}, absent, 4, 30.0) is None
    # a member that found it missing while another created it: the broker's replication
    # is what it asked for, not a contradiction
    again = create_topics(
        [kafka_bootstrap], {}, [absent], replication_factor=BROKER_DEFAULT, changelog=(absent, 4)
    )
    assert again == [made.replace("created", "exists", 1)]


def test_a_mirror_writes_its_shards_partition_and_reads_back_to_the_high_watermark(
    kafka_bootstrap,
):
    name = unique_topic("changelog")
    create_topics([kafka_bootstrap], {}, [name], changelog=(name, 4))
    changelog = KafkaChangelog([kafka_bootstrap], name)
    shard = "shard-002-of-004"
    assert changelog.read(shard) == []
    mirror = changelog.mirror(shard)
    assert mirror.acknowledged() is None  # nothing sent
    mirror.append("e\x1fu1", encode(["one"]))
    mirror.append("e\x1fu2", None)
    mirror.mark(Marker(1, {("in", 0): 5}, "x"))
    assert mirror.acknowledged() == 2  # the marker's offset
    mirror.append("e\x1fu1", encode(["two"]))
    assert mirror.acknowledged() is None
    records = changelog.read(shard)
    assert [(offset, key) for offset, key, _ in records] == [
        (0, "e\x1fu1"),
        (1, "e\x1fu2"),
        (2, MARKER_KEY),
        (3, "e\x1fu1"),
    ]
    assert records[1][2] is None and [k for _, k, _ in changelog.read(shard, after=2)] == [
        "e\x1fu1"
    ]
    assert changelog.read("shard-001-of-004") == []  # its own partition only
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    assert len(admin.list_topics(name, timeout=30).topics[name].partitions) == 4


def test_a_shard_whose_directory_is_gone_is_rebuilt_from_the_kafka_changelog(
    kafka_bootstrap, tmp_path
):
    name = unique_topic("changelog")
    create_topics([kafka_bootstrap], {}, [name], changelog=(name, 1))
    changelog = KafkaChangelog([kafka_bootstrap], name)
    events = events_of([("request", u % 5, 0.0) for u in range(20)])
    first = build(tmp_path / "lost", changelog)
    [(last, _)] = run(first, events, {len(events) - 1}, set())
    found = replay(changelog.read(first.store.shard))
    assert found.marker.seq == last["changelog"]["seq"] and found.tail == []
    rebuilt = build(tmp_path / "new", KafkaChangelog([kafka_bootstrap], name))
    assert held(rebuilt) == held(first) and rebuilt.handle([]) == []


def test_an_instance_of_100k_open_tickets_closes_epochs_and_is_rebuilt_exactly(
    kafka_bootstrap, tmp_path
):
    """One shared instance holding 10^5 selections awaiting feedback: its record is far
    over the broker's default message limit; every epoch's close goes through (in
    chunks), and a restart whose recovery directory is gone rebuilds it exactly."""
    name = unique_topic("changelog")
    create_topics([kafka_bootstrap], {}, [name], changelog=(name, 1))
    assert topic_config(kafka_bootstrap, name, "max.message.bytes") == str(
        BROKER_DEFAULT_MAX_MESSAGE_BYTES
    )
    first = shared_logic(tmp_path / "lost", KafkaChangelog([kafka_bootstrap], name))
    for batch in range(4):
        first.handle(shared_requests(batch * 25_000, (batch + 1) * 25_000))
        first.snapshot()
    [only] = first.store._all_entries()
    assert open_tickets(only) == 100_000
    records = KafkaChangelog([kafka_bootstrap], name).read(first.store.shard)
    assert any(base_key(key) == "big" != key for _, key, _ in records)  # in chunks
    rebuilt = shared_logic(tmp_path / "new", KafkaChangelog([kafka_bootstrap], name))
    [again] = rebuilt.store._all_entries()
    assert (again.kind, again.data) == (only.kind, only.data) and open_tickets(again) == 100_000


def shared_logic(store, changelog):
    """The shard of experiment "big" (one bandit for all units), started."""
    logic = logic_builder(
        BIG, clock=lambda: 1_000.0, store=store, rest_after=0.0, changelog=changelog, shards=1
    )(None)
    logic.store._start(shard_of("big", shards=1), None)
    return logic


def shared_requests(start, stop):
    """Requests of units ``start`` to ``stop`` (each its own selection) to experiment big."""
    return [
        (
            "big",
            BIG["big"],
            parse_request(
                orjson.dumps({"experiment": "big", "unit": f"u{i}", "request_id": f"r{i}"}),
                Origin("in", 0, i, 1_000.0),
            ),
        )
        for i in range(start, stop)
    ]


BIG = Registry.from_toml('[experiments.big]\narms = ["a", "b", "c"]\nfeedback_ttl = 86400\n')


@pytest.mark.parametrize("alone", [False, True])
def test_a_record_the_broker_refuses_fails_the_close_that_sent_it(kafka_bootstrap, alone):
    """Once a shard's first marker has landed its records go without a delivery callback;
    one the broker refuses (over the topic's max.message.bytes, sent whole because the
    changelog was told a larger limit) still fails the close, whether it shares the
    marker's batch or went to the broker alone (``alone``) before the marker."""
    name = create_with_config(
        kafka_bootstrap,
        unique_topic("changelog"),
        {"cleanup.policy": "compact", "max.message.bytes": "20000"},
        2,
    )
    changelog = KafkaChangelog([kafka_bootstrap], name, max_message_bytes=1_000_000)
    shard = "shard-001-of-002"
    mirror = changelog.mirror(shard)
    mirror.append("e\x1fu1", encode(["one"]))
    mirror.mark(Marker(1, {}, "x"))
    assert changelog.settle([mirror]) == [1]  # a mirror's first epoch: each record reported
    mirror.append("e\x1fu2", encode(["x" * 100_000]))  # over the topic's limit
    if alone:
        changelog.producer().flush(30)
    mirror.append("e\x1fu3", encode(["three"]))
    mirror.mark(Marker(2, {}, "x"))
    # in the marker's batch, the marker's own report fails; alone, the records the
    # marker follows are fewer than those sent (``KafkaMirror``)
    why = "some were refused" if alone else "MSG_SIZE_TOO_LARGE"
    with pytest.raises(RuntimeError, match=rf"changelog records of {name}\[1\].*{why}"):
        changelog.settle([mirror])
