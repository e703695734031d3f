"""Stream time: how far the input has been served, so that a time to live never runs out
while the service is down or behind (downtime and lag lose nothing that arrives in order).

Each input message carries the time Kafka stamped it with; a ticket's deadline is its
request's time plus the time to live. A ticket expires when the stream has moved past its
deadline: while source partitions have messages left to read, the stream time is the
oldest of the newest times served from each of them (one that has served nothing yet, or
the internal topic's, whose events are served under their input's name, holds it back
entirely); once every partition is caught up (it has read what it held at start and is
within ``CAUGHT_UP_LAG`` messages of its end), it is the wall clock. Until the sources have
said where they stand (their first statistics, a second after start), nothing expires.

>>> clock = StreamClock(wall=lambda: 100.0)
>>> clock.note_served("t", 0, 40.0); clock.note_served("t", 1, 55.0)
>>> clock.note_position("t", 0, caught_up=False); clock.now()  # t[0] is behind
40.0
>>> clock.note_position("u", 0, caught_up=False); clock.now()  # behind, nothing served
-inf
>>> for topic, partition in (("t", 0), ("t", 1), ("u", 0)):
...     clock.note_position(topic, partition, caught_up=True)
>>> clock.now()
100.0
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable


class StreamClock:
    """The stream time of one process (its workers share it)."""

    def __init__(self, wall: Callable[[], float] = time.time) -> None:
        self._wall = wall
        self._served: dict[tuple[str, int], float] = {}  # input partition -> newest time
        self._behind: set[tuple[str, int]] = set()  # source partitions with more to read
        self._known = False  # a source has reported its position
        self._lock = threading.Lock()

    def note_served(self, topic: str, partition: int | None, at: float) -> None:
        """An event of (topic, partition) stamped ``at`` was served."""
        key = (topic, partition or 0)
        if at > self._served.get(key, -math.inf):
            self._served[key] = at

    def note_position(self, topic: str, partition: int, caught_up: bool) -> None:
        """Whether a source partition has read all there is (from its statistics)."""
        with self._lock:
            self._known = True
            if caught_up:
                self._behind.discard((topic, partition))
            else:
                self._behind.add((topic, partition))

    def now(self) -> float:
        """The time the stream has reached."""
        if not self._known:
            return -math.inf
        with self._lock:
            behind = list(self._behind)
        if not behind:
            return self._wall()
        return min(self._served.get(partition, -math.inf) for partition in behind)


STREAM_CLOCK = StreamClock()
