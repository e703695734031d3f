"""A start's restore: every shard this process owns read from its changelog at once, by
one reader, before the flow serves a first event (``restore``).

Each shard's read starts where the recovery directory's committed state says its
changelog stood (the offset of its last marker: the marker itself and what follows),
or at the start of its partition when the directory holds nothing of it (lost, new).
What is read is checked to be this application's (``ForeignChangelogError``, which stops
the start in one line) and kept for the shards' start, which then reads nothing itself.

>>> import tempfile
>>> restore_plan(tempfile.mkdtemp(), 2, None)
{'shard-000-of-002': -1, 'shard-001-of-002': -1}
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from flows.service.observe.restoring import RESTORING
from flows.service.runtime.recovery import STATE_STEP, committed_shard_states
from flows.service.shards.changelog import (
    ChangelogError,
    ForeignChangelogError,
    Record,
    check_application,
    shard_index,
)
from flows.service.wire.keys import shard_name

log = logging.getLogger(__name__)

FLOW_ID = "tsi"  # the service's dataflow id (``build_flow``)


class Prefetching(Protocol):
    """A changelog that reads many shards in one pass (``KafkaChangelog``)."""

    application: str
    name: str

    def prefetch(self, afters: dict[str, int]) -> dict[str, list[Record]]: ...


def restore_plan(
    recovery_dir: str | Path, shards: int, holds: Callable[[int], bool] | None
) -> dict[str, int]:
    """{shard this process owns: the offset its changelog is read after} (``holds``: a
    member's shards; None: all)."""
    states = committed_shard_states(recovery_dir, f"{FLOW_ID}.{STATE_STEP}")
    plan = {}
    for index in range(shards):
        if holds is not None and not holds(index):
            continue
        name = shard_name(index, shards)
        plan[name] = _read_after(states.get(name))
    return plan


def _read_after(state: dict[str, Any] | None) -> int:
    """Where a shard's start reads its changelog (``changelog.start``): from its last
    marker's offset, or from the start."""
    mirrored = (state or {}).get("changelog") or {}
    offset = mirrored.get("offset")
    return -1 if offset is None else offset - 1


def restore(
    changelog: Prefetching,
    recovery_dir: str | Path,
    shards: int,
    holds: Callable[[int], bool] | None,
) -> int:
    """Read the changelog of every shard this process owns in one pass and check it is
    this application's (``ForeignChangelogError`` otherwise); the number of records
    read. Readiness waits until every one of those shards has started (``RESTORING``)."""
    plan = restore_plan(recovery_dir, shards, holds)
    RESTORING.expect(plan)
    found = changelog.prefetch(plan)
    for shard, records in found.items():
        where = f"{changelog.name}[{shard_index(shard)}]"
        try:
            check_application(records, changelog.application, where)
        except ForeignChangelogError:
            raise
        except ChangelogError as exc:  # the shard's start says so, as a dead letter
            log.warning("%s: %s", where, exc)
    count = sum(map(len, found.values()))
    log.info("restored %d shards from changelog %s: %d records", len(found), changelog.name, count)
    return count
