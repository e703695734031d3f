"""Members: independent service processes that share the work by partitions, the one rule.

A service of N members (``tsi run --members N --member K``, each an ordinary single-process
Bytewax flow with its own recovery directory) talk only through Kafka: partition p of any
input topic and of the internal topic belongs to member p % N. A member reads only its
partitions; the copies it makes go to the internal partition of their shard
(``_records.internal_copy``), so each shard's events meet in one internal partition, read
by one member, which holds that shard whole. One member dying stops only its partitions.

>>> [p for p in range(4) if Members(2, 1).owns(p)]
[1, 3]
>>> Members().owns(5)
True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from flows.service.wire.keys import internal_partition


class MembersError(ValueError):
    """A member's index outside its count, or topics with too few partitions: one line."""


@dataclass(frozen=True)
class Members:
    """``count`` members, this one ``index`` (in [0, count))."""

    count: int = 1
    index: int = 0

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise MembersError(
                f"member {self.index} of {self.count}: a member's index is in [0, {self.count})"
            )

    def owns(self, partition: int) -> bool:
        """Whether partition ``partition`` (of any topic the service reads) is this
        member's."""
        return partition % self.count == self.index

    def holds(self, shard: int, partitions: int) -> bool:
        """Whether shard index ``shard`` is this member's: the owner of the internal
        partition its events meet in (``keys.internal_partition`` of the internal topic's
        ``partitions``; 0, copies placed by key: a service alone, every shard its own).
        A member's recovery store may hold shards of an earlier layout that another member
        now holds: they lie dormant (``ShardStore``).

        >>> Members(2, 1).holds(7, 4), Members(2, 1).holds(6, 4), Members().holds(6, 0)
        (True, False, True)
        """
        return partitions == 0 or self.owns(internal_partition(shard, partitions))

    def check_partitions(self, partitions: Mapping[str, int]) -> None:
        """Refuse (``MembersError`` naming the topic) a topic read by the members with
        fewer partitions than members: a member would own none of it.

        >>> try:
        ...     Members(3, 0).check_partitions({"tsi.requests": 2})
        ... except MembersError as exc:
        ...     print(str(exc)[:53])
        topic tsi.requests has 2 partitions, fewer than the 3
        """
        for topic, count in partitions.items():
            if count < self.count:
                raise MembersError(
                    f"topic {topic} has {count} partitions, fewer than the {self.count} "
                    "members: add partitions (kafka-topics --alter) or run fewer members"
                )


#: A service alone: one member, every partition its own.
ALONE = Members()
