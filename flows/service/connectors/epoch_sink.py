"""Sinks whose every epoch is acknowledged: ``EpochAcknowledgedSink`` and its partition.

Bytewax asks every sink partition for its snapshot when an epoch closes, before it commits
the epoch. A partition here writes each batch as it comes (``send``) and makes sure of the
epoch's writes in that snapshot (``acknowledge``): it returns once every item sent since the
last snapshot is written for good, and raises otherwise, so the dataflow fails and recovery
replays the epoch. No epoch is committed with an output not written, and the worker does
not wait for the output after every batch. A new output subclasses the two classes and
writes only its partition's ``send`` and ``acknowledge`` and its sink's ``build_part``:
Kafka (``kafka_sink``: the broker's acknowledgements), JSON-lines files (``files``:
flush and fsync).

>>> class Printed(EpochAcknowledgedPartition[str, None]):
...     def send(self, items):
...         print("send", items)
...     def acknowledge(self, sent):
...         print("acknowledge", sent)
>>> part = Printed(batched=True)
>>> part.write_batch([["a", "b"], ["c"]])
send ['a', 'b', 'c']
>>> part.snapshot()
acknowledge 3
>>> part.snapshot()
acknowledge 0
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, TypeVar

import bytewax.operators as op
from bytewax.dataflow import Stream
from bytewax.outputs import FixedPartitionedSink, StatefulSinkPartition

X = TypeVar("X")  # what the sink writes
S = TypeVar("S")  # a partition's resume state

__all__ = ["EpochAcknowledgedPartition", "EpochAcknowledgedSink"]


class EpochAcknowledgedPartition(StatefulSinkPartition[X, S]):
    """One partition's writes: sent as they come, acknowledged by the epoch's close.

    With ``batched``, every item Bytewax hands ``write_batch`` is a list of items (a
    dataflow that carries batches). Subclasses write ``send`` and ``acknowledge``.
    """

    def __init__(self, batched: bool = False) -> None:
        self._batched = batched
        self._sent = 0  # items sent since the last snapshot

    @abstractmethod
    def send(self, items: list[X]) -> None:
        """Start writing ``items`` (at least one); raise for an item that cannot be
        written. Need not wait for the output: ``acknowledge`` does."""

    @abstractmethod
    def acknowledge(self, sent: int) -> S:
        """Return once all ``sent`` items sent since the last call are written for good
        (0: none were), with the partition's resume state; raise, naming the output and
        what was lost, if any of them was not."""

    def write_batch(self, items: list[Any]) -> None:
        """Send the items of an epoch as they come (``batched``: the items of each batch)."""
        if self._batched:
            items = [item for batch in items for item in batch]
        if items:
            self.send(items)
            self._sent += len(items)

    def snapshot(self) -> S:
        """Bytewax's call when an epoch closes, before it commits the epoch: every item
        sent since the last snapshot is acknowledged, or this raises."""
        sent, self._sent = self._sent, 0
        return self.acknowledge(sent)

    def close(self) -> None:
        """At the end of the input: what the last epoch sent is acknowledged too."""
        self.snapshot()


class EpochAcknowledgedSink(FixedPartitionedSink[Any, S]):
    """A sink each process writes through one partition of, ``part`` (its subclass's
    ``build_part`` builds an ``EpochAcknowledgedPartition``); add it to a flow with
    ``output``."""

    def __init__(self, part: str) -> None:
        self._part = part

    def output(self, step_id: str, up: Stream[Any]) -> None:
        """Write ``up`` (a stream of items, or of batches for a batched partition) through
        this process's partition: Bytewax's ``op.output`` on the items keyed by it."""
        part = self._part
        keyed = op.map(f"{step_id}_keyed", up, lambda item: (part, item))
        op.output(step_id, keyed, self)

    def list_parts(self) -> list[str]:
        """This process's partition, listed by each of its workers (one is its primary)."""
        return [self._part]
