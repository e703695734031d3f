"""One Kafka partition as a Bytewax input partition, on Bytewax's public
``StatefulSourcePartition``: a consumer assigned to the partition at its resume offset,
batches consumed, the next offset as its snapshot.

The partitions built here also report librdkafka's statistics (readiness, lag) and each
epoch's close, commit finished epochs' offsets to a consumer group when given one, and ask
for a restart when their topic gains partitions (``check_partition_count``).
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from bytewax.connectors.kafka import KafkaError, KafkaSourceMessage
from bytewax.inputs import StatefulSourcePartition
from confluent_kafka import Consumer, KafkaException, Message, TopicPartition
from confluent_kafka import KafkaError as ConfluentKafkaError

from flows.service.connectors.end_watch import END_WATCH, Stillness
from flows.service.connectors.stopping import Stop
from flows.service.observe.metrics import INPUT_REBUILDS, observe_kafka_stats
from flows.service.observe.stream_clock import STREAM_CLOCK
from flows.service.wire._records import internal_message, kafka_batch
from flows.service.wire.events import DeadLetter, Origin

log = logging.getLogger(__name__)

#: A partition counts as caught up (stream time) once it has read what it held when the
#: service started and is this close to its end: under steady traffic a few messages are
#: always in flight, and a lag building up is far longer.
CAUGHT_UP_LAG = 1000

_EOF = ConfluentKafkaError._PARTITION_EOF


@dataclass(frozen=True)
class Reading:
    """How a source's partitions read: ``batch_size`` messages a ``consume`` at most,
    ``batched`` (one item a consume: the list of what it read), ``commits`` (finished
    epochs' offsets committed to the consumer's ``group.id``), ``on_epoch`` (called at each
    epoch's close).

    >>> Reading(batched=True).batch_size
    1000
    """

    batch_size: int = 1000
    batched: bool = False
    commits: bool = False
    on_epoch: Callable[[], None] | None = None


def check_partition_count(topic: str, partitions: dict[str, Any], built_with: int | None) -> None:
    """Ask for a clean stop and a restart (``Stop``) when librdkafka's statistics of
    ``topic`` (``partitions``, keyed by partition id; ``-1`` is its unassigned queue) list
    more partitions than the flow was built with: the sources list partitions only at
    start. Fewer is no change: a topic never loses partitions, and until the topic's
    metadata arrives the statistics list only the assigned partition.

    >>> Stop.reset(); check_partition_count("t", {"-1": {}, "0": {}}, 32); Stop.asked()
    False
    >>> check_partition_count("t", {str(p): {} for p in range(33)}, 32); Stop.restart
    True
    >>> Stop.reset()
    """
    count = sum(1 for pid in partitions if int(pid) >= 0)
    if built_with is None or count <= built_with or Stop.asked():
        return
    # end cleanly and ask for a restart (``tsi run`` exits 3), which reads the new
    # partitions from their start
    Stop.ask(
        f"topic {topic} has {count} partitions, the flow was built with "
        f"{built_with}: ending cleanly; restart to read them",
        restart=True,
    )
    log.error(Stop.reason)


class ObservedPartition(StatefulSourcePartition[Any, Any]):
    """A Kafka partition read by a consumer of its own, assigned (no group rebalancing)
    at ``offset``; the snapshot is the next offset to read. It tells the service what
    happens to it:

    - librdkafka's statistics (every second) feed readiness and consumer lag
      (``flows.metrics.observe_kafka_stats``) and stream time;
    - a consumer whose fetcher stopped while the partition has more to read is rebuilt
      at the partition's position (``flows.service.connectors.end_watch``);
    - each snapshot (an epoch's close) is reported through ``on_epoch``;
    - with ``commits`` (a ``group.id`` of the service's own), the offset of the previous
      snapshot is committed to that group when the next is taken (that epoch is done), and
      the last one when the partition closes at the end of its input. Recovery never reads
      these commits: they make progress and lag visible to standard Kafka tools, and
      ``--no-recovery`` starts from them.
    """

    def __init__(
        self,
        config: dict[str, Any],
        topic: str,
        index: int,
        offset: int,
        reading: Reading,
        built_with: int | None = None,
    ) -> None:
        self._topic, self._part_idx, self._offset = topic, index, offset
        self._reading = reading
        self._built_with = built_with  # the topic's partition count when listed
        self._backlog_end: int | None = None  # the partition's end when first seen
        self._done: int | None = None  # the offset of the previous snapshot
        self._eof = False
        config["stats_cb"] = self._process_stats
        self._config = config  # the consumer's: its group commits a deferred final offset
        self._still = Stillness(END_WATCH, topic, index, offset, time.monotonic())
        self._consumer = self._assigned()
        STREAM_CLOCK.expect(topic, index)
        END_WATCH.watch(topic, index, config)

    def _assigned(self) -> Consumer:
        """A consumer of the partition, at the partition's position."""
        consumer = Consumer(self._config)
        consumer.assign([TopicPartition(self._topic, self._part_idx, self._offset)])
        return consumer

    def _rebuild(self) -> None:
        """A new consumer at the partition's position: the fetcher stopped."""
        end = END_WATCH.end(self._topic, self._part_idx)
        log.warning(
            "%s[%d]: nothing fetched for %.0f s while its end is %d and the position %d "
            "(librdkafka fetch state %s): its consumer is rebuilt at %d",
            self._topic,
            self._part_idx,
            time.monotonic() - self._still.moved_at,
            end.offset if end else -1,
            self._still.position(self._offset),
            self._still.fetching[1],
            self._offset,
        )
        INPUT_REBUILDS.labels(self._topic, str(self._part_idx)).inc()
        stuck, self._consumer = self._consumer, self._assigned()
        # closed aside: a wedged consumer's close can wait for ever on its group's
        # coordinator (seen: the worker held, no epoch closed again)
        threading.Thread(target=stuck.close, name="tsi-close-stuck", daemon=True).start()
        self._still.moved_at = time.monotonic()

    def next_batch(self) -> list[Any]:
        """What one ``consume`` read: ``KafkaSourceMessage``s and ``KafkaError``s, or
        (batched) one item holding them as (bytes, Origin) messages and dead letters of
        Kafka's errors."""
        if Stop.asked():  # a clean end: Bytewax finishes and commits the epoch
            raise StopIteration
        now = time.monotonic()
        if now >= self._still.look_at and self._still.stopped(now, self._offset):
            self._rebuild()
        if not self._reading.batched:
            return self._messages()
        items = self._consume()
        return [items] if items else []

    def _messages(self) -> list[Any]:
        """A ``KafkaSourceMessage`` per message, a ``KafkaError`` holding one per error,
        as Bytewax 0.21.1's own Kafka source reads them."""
        if self._eof:
            raise StopIteration
        batch: list[Any] = []
        last = None
        for message in self._consumer.consume(self._reading.batch_size, 0.001):
            error = message.error()
            if error is not None and error.code() == _EOF:
                self._eof = True  # the batch is emitted, the next read ends
                break
            item = _source_message(message)
            batch.append(item if error is None else KafkaError(error, item))
            last = message.offset()
        if last is not None:
            self._offset = last + 1  # resume after it, not at it
        return batch

    def _consume(self) -> list[Any]:
        """The batched read, without a ``KafkaSourceMessage`` per message (a large share
        of an event's cost, bench/RESULTS.md, "shards and batches"), read in C
        (``_records.kafka_batch``): messages as ``_converter`` says, errors as their dead
        letters, the end of a partition (``tail=False``) noted. It takes what the client
        has fetched and never waits: a worker reads ~10 partitions (requests, feedback, the
        internal topic) one after the other, and a wait in each empty one would make every
        hop wait for the whole round. Bytewax calls a partition again 1 ms after an empty
        batch, without blocking."""
        if self._eof:
            raise StopIteration
        messages = self._consumer.consume(self._reading.batch_size, 0)  # never blocks
        out, last, self._eof = kafka_batch(
            messages, self._topic, self._part_idx, self._converter(), _error_item, _EOF
        )
        if last is not None:
            self._offset = last + 1  # resume after it, not at it
            self._note_read(out)
        return out

    def _note_read(self, out: list[Any]) -> None:
        """Stream time: the batch's newest message is read, not yet served (its partition
        holds expiry until it is, ``flows.service.observe.stream_clock``)."""
        item = out[-1] if out else None
        if isinstance(item, tuple) and item[1].time is not None:
            STREAM_CLOCK.note_read(self._topic, self._part_idx, item[1].time)

    def _converter(self) -> Callable[[Any], Any] | None:
        """How a message becomes an item: None for (bytes, Origin), built in C
        (``flows.service.wire._records.kafka_message``)."""
        return None

    def _process_stats(self, json_stats: str) -> None:
        """librdkafka's statistics: readiness, lag and stream time (never raises)."""
        try:
            stats = json.loads(json_stats)  # decoded once, for the metrics and stream time
        except ValueError:
            stats = {}
        observe_kafka_stats(stats, self._offset)  # never raises
        STREAM_CLOCK.note_position(self._topic, self._part_idx, self._caught_up(stats))
        self._note_fetching(stats)

    def _note_fetching(self, stats: dict[str, Any]) -> None:
        """The fetcher's position and state (``Stillness``)."""
        try:
            mine = stats["topics"][self._topic]["partitions"][str(self._part_idx)]
            next_offset, state = int(mine["next_offset"]), str(mine.get("fetch_state", "?"))
        except (KeyError, TypeError, ValueError):
            return
        self._still.note_fetching(next_offset, state, time.monotonic())

    def _caught_up(self, stats: dict[str, Any]) -> bool | None:
        """Whether this partition has read all there is (stream time,
        ``flows.service.observe.stream_clock``), or None while its end is not known: librdkafka
        reports an empty partition's end (``hi_offset``) only after its first fetch, and a
        fetcher that stopped reports an old one (the watch's end is newer then)."""
        try:
            partitions = stats["topics"][self._topic]["partitions"]
            check_partition_count(self._topic, partitions, self._built_with)
            mine = partitions[str(self._part_idx)]
            end = mine["hi_offset"]
            starts = (mine.get("lo_offset", -1), mine.get("committed_offset", -1))
        except (KeyError, TypeError, ValueError):
            return None
        watched = END_WATCH.end(self._topic, self._part_idx)
        if watched is not None and end >= 0:
            end = max(end, watched.offset)
        if end < 0:
            return None
        if self._offset < 0:  # nothing read yet: caught up if there is nothing to read
            return end in starts
        if self._backlog_end is None:  # what was there at start must be read first
            self._backlog_end = end
        return self._backlog_end <= self._offset and end - self._offset <= CAUGHT_UP_LAG

    def snapshot(self) -> Any:
        """The next offset to read; the previous snapshot's is committed (that epoch is
        done) and ``on_epoch`` called."""
        offset = self._offset
        self._commit(asynchronous=True)
        self._done = offset
        if self._reading.on_epoch is not None:
            self._reading.on_epoch()
        return offset

    def _commit(self, asynchronous: bool) -> None:
        if not self._reading.commits or self._done is None or self._done < 0:
            return
        try:
            self._consumer.commit(
                offsets=[TopicPartition(self._topic, self._part_idx, self._done)],
                asynchronous=asynchronous,
            )
        except KafkaException as exc:  # monitoring only: never stop the flow for it
            log.warning("committing offset of %s[%d]: %s", self._topic, self._part_idx, exc)

    def close(self) -> None:
        """At the end of the input: commit the last snapshot's offset, or hand it to
        ``FINAL_COMMITS`` to commit once the flow has ended (Bytewax closes a partition
        before the last epoch is snapshotted downstream)."""
        done = self._done is not None and self._done >= 0
        if FINAL_COMMITS.defer and self._reading.commits and done:
            tp = TopicPartition(self._topic, self._part_idx, self._done)
            FINAL_COMMITS.pending.append((self._config, tp))
        else:
            self._commit(asynchronous=False)
        STREAM_CLOCK.forget(self._topic, self._part_idx)
        END_WATCH.forget(self._topic, self._part_idx)
        self._consumer.close()


class InternalPartition(ObservedPartition):
    """One partition of the instance-keyed internal topic (see ``Repartition``).

    Each copy names its input message in a header. A crash makes the copying stage write
    again what it copied since its last snapshot: those second copies come after the
    first ones, and are dropped here by source offset (per input partition, offsets only
    grow: one reader, one idempotent writer), so they never change anything. Items are
    (bytes, the input message's Origin), read in C (``_records.internal_message``), or a
    ``not_a_copy`` dead letter for a message the service did not write; ``seen``, the
    highest source offsets, is in the snapshot. ``inputs`` maps a copy's tag to its input
    topic.
    """

    def __init__(
        self, *args: Any, seen: dict[bytes, int], inputs: dict[bytes, str], **kw: Any
    ) -> None:
        super().__init__(*args, **kw)
        self._seen = seen
        self._read = functools.partial(internal_message, seen, inputs, self._topic, self._part_idx)

    def _converter(self) -> Callable[[Any], Any] | None:
        return self._read

    def _note_read(self, out: list[Any]) -> None:
        """Nothing: a copy is served under its input's name, noted when the input was read."""

    def snapshot(self) -> dict[str, Any]:
        """The next offset and the highest source offsets seen."""
        return {"offset": super().snapshot(), "seen": dict(self._seen)}


#: Seconds between two looks of a dormant partition at whether a stop was asked for.
DORMANT_LOOK_S = 1.0


class DormantPartition(StatefulSourcePartition[Any, Any]):
    """A partition another member reads: nothing read, its state (that of an earlier
    layout, or None) kept as it is, for when this member reads it again. It ends at a
    stop, as the partitions read do: else the flow would never end cleanly.

    >>> dormant = DormantPartition({"offset": 7})
    >>> dormant.next_batch(), dormant.snapshot()
    ([], {'offset': 7})
    """

    def __init__(self, resume_state: Any) -> None:
        self._state = resume_state

    def next_batch(self) -> list[Any]:
        """Nothing, until a stop is asked for."""
        if Stop.asked():
            raise StopIteration
        return []

    def next_awake(self) -> datetime:
        """The next look at whether a stop was asked for."""
        return datetime.now(UTC) + timedelta(seconds=DORMANT_LOOK_S)

    def snapshot(self) -> Any:
        """The state it was built with."""
        return self._state


class FinalCommits:
    """The offsets input partitions reach at the end of their input, committed to their
    consumer group once the flow has ended (``commit``), when ``defer`` is on (the
    service with a changelog, ``process.Service.flow``): Bytewax closes a partition at the
    end of its input before the last epoch is snapshotted downstream, and with a changelog
    the group's commits are where a lost recovery directory resumes
    (``process.Service._at_commits``), so no commit may run ahead of the shards'
    snapshots. A flow that fails, or that Bytewax runs by itself (``bytewax.run``), leaves
    them uncommitted: the group stays one epoch behind, which re-reads that epoch.

    >>> FinalCommits().commit()  # nothing pending: nothing to do
    """

    def __init__(self) -> None:
        self.defer = False
        self.pending: list[tuple[dict[str, Any], TopicPartition]] = []

    def commit(self) -> None:
        """Commit what is pending (each with its partition's consumer settings); a
        failure is logged, never raised (the group's offsets are then behind)."""
        pending, self.pending = self.pending, []
        for config, tp in pending:
            consumer = Consumer(config)
            try:
                consumer.commit(offsets=[tp], asynchronous=False)
            except KafkaException as exc:
                log.warning("committing offset of %s[%d]: %s", tp.topic, tp.partition, exc)
            finally:
                consumer.close()


FINAL_COMMITS = FinalCommits()


def _source_message(message: Message) -> KafkaSourceMessage:
    """A consumed message as Bytewax's ``KafkaSourceMessage``."""
    return KafkaSourceMessage(
        key=message.key(),
        value=message.value(),
        topic=message.topic(),
        headers=message.headers() or [],
        latency=message.latency(),
        offset=message.offset(),
        partition=message.partition(),
        timestamp=message.timestamp(),
    )


def _error_item(message: Any, error: Any) -> DeadLetter:
    """A message that carries an error, as its ``kafka_error`` dead letter."""
    origin = Origin(message.topic() or "?", message.partition(), message.offset())
    return DeadLetter("kafka_error", str(error), message.value() or b"", origin)
