"""The one back-off helper every start-up call to the brokers goes through (``retried``):
retriable errors are asked again with a growing pause until one deadline, others fail at
once; the changelog's reads ask again on the same errors (``transient``). A fake clock:
nothing here waits."""

import concurrent.futures

import pytest
from confluent_kafka import KafkaError, KafkaException

from flows.service.connectors import kafka_changelog
from flows.service.connectors.kafka_admin import (
    BACKOFF_MOST_S,
    LEADER_MOVING,
    Deadline,
    DeadlineError,
    NotReadyError,
    TopicError,
    retried,
    transient,
)
from flows.service.connectors.kafka_changelog import KafkaChangelog
from flows.service.shards.changelog import ChangelogError


class Clock:
    """A monotonic clock that moves only when ``sleep`` is called; the pauses noted."""

    def __init__(self) -> None:
        self.now = 100.0
        self.pauses: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


def failing(*errors):
    """A call raising ``errors`` in turn, then answering "done"; the time left it got."""
    pending = list(errors)
    lefts: list[float] = []

    def call(left: float) -> str:
        lefts.append(left)
        if pending:
            raise pending.pop(0)
        return "done"

    return call, lefts


def kafka(code: int) -> KafkaException:
    return KafkaException(KafkaError(code))


def test_retriable_errors_are_asked_again_with_a_doubling_pause():
    clock = Clock()
    call, lefts = failing(
        kafka(KafkaError.NOT_LEADER_FOR_PARTITION),
        kafka(KafkaError.LEADER_NOT_AVAILABLE),
        kafka(KafkaError.UNKNOWN_TOPIC_OR_PART),
        kafka(KafkaError._TIMED_OUT),
        kafka(KafkaError._TRANSPORT),
        concurrent.futures.TimeoutError(),
        NotReadyError("partitions without a leader in t"),
    )
    assert retried(call, "reading t", Deadline(60.0, clock), sleep=clock.sleep) == "done"
    assert clock.pauses == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    assert len(lefts) == 8
    assert lefts[0] == 60.0 and lefts[-1] == pytest.approx(60.0 - sum(clock.pauses))


def test_the_deadline_ends_the_retries_in_one_line_naming_the_last_error_and_timeout():
    clock = Clock()
    call, lefts = failing(*[kafka(KafkaError._TRANSPORT)] * 12)
    with pytest.raises(DeadlineError) as info:
        retried(call, "cannot read topic t's offsets", Deadline(5.0, clock), sleep=clock.sleep)
    message = str(info.value)
    assert message.startswith("cannot read topic t's offsets: ")
    assert message.endswith("(retried for 5 s)") and "\n" not in message
    assert "Local: Broker transport failure" in message  # the last error seen
    assert clock.now == pytest.approx(105.0)  # not a pause past the deadline
    assert max(clock.pauses) <= BACKOFF_MOST_S
    assert all(left > 0 for left in lefts)


def test_a_non_retriable_error_fails_at_once():
    clock = Clock()
    call, lefts = failing(kafka(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    with pytest.raises(TopicError) as info:
        retried(call, "cannot create topic t", Deadline(30.0, clock), sleep=clock.sleep)
    assert not isinstance(info.value, DeadlineError)
    assert str(info.value).startswith("cannot create topic t: ")
    assert len(lefts) == 1 and clock.pauses == []


def test_errors_other_than_the_brokers_pass_through():
    call, lefts = failing(ValueError("a bug"))
    with pytest.raises(ValueError, match="a bug"):
        retried(call, "x", 5.0)
    assert len(lefts) == 1


def test_one_deadline_is_shared_by_the_calls_given_it():
    clock = Clock()
    deadline = Deadline(10.0, clock)
    first, _ = failing(*[kafka(KafkaError._TIMED_OUT)] * 4)
    retried(first, "first", deadline, sleep=clock.sleep)
    second, lefts = failing()
    retried(second, "second", deadline, sleep=clock.sleep)
    assert lefts == [pytest.approx(10.0 - sum(clock.pauses))]
    assert Deadline.of(deadline) is deadline


@pytest.mark.parametrize("seconds", [0, -1.0])
def test_a_deadline_needs_time(seconds):
    with pytest.raises(ValueError, match=repr(seconds)):
        Deadline(seconds)


@pytest.mark.parametrize("code", sorted(LEADER_MOVING))
def test_a_leader_moving_is_asked_again_though_the_client_does_not_flag_it(code):
    error = KafkaError(code)
    assert transient(error)
    clock = Clock()
    call, lefts = failing(KafkaException(error))
    assert retried(call, "reading t", Deadline(60.0, clock), sleep=clock.sleep) == "done"
    assert len(lefts) == 2 and clock.pauses == [0.1]


def test_the_changelog_reads_again_after_a_leader_epoch_error_and_refuses_others(
    monkeypatch,
):
    """A restarted member read its changelog's ends while the partition's leader epoch
    moved ("Leader epoch is newer than broker epoch"): the read is asked again, not
    failed; an error that never passes fails at once, naming it."""
    monkeypatch.setattr(kafka_changelog.time, "sleep", lambda seconds: None)
    changelog = KafkaChangelog(["127.0.0.1:1"], "app-changelog")
    answers = [KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.FENCED_LEADER_EPOCH, None]
    asked: list[dict[int, int]] = []

    def read_all(wanted):
        asked.append(dict(wanted))
        code = answers.pop(0)
        if code is not None:
            raise KafkaException(KafkaError(code))
        return {p: [(5, "k", b"v")] for p in wanted}

    monkeypatch.setattr(changelog, "_read_all", read_all)
    assert changelog.read("shard-003-of-008", after=4) == [(5, "k", b"v")]
    assert asked == [{3: 4}] * 3

    def refused(wanted):
        raise KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))

    monkeypatch.setattr(changelog, "_read_all", refused)
    with pytest.raises(ChangelogError, match=r"app-changelog.*[Aa]uthoriz"):
        changelog.read("shard-003-of-008", after=4)
