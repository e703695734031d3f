"""How many shards a flow has: one rule (``flow_shards``), which ``tsi run`` applies at
start-up, and the bounds of a count a person gives (``shard_count``).

The count is fixed for a store's life (an instance's shard is its key's CRC-32 modulo the
count, ``flows.service.wire.keys``), so what exists decides it: the changelog topic (its
partitions are the shards: a member whose disk is lost picks the cluster's count), else
the recovery store (its shards' names, ``shard-NNN-of-MMM``), else ``--shards``, else
``DEFAULT_SHARDS``. A count given that disagrees with what exists is refused with the way
to change it.

>>> flow_shards(None, 32, None), flow_shards(64, None, None), flow_shards(None, None, None)
(32, 64, 128)
"""

from __future__ import annotations

import math
import re

from flows.service.runtime.options import ConfigError
from flows.service.wire.keys import DEFAULT_SHARDS

#: The most shards a flow may have (and so members sharing its shards).
MAX_SHARDS = 1024


def shard_count(text: str) -> int:
    """A shard count a person gives: a whole number in [1, ``MAX_SHARDS``].

    >>> shard_count("64")
    64
    >>> shard_count("0")
    Traceback (most recent call last):
    ...
    ValueError: must be a whole number from 1 to 1024, got '0'
    """
    if not re.fullmatch(r"\+?[0-9]+", text) or not 1 <= int(text) <= MAX_SHARDS:
        raise ValueError(f"must be a whole number from 1 to {MAX_SHARDS}, got {text!r}")
    return int(text)


def way_out(shards: int | str) -> str:
    """How to move a store to another shard count, ``shards`` (a number, or ``N``)."""
    return (
        f"to serve with {shards} shards, move the state: `tsi state export FILE "
        f"--recovery-dir DIR`, `tsi state import FILE --shards {shards} --recovery-dir "
        f"NEW_DIR`, and a new changelog topic with {shards} partitions (`tsi topics create "
        f"--shards {shards} --changelog-topic NEW_TOPIC`)"
    )


def flow_shards(requested: int | None, stored: int | None, changelog_partitions: int | None) -> int:
    """The flow's shard count: the changelog topic's partition count when it exists, else
    the recovery store's count (``stored``; None: no shard yet), else ``requested``
    (``--shards``), else ``DEFAULT_SHARDS``. ``ConfigError`` naming both counts when
    ``requested`` or ``stored`` disagrees with what decides.

    >>> flow_shards(None, 32, 32), flow_shards(32, 32, None), flow_shards(None, None, 64)
    (32, 32, 64)
    """
    if changelog_partitions is not None:
        if stored is not None and stored != changelog_partitions:
            raise ConfigError(
                f"the recovery store holds {stored} shards and the changelog topic has "
                f"{changelog_partitions} partitions (one a shard): give this store its own "
                f"changelog topic, or {way_out(changelog_partitions)}"
            )
        decided, what = changelog_partitions, "changelog topic's"
    elif stored is not None:
        decided, what = stored, "recovery store's"
    else:
        return DEFAULT_SHARDS if requested is None else requested
    if requested is not None and requested != decided:
        raise ConfigError(
            f"--shards {requested} disagrees with the {what} {decided} shards: {way_out(requested)}"
        )
    return decided


#: The most partitions ``tsi topics create`` gives a new internal topic by default: the
#: most members the service can grow to without new topics. Each partition a process
#: reads is a Kafka consumer of its own (Bytewax's Kafka source), which a service alone
#: pays for idle (bench/RESULTS.md, "what an internal topic of one partition a shard
#: costs").
DEFAULT_INTERNAL_PARTITIONS = 32


def internal_partitions(text: str | None, shards: int) -> int:
    """Partitions of a new internal topic for a flow of ``shards``: ``text`` (a whole
    number), else the greatest common divisor of ``DEFAULT_INTERNAL_PARTITIONS`` and the
    count. It must divide the count, so that an event's internal partition (its shard
    modulo the partitions, ``keys.internal_partition``) is its key's CRC-32 modulo the
    partitions under any count it divides: copies in flight keep their partition when the
    state moves to another count. ``ValueError`` naming the value otherwise.

    >>> internal_partitions(None, 128), internal_partitions(None, 48)
    (32, 16)
    >>> internal_partitions("128", 128)
    128
    >>> internal_partitions("3", 128)
    Traceback (most recent call last):
    ...
    ValueError: must be a whole number dividing the shard count 128, got '3'
    """
    if text is None:
        return math.gcd(DEFAULT_INTERNAL_PARTITIONS, shards)
    if not re.fullmatch(r"\+?[0-9]+", text) or not 1 <= int(text) <= shards or shards % int(text):
        raise ValueError(f"must be a whole number dividing the shard count {shards}, got {text!r}")
    return int(text)
