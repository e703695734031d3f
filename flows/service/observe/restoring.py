"""Which of the shards this process holds are restored: what ``/ready`` waits for.

A start names the shards this process holds (``expect``: ``runtime.restore`` does, before
the flow runs); each shard notes itself once its state is loaded and it can serve
without more restore work (``note``: ``ShardStore`` does, at its start). Until every
held shard has, readiness names the count (``problem``). A process that named no shards
(a Bytewax cluster places them itself, a flow without a changelog) never waits here.

>>> r = Restoring()
>>> r.problem() is None  # nothing expected
True
>>> r.expect(["shard-000-of-002", "shard-001-of-002"])
>>> r.note("shard-001-of-002"); r.problem()
'restoring: 1 of 2 shards'
>>> r.note("shard-000-of-002"); r.problem() is None, r.counts()
(True, (2, 2))
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

__all__ = ["RESTORING", "Restoring"]


class Restoring:
    """The shards a start expects restored (``held``) and those that are (``restored``);
    any thread may note one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.held: frozenset[str] | None = None  # None: nothing expected
        self.restored: set[str] = set()

    def expect(self, shards: Iterable[str]) -> None:
        """A start: ``shards`` are this process's, none restored yet."""
        with self._lock:
            self.held = frozenset(shards)
            self.restored = set()

    def note(self, shard: str) -> None:
        """Shard ``shard`` is restored (one this process does not expect is ignored)."""
        with self._lock:
            if self.held is not None and shard in self.held:
                self.restored.add(shard)

    def counts(self) -> tuple[int, int] | None:
        """(restored, held), or None when nothing is expected."""
        with self._lock:
            if self.held is None:
                return None
            return len(self.restored), len(self.held)

    def problem(self) -> str | None:
        """What keeps the process from ready here, in one line, or None."""
        counts = self.counts()
        if counts is None or counts[0] >= counts[1]:
            return None
        return f"restoring: {counts[0]} of {counts[1]} shards"


#: the process's restore, fed by ``runtime.restore`` and the shards' starts
RESTORING = Restoring()
