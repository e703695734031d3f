"""Running the service: the Kafka dataflow (``Service``) and this process around it (``run``).

``tsi run`` (after its start-up checks, ``flows.service.runtime.startup``) and ``python -m
bytewax.run flows.service.main:flow`` start the same flow from the same ``Settings``.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from bytewax.dataflow import Dataflow
from bytewax.recovery import RecoveryConfig, init_db_dir
from bytewax.run import cli_main
from confluent_kafka import OFFSET_BEGINNING, OFFSET_STORED

from flows.service.connectors.kafka import kafka_wiring
from flows.service.connectors.kafka_admin import group_offsets, holds_records
from flows.service.connectors.kafka_changelog import KafkaChangelog
from flows.service.connectors.kafka_partition import FINAL_COMMITS
from flows.service.connectors.members import ALONE, Members
from flows.service.connectors.stopping import Stop, on_signals
from flows.service.connectors.topics import Topics
from flows.service.dataflow import Guards, Outputs, build_flow
from flows.service.instances.registry import LiveRegistry, Registry
from flows.service.observe.metrics import DEFAULT_HOST, note_epoch_completed, serve_metrics
from flows.service.observe.stream_clock import STREAM_CLOCK
from flows.service.runtime.allocator import TRIM_EVERY, map_large_blocks, start_trimming
from flows.service.runtime.dir_lock import hold_directory, is_empty
from flows.service.runtime.gc_freezer import freeze_long_lived
from flows.service.runtime.recovery import (
    input_seeds,
    keys_of_one_shard,
    seeded_inputs,
    shard_store,
    store_offsets,
)
from flows.service.runtime.restore import restore
from flows.service.runtime.settings import DEFAULT_GROUP, Settings, client_config, outputs_of
from flows.service.runtime.shard_count import flow_shards
from flows.service.wire.keys import DEFAULT_SHARDS

log = logging.getLogger("tsi")


@dataclass(frozen=True)
class Service:
    """Everything the Kafka dataflow needs.

    The registry is held as a ``LiveRegistry``: ``reload_registry`` (SIGHUP in ``run``)
    reads its file again, and the new one applies when the next epoch closes.
    """

    registry: Registry | LiveRegistry
    brokers: list[str]
    topics: Topics = field(default_factory=Topics)
    consumer_config: dict[str, Any] = field(default_factory=dict)
    producer_config: dict[str, Any] = field(default_factory=dict)
    group_id: str | None = DEFAULT_GROUP
    guards: Guards = field(default_factory=Guards)
    outputs: Outputs | None = None  # instead of the selections and dead-letter topics
    members: Members = ALONE
    internal_partitions: int = 0  # the internal topic's (0: copies placed by key)
    shards: int = DEFAULT_SHARDS  # the flow's count (``runtime.shard_count``)
    connect_timeout: float = 10.0  # seconds the brokers get to answer the start's questions

    def __post_init__(self) -> None:
        if not isinstance(self.registry, LiveRegistry):
            object.__setattr__(self, "registry", LiveRegistry(self.registry))

    def _restored(self, recovery: str | Path, cluster: bool) -> KafkaChangelog | None:
        """The changelog shards mirror to (None without one), every owned shard's records
        read by one reader first unless in a Bytewax cluster; the final commits deferred
        with one (the group's commits say where a lost store resumes)."""
        if self.topics.changelog is None:
            return None
        FINAL_COMMITS.defer = True
        changelog = KafkaChangelog(
            self.brokers,
            self.topics.changelog,
            self.producer_config,
            self.consumer_config,
            application=self.group_id or DEFAULT_GROUP,
        )
        if not cluster:
            holds = None if self.members.count == 1 else self._holds
            restore(changelog, Path(recovery), self.shards, holds)
        return changelog

    def flow(
        self,
        tail: bool = True,
        recovery: bool | str | Path = True,
        fresh: bool = False,
        process: int = 0,
        rebuild: bool = False,
        cluster: bool = False,
    ) -> Dataflow:
        """The Kafka dataflow. ``recovery``: the recovery directory (the shards keep their
        logs in it), True for snapshots of whole shards, or False: no snapshots, and the
        flow starts from the group's offsets (the end where it has none). A new recovery
        store reads the topics from their start, or with ``fresh`` (an accepted reset) from
        the consumer group's committed offsets, or (an empty store while the changelog
        holds the shards, ``_seeds``) from them too, but with ``rebuild`` (``--rebuild``).
        ``process``: this process's index in its cluster (``cluster``: one of several
        processes of one Bytewax cluster, which place shards themselves: each shard reads
        its changelog at its start; otherwise every shard this process owns is restored
        at once, here: ``runtime.restore``)."""
        Stop.reset()
        consumer = dict(self.consumer_config)
        start = OFFSET_STORED if fresh or not recovery else OFFSET_BEGINNING
        if not recovery:
            consumer.setdefault("auto.offset.reset", "latest")
        wiring = kafka_wiring(
            self.brokers,
            self.topics,
            consumer,
            self.producer_config,
            tail=tail,
            group_id=self.group_id,
            starting_offset=start,
            on_epoch=self._epoch_closed,
            seeded=None if isinstance(recovery, bool) else self._seeds(recovery, rebuild),
            process=process,
            members=self.members,
            internal_partitions=self.internal_partitions,
            shards=self.shards,
        )
        if self.outputs is not None:
            wiring = replace(wiring, outputs=self.outputs)
        store = None if isinstance(recovery, bool) else shard_store(recovery)
        FINAL_COMMITS.defer, FINAL_COMMITS.pending = False, []
        changelog = self._restored(recovery, cluster) if store is not None else None
        return build_flow(
            self.registry,
            wiring,
            snapshots=bool(recovery),
            guards=self.guards,
            stream=STREAM_CLOCK,
            store=store,
            changelog=changelog,
            holds=None if self.members.count == 1 else self._holds,
            shards=self.shards,
            handover=None if store is None else keys_of_one_shard(recovery),
        )

    def _seeds(self, recovery: str | Path, rebuild: bool) -> dict[str, Any]:
        """Where the input partitions without state in ``recovery`` start: the positions
        ``tsi state import`` left (``seeded_inputs``); or, for a store holding no commit
        (lost, emptied, a new member's) while the changelog holds the shards, the
        consumer group's committed offsets (``_at_commits``); else, and with
        ``rebuild``, none (the start)."""
        imported = seeded_inputs(recovery)
        if imported or rebuild or self.topics.changelog is None or self.group_id is None:
            return imported
        if store_offsets(recovery) is not None:
            return {}
        changelog, timeout = self.topics.changelog, self.connect_timeout
        if not holds_records(self.brokers, self.consumer_config, changelog, timeout):
            return {}  # nothing mirrored yet: the group's commits say nothing of the shards
        return self._at_commits()

    def _at_commits(self) -> dict[str, Any]:
        """The inputs and the internal topic from the consumer group's committed offsets.
        Sound because the group commits an epoch's offsets only once every snapshot of
        that epoch is written: Bytewax 0.21.1's input reads and snapshots a partition
        only when the recovery probe has passed the epochs before (``src/inputs.rs``),
        each partition commits its previous snapshot's offset in its next snapshot
        (``kafka_partition.ObservedPartition``; the last one, at the end of its input, only
        once the flow has ended: ``kafka_partition.FINAL_COMMITS``), and a shard's snapshot
        returns only once the changelog acknowledged its epoch, a copy sink's once the
        internal topic did. So what lies before a committed input offset is copied into
        the internal topic, and what lies before a committed internal offset is in the
        changelog; what is read again after them the shards rebuilt from the changelog
        drop (``ChangelogLayer.guard``), and second copies the internal partitions drop
        (their ``seen``)."""
        topics = self.topics
        if topics.events is not None:
            inputs = {"events": topics.events}
        else:
            inputs = {"requests": topics.requests, "feedback": topics.feedback}
        internal = topics.internal if topics.repartitioned else None
        read = [*inputs.values(), *([internal] if internal else [])]
        offsets = group_offsets(
            self.brokers, self.consumer_config, self.group_id, read, self.connect_timeout
        )
        shown = ", ".join(f"{t}[{p}]@{o}" for (t, p), o in sorted(offsets.items()))
        log.warning(
            "the recovery directory holds no state: the shards are rebuilt from changelog "
            "%s, and the inputs resume at consumer group %r's committed offsets (%s; "
            "partitions without one from their start)",
            topics.changelog,
            self.group_id,
            shown or "none",
        )
        return input_seeds(offsets, inputs, internal)

    def _holds(self, shard: int) -> bool:
        """Whether this member holds shard index ``shard`` (``Members.holds``)."""
        return self.members.holds(shard, self.internal_partitions)

    def _epoch_closed(self) -> None:
        note_epoch_completed()
        if self.registry.apply():
            log.warning("the reloaded registry is now in force")

    def reload_registry(self) -> None:
        """Read the registry file again (applied when the next epoch closes); logged."""
        log.warning(self.registry.reload())

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        guards: Guards | None = None,
        stored: int | None = None,
        shards: int | None = None,
    ) -> Service:
        """The service ``settings`` describe, without the start-up checks; ``stored``: the
        shard count of the store it runs on (``recovery.stored_shards``), if any;
        ``shards``: the count already resolved (``startup.ready_changelog``), if it is."""
        consumer, producer = client_config(settings.kafka_config)
        return cls(
            live_registry(settings, consumer),
            settings.brokers,
            settings.topics,
            consumer,
            producer,
            settings.group_id,
            settings.guards() if guards is None else guards,
            outputs_of(settings),
            settings.membership,
            shards=flow_shards(settings.shards, stored, None) if shards is None else shards,
        )


def live_registry(settings: Settings, consumer: dict[str, Any]) -> LiveRegistry:
    """The registry ``settings`` name: the file's, or the experiments topic's (the
    file's experiments it lacks created in it first)."""
    if not settings.experiments_topic:
        return LiveRegistry(Registry.load(settings.registry), settings.registry)
    from flows.experiments.follow import topic_registry

    app, timeout = settings.application, settings.connect_timeout
    return topic_registry(settings.brokers, app, consumer, timeout, settings.registry)


def run(
    flow: Dataflow,
    workers: int = 1,
    process_id: int | None = None,
    addresses: list[str] | None = None,
    recovery_dir: str | Path | None = None,
    snapshot_every: float = 10.0,
    backup_every: float = 0.0,
    metrics_port: int | None = None,
    ready_timeout: float = 60.0,
    on_reload: Callable[[], None] | None = None,
    trim_every: float = TRIM_EVERY,
    say: Callable[[str], None] = print,
    metrics_host: str = DEFAULT_HOST,
) -> None:
    """Run the flow in this process (one process of a cluster when ``addresses`` is given).

    With ``recovery_dir`` (created and initialised when empty) state and input offsets are
    snapshotted every ``snapshot_every`` seconds; a restart resumes from the last one.
    With ``metrics_port``, Prometheus metrics are served on it at ``metrics_host`` (``/metrics``,
    ``/ready`` after ``ready_timeout`` s without progress, ``/healthz``). ``on_reload`` is called on
    SIGHUP (``Service.reload_registry``); freed memory goes back every ``trim_every`` s;
    SIGINT and SIGTERM end it cleanly (``flows.service.connectors.stopping``; ``say``
    prints the line of a forced exit). The flow returns once it has ended; ``Stop`` says why.
    """
    recovery = None
    if recovery_dir is not None:
        directory = Path(recovery_dir)
        directory.mkdir(parents=True, exist_ok=True)
        hold_directory(directory, process_id or 0)  # one writer (flows.service.runtime.dir_lock)
        if is_empty(directory):
            init_db_dir(directory, max(1, len(addresses or [None])))
        recovery = RecoveryConfig(str(directory), timedelta(seconds=backup_every))
    start_process(metrics_port, ready_timeout, on_reload, trim_every, say, metrics_host)
    cli_main(
        flow,
        workers_per_process=workers,
        process_id=process_id,
        addresses=addresses,
        epoch_interval=timedelta(seconds=snapshot_every),
        recovery_config=recovery,
    )
    FINAL_COMMITS.commit()  # the flow has ended: every epoch is snapshotted


def start_process(
    metrics_port: int | None,
    ready_timeout: float,
    on_reload: Callable[[], None] | None,
    trim_every: float = TRIM_EVERY,
    say: Callable[[str], None] = print,
    metrics_host: str = DEFAULT_HOST,
) -> None:
    """What every service process does before its flow runs, whichever way it was started:
    serve metrics and probes, reload the registry on SIGHUP, end cleanly on SIGINT and
    SIGTERM (``flows.service.connectors.stopping``; ``say`` prints a forced exit's line), settle the
    start-up heap, map large blocks on their own and hand freed memory back every
    ``trim_every`` seconds (``flows.service.runtime.allocator``)."""
    map_large_blocks()
    if on_reload is not None:
        signal.signal(signal.SIGHUP, lambda *_: on_reload())
    on_signals(say=say)
    if metrics_port is not None:
        serve_metrics(metrics_port, addr=metrics_host, ready_timeout=ready_timeout)
    freeze_long_lived()
    start_trimming(trim_every)
