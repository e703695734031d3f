"""A Kafka input partition's check of its topic's partition count: librdkafka's statistics
list only the assigned partition until the topic's metadata arrives, so fewer partitions
than the flow was built with is no change (a topic never loses partitions); more is, and
asks for a clean stop and a restart."""

import json

import pytest

from flows.service.connectors.kafka_partition import (
    ObservedPartition,
    Reading,
    check_partition_count,
)
from flows.service.connectors.stopping import Stop


@pytest.fixture(autouse=True)
def no_stop():
    Stop.reset()
    yield
    Stop.reset()


def listed(count):
    """librdkafka's statistics of a topic's ``count`` partitions (and its -1 queue)."""
    return {str(p): {"partition": p, "hi_offset": -1} for p in range(-1, count)}


def test_one_partition_listed_for_a_flow_built_with_32_is_no_stop():
    check_partition_count("events", listed(1), 32)
    assert not Stop.asked(), Stop.reason


@pytest.mark.parametrize("count", [0, 1, 31, 32])
def test_no_more_partitions_than_built_is_no_stop(count):
    check_partition_count("events", listed(count), 32)
    assert not Stop.asked(), Stop.reason


def test_33_partitions_for_a_flow_built_with_32_stop_it_asking_for_a_restart():
    check_partition_count("events", listed(33), 32)
    assert Stop.restart
    assert Stop.reason == (
        "topic events has 33 partitions, the flow was built with 32: ending cleanly; "
        "restart to read them"
    )


def test_a_topic_not_listed_at_build_time_is_no_stop():
    check_partition_count("events", listed(33), None)
    assert not Stop.asked(), Stop.reason


def test_a_partition_reading_statistics_of_its_one_assigned_partition_goes_on():
    """Through the partition's statistics callback, as librdkafka calls it."""
    config = {"bootstrap.servers": "127.0.0.1:9", "group.id": "test-partition-count"}
    partition = ObservedPartition(config, "events", 0, 0, Reading(), built_with=32)
    try:
        stats = {"topics": {"events": {"partitions": listed(1)}}}
        partition._process_stats(json.dumps(stats))
        assert not Stop.asked(), Stop.reason
        stats["topics"]["events"]["partitions"] = listed(33)
        partition._process_stats(json.dumps(stats))
        assert Stop.restart and "has 33 partitions" in Stop.reason
    finally:
        partition.close()
