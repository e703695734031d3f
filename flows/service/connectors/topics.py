"""The Kafka topics a service uses, by role, and Kafka's rule for a topic's name: a leaf
module (no Bytewax, no engine), which the client and the gateway read too.

>>> Topics().repartitioned, Topics(events="ev").repartitioned
(True, False)
>>> bool(TOPIC_NAME.fullmatch("tsi.requests")), bool(TOPIC_NAME.fullmatch("a b"))
(True, False)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["TOPIC_NAME", "Topics"]

#: Kafka's rule for topic names.
TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")


@dataclass(frozen=True)
class Topics:
    """Kafka topic names; with ``events`` set, requests and feedback share that one topic.
    Otherwise the service copies both into ``internal`` (keyed by instance) and serves from
    that one ordered log; ``internal=None`` serves straight from the two topics."""

    requests: str = "tsi.requests"
    feedback: str = "tsi.feedback"
    selections: str = "tsi.selections"
    dead_letters: str = "tsi.dlq"
    events: str | None = None
    internal: str | None = "tsi.events.internal"
    changelog: str | None = None  # each shard's log mirrored (``kafka_changelog``)

    @property
    def repartitioned(self) -> bool:
        """Whether requests and feedback meet in the internal topic."""
        return self.events is None and self.internal is not None
