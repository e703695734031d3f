"""Reading Kafka: Bytewax 0.21.1's Kafka source, observed and committing (``kafka_messages``).

Each Kafka partition is a Bytewax input partition, assigned manually, its next offset kept
in Bytewax's recovery state. The partitions built here also report librdkafka's
statistics (readiness, lag) and each epoch's close, and commit finished epochs' offsets to
a consumer group when given one.
"""

from __future__ import annotations

import collections
import functools
import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import bytewax.operators as op
from bytewax.connectors.kafka import KafkaSource, _KafkaSourcePartition
from bytewax.connectors.kafka import operators as kop
from bytewax.dataflow import Dataflow, Stream, operator
from bytewax.inputs import StatefulSourcePartition
from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition
from confluent_kafka import KafkaError as ConfluentKafkaError

from flows.service.connectors.kafka_sink import names_of
from flows.service.observe.metrics import note_broker_contact, observe_kafka_stats
from flows.service.runtime.members import ALONE, Members
from flows.service.runtime.stopping import Stop
from flows.service.shards.stream_clock import STREAM_CLOCK
from flows.service.wire._records import internal_message, kafka_batch
from flows.service.wire.events import DeadLetter, Origin

log = logging.getLogger(__name__)

#: Consumer defaults of `kafka_messages` (before `add_config`). Bytewax sets none of these.
SOURCE_DEFAULTS: dict[str, Any] = {
    # librdkafka's default is "largest": a resumed offset that retention (or delete_records)
    # has removed would silently skip to the END of the partition, losing everything in
    # between. "earliest" resumes at the oldest message still there (at-least-once).
    "auto.offset.reset": "earliest",
    # how soon partitions added to a topic are noticed (librdkafka's default: 5 minutes)
    "topic.metadata.refresh.interval.ms": 30000,
    # Bytewax builds one consumer a partition, and librdkafka's default prefetch into each
    # is large: a flood of new users then waits in those buffers and sets the process's peak
    # memory. One MiB a partition keeps the worker fed (it reads batches of a thousand)
    # when a full buffer is refilled at once: librdkafka otherwise waits a second
    # (fetch.queue.backoff.ms) before it fetches for a partition whose buffer was full.
    "queued.max.messages.kbytes": 1024,
    "fetch.queue.backoff.ms": 5,
}


#: A partition counts as caught up (stream time) once it has read what it held when the
#: service started and is this close to its end: under steady traffic a few messages are
#: always in flight, and a lag building up is far longer.
CAUGHT_UP_LAG = 1000


class _ObservedPartition(_KafkaSourcePartition):
    """Bytewax 0.21.1's Kafka source partition, telling the service what happens to it.

    - librdkafka's statistics (every second) feed readiness and consumer lag
      (``flows.metrics.observe_kafka_stats``) instead of Bytewax's own lag gauge;
    - each snapshot (an epoch's close) is reported through ``on_epoch``;
    - with a ``group.id`` of the service's own, the offset of the previous snapshot is
      committed to that group when the next is taken (that epoch is done), and the last
      one when the partition closes at the end of its input. Recovery never reads these
      commits: they make progress and lag visible to standard Kafka tools, and
      ``--no-recovery`` starts from them.
    """

    def __init__(self, *args: Any, source: ObservedKafkaSource) -> None:
        super().__init__(*args)
        self._batched = source.batched
        self._built_with = source.partition_counts.get(self._topic)
        self._backlog_end: int | None = None  # the partition's end when first seen
        on_epoch, commit = source._on_epoch, source._group_id is not None
        self._on_epoch = on_epoch
        self._commits = commit
        self._config = args[1]  # the consumer's: its group commits a deferred final offset
        self._done: int | None = None  # the offset of the previous snapshot
        STREAM_CLOCK.expect(self._topic, self._part_idx)

    def next_batch(self) -> list[Any]:
        """What one ``consume`` read: Bytewax's items, or (batched) one item holding them
        as (bytes, Origin) messages and dead letters of Kafka's errors."""
        if Stop.asked():  # a clean end: Bytewax finishes and commits the epoch
            raise StopIteration
        if not self._batched:
            return super().next_batch()
        items = self._consume()
        return [items] if items else []

    def _consume(self) -> list[Any]:
        """Bytewax 0.21.1's ``next_batch`` without a ``KafkaSourceMessage`` per message
        (a large share of an event's cost, bench/RESULTS.md, "shards and batches"), read
        in C (``_records.kafka_batch``): messages as ``_converter`` says, errors as
        their dead letters, the end of a partition (``tail=False``) noted. It takes what the
        client has fetched and never waits: a worker reads ~10 partitions (requests,
        feedback, the internal topic) one after the other, and a wait in each empty one
        would make every hop wait for the whole round. Bytewax calls a partition again
        1 ms after an empty batch, without blocking."""
        if self._eof:
            raise StopIteration
        messages = self._consumer.consume(self._batch_size, 0)  # never blocks the worker
        out, last, self._eof = kafka_batch(
            messages, self._topic, self._part_idx, self._converter(), _error_item, _EOF
        )
        if last is not None:
            self._offset = last + 1  # resume after it, not at it
            self._note_read(out)
        return out

    def _note_read(self, out: list[Any]) -> None:
        """Stream time: the batch's newest message is read, not yet served (its partition
        holds expiry until it is, ``flows.service.shards.stream_clock``)."""
        item = out[-1] if out else None
        if isinstance(item, tuple) and item[1].time is not None:
            STREAM_CLOCK.note_read(self._topic, self._part_idx, item[1].time)

    def _converter(self) -> Callable[[Any], Any] | None:
        """How a message becomes an item: None for (bytes, Origin), built in C
        (``flows.service.wire._records.kafka_message``)."""
        return None

    def _process_stats(self, json_stats: str) -> None:
        try:
            stats = json.loads(json_stats)  # decoded once, for the metrics and stream time
        except ValueError:
            stats = {}
        observe_kafka_stats(stats, self._offset)  # never raises
        STREAM_CLOCK.note_position(self._topic, self._part_idx, self._caught_up(stats))

    def _caught_up(self, stats: dict[str, Any]) -> bool | None:
        """Whether this partition has read all there is (stream time,
        ``flows.service.shards.stream_clock``), or None while its end is not known: librdkafka
        reports an empty partition's end (``hi_offset``) only after its first fetch."""
        try:
            partitions = stats["topics"][self._topic]["partitions"]
            self._check_count(partitions)
            mine = partitions[str(self._part_idx)]
            end = mine["hi_offset"]
            starts = (mine.get("lo_offset", -1), mine.get("committed_offset", -1))
        except (KeyError, TypeError, ValueError):
            return None
        if end < 0:
            return None
        if self._offset < 0:  # nothing read yet: caught up if there is nothing to read
            return end in starts
        if self._backlog_end is None:  # what was there at start must be read first
            self._backlog_end = end
        return self._backlog_end <= self._offset and end - self._offset <= CAUGHT_UP_LAG

    def _check_count(self, partitions: dict[str, Any]) -> None:
        count = sum(1 for pid in partitions if int(pid) >= 0)
        changed = self._built_with is not None and count != self._built_with
        if changed and not Stop.asked():
            # Bytewax 0.21.1 lists partitions only at start: end cleanly and ask for a
            # restart (``tsi run`` exits 3), which reads the new partitions from their start
            Stop.ask(
                f"topic {self._topic} has {count} partitions, the flow was built with "
                f"{self._built_with}: ending cleanly; restart to read them",
                restart=True,
            )
            log.error(Stop.reason)

    def snapshot(self) -> int | None:
        offset = super().snapshot()
        self._commit(asynchronous=True)
        self._done = offset
        if self._on_epoch is not None:
            self._on_epoch()
        return offset

    def _commit(self, asynchronous: bool) -> None:
        if not self._commits or self._done is None or self._done < 0:
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
        if FINAL_COMMITS.defer and self._commits and done:
            tp = TopicPartition(self._topic, self._part_idx, self._done)
            FINAL_COMMITS.pending.append((self._config, tp))
        else:
            self._commit(asynchronous=False)
        STREAM_CLOCK.forget(self._topic, self._part_idx)
        super().close()


class FinalCommits:
    """The offsets input partitions reach at the end of their input, committed to their
    consumer group once the flow has ended (``commit``), when ``defer`` is on (the
    service with a changelog, ``process.Service.flow``): Bytewax closes a partition at the
    end of its input before the last epoch is snapshotted downstream, and with a changelog
    the group's commits are where a lost recovery directory resumes
    (``process.Service._at_commits``), so no commit may run ahead of the shards'
    snapshots. A flow that fails, or that Bytewax runs by itself (``bytewax.run``), leaves
    them uncommitted: the group stays one epoch behind, which re-reads that epoch."""

    def __init__(self) -> None:
        self.defer = False
        self.pending: list[tuple[dict[str, Any], TopicPartition]] = []

    def commit(self) -> None:
        """Commit what is pending (each with its partition's consumer settings); a
        failure is logged, never raised (the group's offsets are then behind)."""
        from confluent_kafka import Consumer

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


#: Seconds between two looks of a dormant partition at whether a stop was asked for.
DORMANT_LOOK_S = 1.0


class _DormantPartition(StatefulSourcePartition[Any, Any]):
    """A partition another member reads: nothing read, its state (that of an earlier
    layout, or None) kept as it is, for when this member reads it again. It ends at a
    stop, as the partitions read do: else the flow would never end cleanly."""

    def __init__(self, resume_state: Any) -> None:
        self._state = resume_state

    def next_batch(self) -> list[Any]:
        if Stop.asked():
            raise StopIteration
        return []

    def next_awake(self) -> datetime:
        return datetime.now(UTC) + timedelta(seconds=DORMANT_LOOK_S)

    def snapshot(self) -> Any:
        return self._state


class ObservedKafkaSource(KafkaSource):
    """``bytewax.connectors.kafka.KafkaSource`` building ``_ObservedPartition``s; with
    ``group_id`` they commit each finished epoch's offsets to that consumer group."""

    def __init__(
        self,
        *args: Any,
        group_id: str | None = None,
        on_epoch: Callable[[], None] | None = None,
        batched: bool = False,
        seeded: dict[str, Any] | None = None,
        members: Members = ALONE,
        **kw: Any,
    ) -> None:
        super().__init__(*args, **kw)
        self._members = members
        self._group_id = group_id
        self._on_epoch = on_epoch
        self.batched = batched  # one item per consume: the list of what it read
        # "step id/partition": the state a partition starts from when Bytewax has none
        # (an imported store, ``flows.tools.state``)
        self.seeded = seeded or {}
        self.partition_counts: dict[str, int] = {}

    def list_parts(self) -> list[str]:
        """Bytewax's listing of the topics' partitions, remembering each topic's partition
        count. Every worker of a process lists on this same object: the count is each
        listing's, not their sum. A member lists them all: those of other members are built
        dormant (``build_part``), since Bytewax 0.21.1 refuses to resume a store holding
        the state of a partition it does not list (a store of an earlier layout)."""
        parts = super().list_parts()
        self.partition_counts = dict(collections.Counter(part.split("-", 1)[1] for part in parts))
        return parts

    def build_part(self, step_id: str, for_part: str, resume_state: Any) -> Any:
        """This member's partitions read (``_owned_part``), the others' dormant."""
        if not self._members.owns(int(for_part.split("-", 1)[0])):
            return _DormantPartition(resume_state)
        return self._owned_part(step_id, for_part, resume_state)

    def _owned_part(self, step_id: str, for_part: str, resume_state: int | None) -> Any:
        """As Bytewax 0.21.1 builds its partitions (which overwrites any ``stats_cb``)."""
        if resume_state is None:
            resume_state = self.seeded.get(f"{step_id}/{for_part}")
        index, topic = for_part.split("-", 1)
        args = self._partition_args(step_id, topic, index, resume_state)
        return _ObservedPartition(*args, source=self)

    def _partition_args(
        self, step_id: str, topic: str, index: str, resume_state: int | None
    ) -> tuple[Any, ...]:
        config = {
            "group.id": "BYTEWAX_IGNORED",
            "enable.auto.commit": "false",
            "bootstrap.servers": ",".join(self._brokers),
            "enable.partition.eof": str(not self._tail),
            "statistics.interval.ms": 1000,
            **self._add_config,
            "error_cb": _noting_errors(self._add_config.get("error_cb")),
        }
        if self._group_id is not None:
            config["group.id"] = self._group_id
        return (
            step_id,
            config,
            topic,
            int(index),
            self._starting_offset,
            resume_state,
            self._batch_size,
            self._raise_on_errors,
        )


class _InternalPartition(_ObservedPartition):
    """One partition of the instance-keyed internal topic (see ``Repartition``).

    Each copy names its input message in a header. A crash makes the copying stage write
    again what it copied since its last snapshot: those second copies come after the
    first ones, and are dropped here by source offset (per input partition, offsets only
    grow: one reader, one idempotent writer), so they never change anything. Items are
    (bytes, the input message's Origin), read in C (``_records.internal_message``), or a
    ``not_a_copy`` dead letter for a message the service did not write; the highest source
    offsets are in the snapshot.
    """

    def __init__(self, *args: Any, source: InternalKafkaSource, seen: dict[bytes, int]) -> None:
        super().__init__(*args, source=source)
        self._seen = seen
        self._read = functools.partial(
            internal_message, seen, source.inputs, self._topic, self._part_idx
        )

    def _converter(self) -> Callable[[Any], Any] | None:
        return self._read

    def _note_read(self, out: list[Any]) -> None:
        """Nothing: a copy is served under its input's name, noted when the input was read."""

    def snapshot(self) -> dict[str, Any]:
        return {"offset": super().snapshot(), "seen": dict(self._seen)}


class InternalKafkaSource(ObservedKafkaSource):
    """The internal topic's source: ``_InternalPartition``s; ``inputs`` maps a copy's tag
    (b"r", b"f") to its input topic."""

    def __init__(self, *args: Any, inputs: dict[bytes, str], **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.inputs = inputs

    def _owned_part(self, step_id: str, for_part: str, resume_state: Any) -> Any:
        if resume_state is None:
            resume_state = self.seeded.get(f"{step_id}/{for_part}")
        index, topic = for_part.split("-", 1)
        offset = resume_state["offset"] if resume_state else None
        args = self._partition_args(step_id, topic, index, offset)
        seen = dict(resume_state["seen"]) if resume_state else {}
        return _InternalPartition(*args, source=self, seen=seen)


def internal_messages(
    step_id: str,
    flow: Dataflow,
    brokers: list[str],
    topic: str,
    inputs: dict[bytes, str],
    add_config: dict[str, Any] | None = None,
    *,
    starting_offset: int = OFFSET_BEGINNING,
    tail: bool = True,
    group_id: str | None = None,
    on_epoch: Callable[[], None] | None = None,
    seeded: dict[str, Any] | None = None,
    members: Members = ALONE,
) -> Stream[list[Any]]:
    """Batches of the internal topic (this member's partitions), from its start by default
    (it only holds what this service copied): each a list of messages as (bytes, input
    Origin) and dead letters (``not_a_copy``, and Kafka's errors)."""
    source = InternalKafkaSource(
        names_of("brokers", brokers),
        [topic],
        tail=tail,
        starting_offset=starting_offset,
        add_config={**SOURCE_DEFAULTS, **(add_config or {})},
        raise_on_errors=False,
        group_id=group_id,
        on_epoch=on_epoch,
        inputs=inputs,
        batched=True,
        seeded=seeded,
        members=members,
    )
    return op.input(step_id, flow, source)


def _noting_errors(
    then: Callable[[ConfluentKafkaError], None] | None,
) -> Callable[[ConfluentKafkaError], None]:
    """An ``error_cb`` that tells readiness, then calls the configured one (if any)."""

    def on_error(err: ConfluentKafkaError) -> None:
        note_broker_contact(False, str(err))
        if then is not None:
            then(err)

    return on_error


def kafka_messages(
    step_id: str,
    flow: Dataflow,
    brokers: list[str],
    topics: list[str],
    starting_offset: int = OFFSET_BEGINNING,
    add_config: dict[str, Any] | None = None,
    *,
    tail: bool = True,
    batch_size: int = 1000,
    group_id: str | None = None,
    on_epoch: Callable[[], None] | None = None,
    batched: bool = False,
    seeded: dict[str, Any] | None = None,
    members: Members = ALONE,
) -> Any:
    """Read `topics` from `starting_offset`; returns `.oks` and `.errs` streams.

    `.oks` carries `KafkaSourceMessage` (key, value, topic, partition, offset, timestamp,
    headers); `.errs` carries `bytewax.connectors.kafka.KafkaError` (`.err`, `.msg`) for the
    per-message errors librdkafka returns from `consume()`. Each Kafka partition is a
    Bytewax input partition, assigned manually; the next offset to read is the recovery
    state, so with recovery a restart resumes where the last snapshot was taken
    (`starting_offset` only applies without resume state; `OFFSET_STORED` starts from
    `group_id`'s committed offsets). `tail=False` ends the input at the end of every
    partition (tests, backfills). With `group_id`, each epoch's offsets are committed to
    that consumer group; `on_epoch` is called at each epoch close (see
    `ObservedKafkaSource`). ``batched=True`` returns one stream instead, whose items are
    lists: what one ``consume`` read, in its order: messages as (bytes, Origin) and, for
    Kafka's errors, their ``kafka_error`` dead letters. ``seeded``:
    where partitions without resume state start (``"step id/partition": offset``).
    ``members``: read only this member's partitions (``flows.service.runtime.members``).

    Defaults added over Bytewax's: `SOURCE_DEFAULTS`, each with its reason. Left at its
    default: `fetch.wait.max.ms` (the broker answers a pending fetch as soon as one byte
    arrives, so lowering it only multiplies idle fetches; it does bound how soon
    `tail=False` sees a partition's end: add_config={"fetch.wait.max.ms": 10}).

    Caveats of the underlying connector (Bytewax 0.21.1): listing the partitions at start
    waits forever if no broker answers; a broker outage while running produces no error
    items, the input just waits and resumes when the broker is back.
    """
    config = {**SOURCE_DEFAULTS, **(add_config or {})}
    source = ObservedKafkaSource(
        names_of("brokers", brokers),
        names_of("topics", topics),
        tail=tail,
        starting_offset=starting_offset,
        add_config=config,
        batch_size=batch_size,
        raise_on_errors=False,
        group_id=group_id,
        on_epoch=on_epoch,
        batched=batched,
        seeded=seeded,
        members=members,
    )
    if batched:
        return _batch_input(step_id, flow, source=source)
    return _source_input(step_id, flow, source=source)


@operator
def _source_input(step_id: str, flow: Dataflow, *, source: KafkaSource) -> kop.KafkaOpOut:
    """``bytewax.connectors.kafka.operators.input`` with a source of our choosing; the
    same inner step ids, so recovery stores written before stay readable."""
    return op.input("kafka_input", flow, source).then(kop._kafka_error_split, "split_err")


_EOF = ConfluentKafkaError._PARTITION_EOF


def _error_item(message: Any, error: Any) -> DeadLetter:
    """A message that carries an error, as its ``kafka_error`` dead letter."""
    origin = Origin(message.topic() or "?", message.partition(), message.offset())
    return DeadLetter("kafka_error", str(error), message.value() or b"", origin)


@operator
def _batch_input(step_id: str, flow: Dataflow, *, source: KafkaSource) -> Stream[list[Any]]:
    """The batched source, with the inner step id of ``_source_input``: the same recovery
    state (the next offset of each partition)."""
    return op.input("kafka_input", flow, source)
