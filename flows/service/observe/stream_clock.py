"""Stream time: how far the input has been served, so that a time to live never runs out
while the service is down or behind (downtime and lag lose nothing that arrives in order).

Each input message carries the time Kafka stamped it with; a ticket's deadline is its
request's time plus the time to live. A ticket expires when the stream has moved past its
deadline. Each source partition of the process is in one of three positions:

- **caught up**: it has read what it held at start and is within ``CAUGHT_UP_LAG``
  messages of its end (an empty partition is caught up): it holds nothing back;
- **behind**: it has messages left to read: the stream time is at most the newest time
  served from it (one that has served nothing yet, or the internal topic's, whose events
  are served under their input's name, holds it back entirely);
- **read, not served**: an input partition's newest message read is newer than the
  newest served from it (on its way through the dataflow, or through the internal topic):
  it holds the stream time at the newest time served from it until that message is
  served, or for ``idle_after`` seconds after the read (a message refused as a dead
  letter is never served);
- **no position**: its end is not known yet (a partition registers before its first
  statistics; librdkafka reports an empty partition's end only after its first fetch). It
  holds the stream time back for at most ``idle_after`` seconds, then counts as idle, as a
  Flink source split does after its idleness timeout: an empty or silent partition can
  never stop expiry for good.

When nothing holds it back the stream time is the wall clock. ``holding`` says what holds
it back and since when it has not moved, for ``/ready`` and the metrics.

>>> now = [100.0]
>>> clock = StreamClock(wall=lambda: now[0], idle_after=30.0)
>>> clock.expect("t", 0); clock.expect("t", 1)
>>> clock.now()  # neither has said where it stands
-inf
>>> clock.note_served("t", 0, 40.0); clock.note_position("t", 0, caught_up=False)
>>> clock.note_position("t", 1, caught_up=True); clock.now()  # t[0] is behind
40.0
>>> clock.note_position("t", 0, caught_up=None); now[0] = 131.0  # t[0]: no position
>>> clock.now()  # for longer than idle_after: idle
131.0
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

#: Seconds a partition without a known position may hold the stream time back.
IDLE_AFTER = 30.0

CAUGHT_UP, BEHIND, NO_POSITION = "caught up", "behind", "no position"
IN_FLIGHT = "read, not served"


@dataclass(frozen=True)
class Hold:
    """What holds the stream time back: the partitions and why, the stream time, and the
    wall time since which it has not moved."""

    partitions: tuple[tuple[str, int, str], ...]  # (topic, partition, position)
    stream_time: float
    still_since: float

    def describe(self) -> str:
        """One line: ``expiry held back by t[0] (behind), u[1] (no position)``."""
        shown = ", ".join(f"{t}[{p}] ({why})" for t, p, why in self.partitions[:5])
        more = len(self.partitions) - 5
        return "expiry held back by " + shown + (f" and {more} more" if more > 0 else "")


class StreamClock:
    """The stream time of one process (its workers share it)."""

    def __init__(
        self, wall: Callable[[], float] = time.time, idle_after: float = IDLE_AFTER
    ) -> None:
        self._wall = wall
        self.idle_after = idle_after
        self._served: dict[tuple[str, int], float] = {}  # input partition -> newest time
        # input partition -> (newest time read from it, wall time then)
        self._read: dict[tuple[str, int], tuple[float, float]] = {}
        self._known = False  # a source partition has registered or reported
        # source partition -> (position, wall time it took that position)
        self._positions: dict[tuple[str, int], tuple[str, float]] = {}
        self._reached = (-math.inf, wall())  # (the newest stream time, when it was reached)
        self._lock = threading.Lock()

    def expect(self, topic: str, partition: int) -> None:
        """A source partition of this process starts: it has no position yet."""
        with self._lock:
            self._known = True
            self._positions[(topic, partition)] = (NO_POSITION, self._wall())

    def forget(self, topic: str, partition: int) -> None:
        """A source partition closed: it holds nothing back any more."""
        with self._lock:
            self._positions.pop((topic, partition), None)

    def note_served(self, topic: str, partition: int | None, at: float) -> None:
        """An event of (topic, partition) stamped ``at`` was served."""
        key = (topic, partition or 0)
        if at > self._served.get(key, -math.inf):
            self._served[key] = at

    def note_read(self, topic: str, partition: int | None, at: float) -> None:
        """A message of input (topic, partition) stamped ``at`` was read: it is served
        later (``note_served``)."""
        key = (topic, partition or 0)
        old = self._read.get(key)
        if old is None or at > old[0]:
            self._read[key] = (at, self._wall())

    def note_position(self, topic: str, partition: int, caught_up: bool | None) -> None:
        """Where a source partition stands (from its statistics): caught up, behind
        (False), or not known (None)."""
        position = NO_POSITION if caught_up is None else CAUGHT_UP if caught_up else BEHIND
        with self._lock:
            self._known = True
            old = self._positions.get((topic, partition))
            if old is None or old[0] != position:
                self._positions[(topic, partition)] = (position, self._wall())

    def now(self) -> float:
        """The time the stream has reached."""
        return self._reach()[0]

    def holding(self) -> Hold | None:
        """What holds the stream time back now, or None when it is the wall clock."""
        reached, holding = self._reach()
        if not holding:
            return None
        return Hold(tuple(holding), reached, self._reached[1])

    def _reach(self) -> tuple[float, list[tuple[str, int, str]]]:
        """The stream time and what holds it back (noting when it last moved)."""
        if not self._known:  # no source has started: nothing can be said yet
            return -math.inf, []
        wall = self._wall()
        holding = self._holding(wall)
        reached = wall if not holding else min(self._served.get(p[:2], -math.inf) for p in holding)
        if reached > self._reached[0]:
            self._reached = (reached, wall)
        return reached, holding

    def _holding(self, wall: float) -> list[tuple[str, int, str]]:
        with self._lock:
            positions = list(self._positions.items())
        read = list(self._read.items())
        holding = [
            (topic, partition, position)
            for (topic, partition), (position, since) in positions
            if position == BEHIND or (position == NO_POSITION and wall - since < self.idle_after)
        ]
        holding += [
            (topic, partition, IN_FLIGHT)
            for (topic, partition), (at, when) in read
            if at > self._served.get((topic, partition), -math.inf)
            and wall - when < self.idle_after
        ]
        return sorted(holding)


STREAM_CLOCK = StreamClock()
