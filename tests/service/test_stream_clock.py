"""Stream time: partitions behind hold it back, partitions without a position only for the
idle time, and readiness says what holds it back and fails when it stays still."""

import math

from flows.service.observe.metrics import Readiness
from flows.service.observe.stream_clock import StreamClock


def clock_at(t0=1000.0, idle_after=30.0):
    now = [t0]
    return StreamClock(wall=lambda: now[0], idle_after=idle_after), now


def test_nothing_expires_before_every_partition_has_said_where_it_stands():
    clock, now = clock_at()
    clock.expect("req", 0)
    clock.expect("fb", 0)
    clock.note_position("req", 0, caught_up=True)
    assert clock.now() == -math.inf  # fb[0] has not reported: its backlog may hold feedback
    clock.note_position("fb", 0, caught_up=True)
    assert clock.now() == now[0]


def test_a_partition_without_a_position_is_idle_after_the_idle_time_and_no_sooner():
    clock, now = clock_at(idle_after=30.0)
    clock.expect("fb", 0)
    clock.note_position("fb", 0, caught_up=None)
    now[0] += 29.9
    assert clock.now() == -math.inf
    hold = clock.holding()
    assert hold is not None and hold.partitions == (("fb", 0, "no position"),)
    now[0] += 0.2
    assert clock.now() == now[0]
    assert clock.holding() is None


def test_a_partition_behind_holds_the_clock_for_as_long_as_it_is_behind():
    clock, now = clock_at()
    clock.expect("fb", 0)
    clock.note_served("fb", 0, 500.0)
    clock.note_position("fb", 0, caught_up=False)
    now[0] += 3600.0  # hours of lag lose no feedback
    assert clock.now() == 500.0
    clock.note_served("fb", 0, 700.0)
    assert clock.now() == 700.0
    clock.note_position("fb", 0, caught_up=True)
    assert clock.now() == now[0]


def test_a_reported_position_that_changes_back_to_unknown_restarts_the_idle_time():
    clock, now = clock_at(idle_after=10.0)
    clock.expect("fb", 0)
    clock.note_position("fb", 0, caught_up=True)
    now[0] += 100.0
    clock.note_position("fb", 0, caught_up=None)
    assert clock.now() == -math.inf  # nothing served: held for the idle time
    now[0] += 10.0
    assert clock.now() == now[0]


def test_a_closed_partition_holds_nothing_back():
    clock, now = clock_at()
    clock.expect("fb", 0)
    clock.note_position("fb", 0, caught_up=False)
    clock.forget("fb", 0)
    assert clock.now() == now[0]


def test_readiness_names_what_holds_expiry_and_fails_once_the_stream_time_stays_still():
    clock, now = clock_at(idle_after=1e9)
    readiness = Readiness(60.0, lambda: now[0], stream=clock)
    readiness.note_epoch()
    readiness.note_broker(True)
    clock.expect("fb", 2)
    clock.note_position("fb", 2, caught_up=False)
    ready, reason = readiness.status()
    assert ready and "expiry held back by fb[2] (behind)" in reason
    now[0] += 61.0
    readiness.note_epoch()
    readiness.note_broker(True)
    ready, reason = readiness.status()
    assert not ready
    assert "expiry held back by fb[2] (behind)" in reason and "still for 61 s" in reason


def test_readiness_stays_ready_while_a_backlog_is_read_and_the_stream_time_moves():
    clock, now = clock_at()
    readiness = Readiness(60.0, lambda: now[0], stream=clock)
    clock.expect("fb", 0)
    clock.note_position("fb", 0, caught_up=False)
    for minute in range(10):
        now[0] += 59.0
        clock.note_served("fb", 0, 100.0 + minute)
        readiness.note_epoch()
        readiness.note_broker(True)
        ready, reason = readiness.status()
        assert ready, reason


def test_an_input_read_and_not_yet_served_holds_the_clock_until_it_is():
    clock, now = clock_at(idle_after=30.0)
    clock.expect("fb", 0)
    clock.note_position("fb", 0, caught_up=True)  # its newest message read, not served
    clock.note_read("fb", 0, 900.0)
    assert clock.now() == -math.inf
    assert clock.holding().partitions == (("fb", 0, "read, not served"),)
    clock.note_served("fb", 0, 850.0)
    assert clock.now() == 850.0
    clock.note_served("fb", 0, 900.0)  # every copy served
    assert clock.now() == now[0]


def test_a_message_read_and_never_served_holds_only_for_the_idle_time():
    clock, now = clock_at(idle_after=30.0)
    clock.expect("fb", 0)
    clock.note_position("fb", 0, caught_up=True)
    clock.note_read("fb", 0, 900.0)  # e.g. a dead letter
    now[0] += 29.0
    assert clock.now() == -math.inf
    now[0] += 1.0
    assert clock.now() == now[0]


def test_nothing_expires_before_any_source_has_started():
    clock, _ = clock_at()
    assert clock.now() == -math.inf  # e.g. a wake-up before the Kafka partitions are built
    clock.expect("fb", 0)
    clock.note_position("fb", 0, caught_up=True)
    assert clock.now() > 0
