"""The committed state of members' recovery directories, each shard from the member holding it.

Members (``tsi run --members N --member K``) keep a recovery directory each, a whole
single-process store. After a rescale by restart a member's store may still hold shards
of an earlier layout that another member holds now (kept dormant, ``ShardStore``): stale
copies. So each shard is taken from the one directory whose member holds it in the layout
that directory last served as (``recovery.last_layout``, ``Members.holds``), and so is
each input partition (``Members.owns``). Two directories holding one shard are refused,
and so is a shard held by none (a member's directory left out): an export never mixes
layouts, never takes a dormant copy, never leaves out a shard silently.

>>> alone, second = MemberDir(Path("a"), Members(), 32), MemberDir(Path("b"), Members(2, 1), 4)
>>> [alone.holds(s) for s in (0, 1)], [second.holds(s) for s in (0, 1)]
([True, True], [False, True])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flows.service.connectors.members import Members
from flows.service.instances.resting import Entry
from flows.service.runtime.recovery import (
    NotOneClusterError,
    _committed_steps,
    committed_entries,
    last_layout,
    resumed_inputs,
    resumed_partitions,
    shard_store,
)
from flows.service.shards.shard_log import shards_in
from flows.service.wire.keys import (
    DEFAULT_SHARDS,
    internal_partition,
    shard_index,
    shard_layout,
    shard_name,
)

INTERNAL_STEP = "internal_in"  # the internal topic's source (``dataflow``): one key a partition


@dataclass(frozen=True)
class MemberDir:
    """A member's recovery directory: the member it last served as (``layout``), the
    internal topic's partition count then (``partitions``: the partitions its store lists)
    and its store's shard count (``shards``)."""

    directory: Path
    layout: Members
    partitions: int
    shards: int = DEFAULT_SHARDS

    def holds(self, shard: int) -> bool:
        """Whether this directory's member holds shard index ``shard``."""
        return self.layout.holds(shard, self.partitions)

    def holds_key(self, key: str) -> bool:
        """Whether this directory's member holds instance ``key``'s shard."""
        return self.holds(shard_index(key, self.shards))

    def owns_input(self, where: str) -> bool:
        """Whether this directory's member reads input position ``where``
        (``"step/PARTITION-topic"``, ``recovery.committed_inputs``)."""
        return self.layout.owns(input_partition(where))

    def __str__(self) -> str:
        return f"{self.directory} (member {self.layout.index} of {self.layout.count})"


def input_partition(where: str) -> int:
    """The partition of input position ``where`` (``"step/PARTITION-topic"``).

    >>> input_partition("tsi.requests_in.kafka_input/3-tsi.requests")
    3
    """
    return int(where.rpartition("/")[2].partition("-")[0])


def member_dir(directory: Path, flow_id: str = "tsi") -> MemberDir:
    """What ``directory`` last served as. The internal topic's partitions are those its
    store lists (a member lists them all, reading its own); a store that never ran (made
    by ``tsi state import``) lists none and is taken to have as many as shards, the layout
    ``tsi topics create`` makes. The shard count is its shards' (``shard-NNN-of-MMM``,
    ``keys.shard_layout``), else ``keys.DEFAULT_SHARDS``; a member's store of several is refused
    (``NotOneClusterError``: which of them it holds cannot be told; a service alone holds
    all it has)."""
    steps = _committed_steps(resumed_partitions([directory]), f"{flow_id}.{INTERNAL_STEP}")
    listed = {key for _, key, _ in steps}
    layout = last_layout(directory)
    layouts = map(shard_layout, shards_in(shard_store(directory)))
    counts = {str(layout[1]) for layout in layouts if layout is not None}
    if len(counts) > 1 and layout.count > 1:
        raise NotOneClusterError(
            f"recovery directory {directory} (member {layout.index} of {layout.count}) holds "
            f"shards of {len(counts)} shard counts ({', '.join(sorted(counts))})"
        )
    shards = int(counts.pop()) if len(counts) == 1 else DEFAULT_SHARDS
    return MemberDir(directory, layout, len(listed) or shards, shards)


def check_claims(dirs: Sequence[MemberDir]) -> None:
    """Refuse (``NotOneClusterError``, one line naming them) directories of different
    shard counts, a shard two directories hold and a shard none holds (a member's
    directory left out)."""
    counts = sorted({(each.shards, str(each.directory)) for each in dirs})
    if len({count for count, _ in counts}) > 1:
        shown = ", ".join(f"{where} of {count}" for count, where in counts)
        raise NotOneClusterError(f"the recovery directories hold different shard counts ({shown})")
    shards = dirs[0].shards
    for shard in range(shards):
        claims = [each for each in dirs if each.holds(shard)]
        if len(claims) > 1:
            raise NotOneClusterError(
                f"{shard_name(shard, shards)} is held by both {claims[0]} and {claims[1]}: "
                "give each member's recovery directory once, all of one member count"
            )
        if not claims:
            layout, partitions = dirs[0].layout, dirs[0].partitions
            missing = internal_partition(shard, partitions) % layout.count
            raise NotOneClusterError(
                f"{shard_name(shard, shards)} is held by none of "
                f"{', '.join(str(each.directory) for each in dirs)}: the recovery directory "
                f"of member {missing} of {layout.count} is missing (give every member's; a "
                "member whose volume is lost rebuilds from the changelog when started: "
                "start it, stop it, then export)"
            )


def members_state(
    directories: Sequence[Path], flow_id: str = "tsi"
) -> tuple[dict[str, Entry], dict[str, Any]]:
    """({instance key: entry}, {input position: state}) of the members whose recovery
    directories are ``directories``, each shard and input partition from the directory
    whose member holds it (``check_claims`` first)."""
    dirs = [member_dir(directory, flow_id) for directory in directories]
    check_claims(dirs)
    entries: dict[str, Entry] = {}
    inputs: dict[str, Any] = {}
    for each in dirs:
        found = committed_entries([each.directory], flow_id)
        entries.update((k, e) for k, e in found.items() if each.holds_key(k))
        positions = resumed_inputs([each.directory], flow_id)
        inputs.update((w, s) for w, s in positions.items() if each.owns_input(w))
    return entries, inputs
