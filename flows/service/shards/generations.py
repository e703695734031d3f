"""Which of a shard's live instances changed when: the cache tier's generations.

A shard's live instances (``shard_store.ShardStore``: the cache over its resting records
and log) are put to rest once no event changed them for a generation, and written to the
log ahead of an epoch's close once the generation that changed them has passed.
``Generations`` keeps those keys: ``touched`` in this generation, ``cooling`` (touched in
the one before, not since), ``settling`` (to put to rest), ``unwritten`` (cooling, to
write), ``saved`` (written by a close, to put to rest) and ``clean`` (written since they
last changed). The store decides when a generation turns and does the writing and the
putting to rest, a budget of keys per call (``ShardStore._settle``).

>>> generations = Generations()
>>> generations.touched.add("e|u1")
>>> generations.turn(0.0, writing=True)
>>> generations.cooling, generations.unwritten
({'e|u1'}, ['e|u1'])
>>> generations.turn(1.0, writing=True)
>>> generations.take_settling(64, {"e|u1": object()})
['e|u1']
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any


class Generations:
    """The keys of a shard's live instances by when they last changed and whether they
    are written since (see the module's docstring). ``touched`` is one set for the
    shard's lifetime: the compiled loop holds it (cleared, never replaced)."""

    def __init__(self) -> None:
        self.touched: set[str] = set()  # instances changed in this generation
        self.cooling: set[str] = set()  # changed in the generation before, not since
        self.settling: list[str] = []  # unchanged for a generation: to put to rest
        self.unwritten: list[str] = []  # cooling, with a log: written a few per call
        self.saved: list[str] = []  # written at an epoch's close: to put to rest, unwritten
        self.clean: set[str] = set()  # written since they last changed
        self.turned = time.monotonic()  # when the generation turned
        self.created = 0  # new instances in this generation

    def turn(self, clock: float, writing: bool) -> None:
        """A new generation, at ``clock`` (``time.monotonic``): what the last one touched
        cools (and, ``writing``, waits to be written), what cooled settles.

        >>> generations = Generations()
        >>> generations.touched.add("k"); generations.clean.add("k")
        >>> generations.turn(0.0, writing=False)
        >>> generations.clean, generations.cooling, generations.unwritten
        (set(), {'k'}, [])
        """
        self.turned, self.created = clock, 0
        self.clean -= self.touched
        self.settling += self.cooling - self.touched
        self.cooling = set(self.touched)
        self.touched.clear()
        if writing:
            self.unwritten = list(self.cooling)

    def wait(self, rest_after: float) -> float | None:
        """Seconds before there is something to settle (0.0: now), given the generation's
        length ``rest_after``; None: nothing waits.

        >>> Generations().wait(1.0) is None
        True
        """
        if self.settling or self.saved:
            return 0.0
        if self.touched or self.cooling:
            wait = self.turned + rest_after - time.monotonic()
            return wait if wait > 0.0 else 0.0
        return None

    def take_settling(self, budget: int, live: Mapping[str, Any]) -> list[str]:
        """At most ``budget`` of the keys to put to rest (the newest), once each: those
        still ``live`` and not touched since."""
        keys, self.settling[-budget:] = self.settling[-budget:], []
        return [k for k in dict.fromkeys(keys) if k not in self.touched and k in live]

    def take_saved(self, budget: int) -> tuple[list[str], int]:
        """At most ``budget`` of the keys a close wrote (the newest), no longer clean: the
        ones still clean and untouched (to put to rest), and how many were taken."""
        keys, self.saved[-budget:] = self.saved[-budget:], []
        clean = [key for key in keys if key in self.clean and key not in self.touched]
        self.clean.difference_update(keys)
        return clean, len(keys)

    def take_unwritten(self, budget: int, live: Mapping[str, Any]) -> list[str]:
        """At most ``budget`` of the keys to write ahead of the close (the newest): those
        still cooling, not clean, and ``live``."""
        keys, self.unwritten[-budget:] = self.unwritten[-budget:], []
        cooling, touched, clean = self.cooling, self.touched, self.clean
        return [
            k for k in keys if k in cooling and k not in touched and k not in clean and k in live
        ]

    def close(self) -> tuple[set[str], set[str]]:
        """An epoch's close: the keys changed since they last settled, and those of them
        not written since (``touched``, or not ``clean``); every generation emptied.

        >>> generations = Generations()
        >>> generations.touched.add("k")
        >>> generations.close(), generations.touched
        (({'k'}, {'k'}), set())
        """
        keys = self.touched | self.cooling | set(self.settling)
        dirty = {key for key in keys if key in self.touched or key not in self.clean}
        self.touched.clear()
        self.cooling.clear()
        self.settling.clear()
        self.unwritten.clear()
        return keys, dirty

    def written(self, keys: list[str]) -> None:
        """``keys`` written by an epoch's close: clean, to put to rest by the calls that
        follow (``saved``)."""
        self.saved += keys
        self.clean.update(keys)
