"""The service's settings: one object, each setting declared once below (its field, its
environment variable, its ``tsi run`` flag, its help, its default and its parser), read
from ``tsi run``'s options or from the environment alike: a flag is its variable given on
the command line. the docs' settings table is ``settings_table()``.

>>> Settings.from_env({"TSI_REGISTRY": "r.toml", "TSI_GROUP_ID": "g"}).group_id
'g'
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from flows.service.connectors.files import outputs_to
from flows.service.connectors.members import Members, MembersError
from flows.service.connectors.topics import Topics
from flows.service.dataflow import Guards, Outputs, parse_skips
from flows.service.observe.metrics import DEFAULT_HOST as DEFAULT_METRICS_HOST
from flows.service.runtime.allocator import TRIM_EVERY
from flows.service.runtime.kafka_options import (
    BROKERS,
    CLIENT_OPTIONS,
    CONNECT_TIMEOUT,
    DEFAULT_GROUP,
    GROUP_OPTION,
    KAFKA_CONFIG,
    TOPIC_OPTIONS,
    client_config,
    topics_from_env,
)
from flows.service.runtime.options import (
    ConfigError,
    Option,
    Parser,
    comma_list,
    count,
    name,
    optional,
    path,
    port_number,
    seconds,
    switch,
)
from flows.service.runtime.shard_count import shard_count
from flows.service.shards.shard_log import MIN_EPOCHS
from flows.service.wire.events import DEFAULT_DEAD_LETTER_RAW, DEFAULT_TS_WINDOW, raw_limit_for
from flows.service.wire.keys import DEFAULT_SHARDS

KEPT_EPOCHS = MIN_EPOCHS - 2  # a commit may lag this many snapshots behind the newest


def setting(
    var: str, flag: str, help: str, parse: Parser, default: str | None = "", **more: Any
) -> Any:
    """A field of ``Settings`` declared with its ``Option`` (its default: the default text
    read; none with ``default=None``: the setting is required)."""
    return declared(Option(var, flag, help, parse, default, **more))


def declared(option: Option) -> Any:
    """A field of ``Settings`` read by ``option`` (declared elsewhere: the group id, which
    the topics' names read too)."""
    if option.default is None:
        return field(metadata={"option": option})
    return field(default_factory=lambda: option.read({}), metadata={"option": option})


#: Where the service can write its outputs instead of the Kafka topics, by name: each
#: maps the option's target (``files:DIR``) to the flow's ``Outputs``. A new sink is a
#: connector and one line here.
OUTPUT_SINKS: dict[str, Callable[[str], Outputs]] = {"files": outputs_to}


def output_sink(text: str) -> tuple[str, str]:
    """``NAME:TARGET`` of one of ``OUTPUT_SINKS``.

    >>> output_sink("files:/tmp/out")
    ('files', '/tmp/out')
    """
    name, _, target = text.partition(":")
    if name not in OUTPUT_SINKS or not target:
        known = ", ".join(sorted(OUTPUT_SINKS))
        raise ValueError(f"must be NAME:TARGET, NAME one of {known}, got {text!r}")
    return name, target


def outputs_of(settings: Settings) -> Outputs | None:
    """The flow's ``Outputs`` that ``settings.outputs`` names, or None: the Kafka topics."""
    if settings.outputs is None:
        return None
    name, target = settings.outputs
    return OUTPUT_SINKS[name](target)


def skip_list(text: str) -> frozenset[tuple[str, int, int]]:
    """``TOPIC:PARTITION:OFFSET`` items, comma- or space-separated."""
    return parse_skips(comma_list(text)) if text else frozenset()


@dataclass(frozen=True, kw_only=True)
class Settings:
    """What the service is told to do (``tsi run``'s options, or the environment)."""

    registry: Path | None = setting(
        "TSI_REGISTRY",
        "--registry",
        "Experiments registry (TOML); SIGHUP reloads it. Required unless --experiments-topic.",
        optional(path),
    )
    experiments_topic: bool = setting(
        "TSI_EXPERIMENTS_TOPIC",
        "--experiments-topic",
        "Serve the experiments of the compacted topic `{app}.experiments` (managed by `tsi "
        "experiments` and the gateway's /v1/experiments; created when missing): each change "
        "applies when the next epoch closes. With --registry, the file's experiments the "
        "topic lacks are created in it at start.",
        switch,
        "0",
        kind="switch",
    )
    brokers: list[str] = declared(BROKERS)
    kafka_config: Path | None = declared(KAFKA_CONFIG)
    topics: Topics = field(
        default_factory=lambda: topics_from_env({}), metadata={"bundle": TOPIC_OPTIONS}
    )
    recovery_dir: Path | None = setting(
        "TSI_RECOVERY_DIR",
        "--recovery-dir",
        "Recovery directory (state survives restarts).",
        optional(path),
    )
    no_recovery: bool = setting(
        "TSI_NO_RECOVERY",
        "--no-recovery",
        "Run without a recovery directory: state starts empty at every start and the "
        "input resumes from the consumer group's committed offsets (else the topics' end).",
        switch,
        "0",
        kind="switch",
    )
    no_changelog: bool = setting(
        "TSI_NO_CHANGELOG",
        "--no-changelog",
        "Keep the shards' state only in the recovery directory, without mirroring it to "
        "the changelog topic: a lost or damaged directory is then rebuilt only by reading "
        "the inputs again (--rebuild). Without it the directory is a cache of the changelog.",
        switch,
        "0",
        kind="switch",
    )
    snapshot_every: float = setting(
        "TSI_SNAPSHOT_EVERY",
        "--snapshot-every",
        "Seconds between snapshots.",
        seconds(0.01),
        "10",
    )
    backup_every: float = setting(
        "TSI_BACKUP_EVERY",
        "--backup-every",
        "Seconds old snapshots are kept after a newer one is committed (raise it when the "
        "recovery directory is copied to durable storage).",
        seconds(),
        "0",
    )
    workers: int = setting(
        "TSI_WORKERS", "--workers", "Worker threads in this process.", count(1), "1"
    )
    process_id: int | None = setting(
        "TSI_PROCESS_ID", "--process-id", "This process's index in a cluster.", optional(count(0))
    )
    addresses: list[str] | None = setting(
        "TSI_ADDRESSES",
        "--addresses",
        "Cluster addresses 'host:port;host:port'.",
        optional(lambda text: text.split(";")),
    )
    members: int = setting(
        "TSI_MEMBERS",
        "--members",
        "Independent service processes sharing the topics' partitions (partition p is "
        "member p % N's; they talk only through Kafka); each has its own recovery "
        "directory. Needs the two input topics and the internal topic; not with "
        "--addresses.",
        count(1),
        "1",
    )
    member: int = setting(
        "TSI_MEMBER",
        "--member",
        "This process's index among the members, in [0, --members) (in Kubernetes, the "
        "pod's index).",
        count(0),
        "0",
    )
    shards: int | None = setting(
        "TSI_SHARDS",
        "--shards",
        "Shards of a new store, 1 to 1024: what members and workers divide between them "
        "(at most one a member). An existing changelog topic (its partitions) or recovery "
        "store keeps its own count; another one given is refused.",
        optional(shard_count),
        shown=f"the changelog's or store's, else {DEFAULT_SHARDS}",
    )
    connect_timeout: float = declared(CONNECT_TIMEOUT)
    stop_at_end: bool = setting(
        "TSI_STOP_AT_END",
        "--stop-at-end/--no-stop-at-end",
        "Stop at the end of the input topics instead of waiting for more (replays, tests).",
        switch,
        "0",
        kind="switch",
    )
    metrics_port: int | None = setting(
        "TSI_METRICS_PORT",
        "--metrics-port",
        "Serve Prometheus metrics (/metrics), readiness (/ready) and liveness (/healthz) on "
        "this port.",
        optional(port_number),
        shown="off",
    )
    metrics_host: str = setting(
        "TSI_METRICS_HOST",
        "--metrics-host",
        "Address the metrics and probes are served on: 0.0.0.0 is every IPv4 interface, as "
        "container and Kubernetes probes need; 127.0.0.1 keeps them on this host.",
        name,
        DEFAULT_METRICS_HOST,
    )
    ready_timeout: float | None = setting(
        "TSI_READY_TIMEOUT",
        "--ready-timeout",
        "/ready fails after this many seconds without a finished epoch or a broker reached.",
        optional(seconds(1.0)),
        shown="60, or 3 snapshot intervals if longer",
    )
    group_id: str | None = declared(GROUP_OPTION)
    skip_offsets: frozenset[tuple[str, int, int]] = setting(
        "TSI_SKIP_OFFSETS",
        "--skip-offset",
        "TOPIC:PARTITION:OFFSET of a message to skip: it becomes a 'skipped' dead letter "
        "(with its bytes) and changes nothing. Repeat, or comma-separate.",
        skip_list,
        kind="list",
    )
    ts_window: float = setting(
        "TSI_TS_WINDOW",
        "--ts-window",
        "Seconds an event's ts may differ from the wall clock.",
        seconds(0.0, above=True),
        repr(DEFAULT_TS_WINDOW),
        shown="10 years",
    )
    fresh: bool = setting(
        "TSI_FRESH",
        "--fresh",
        "Accept an empty recovery directory although the consumer group made progress: "
        "state starts empty and the input resumes from the group's offsets (without it, "
        "tsi run refuses to start over silently).",
        switch,
        "0",
        kind="switch",
    )
    rebuild: bool = setting(
        "TSI_REBUILD",
        "--rebuild",
        "The way out of a damaged recovery directory: start from an empty one (move the "
        "damaged one aside) and rebuild every bandit's state by reading the inputs from "
        "their start, as far as the broker still holds them; answers already sent are sent "
        "again, identical.",
        switch,
        "0",
        kind="switch",
    )
    malloc_trim: float = setting(
        "TSI_MALLOC_TRIM",
        "--malloc-trim",
        "Seconds between hand-backs of freed memory to the system (glibc malloc_trim; 0: never).",
        seconds(),
        f"{TRIM_EVERY:g}",
    )
    outputs: tuple[str, str] | None = setting(
        "TSI_OUTPUTS",
        "--outputs",
        "Write selections and dead letters here instead of their Kafka topics: files:DIR "
        "(JSON lines, DIR/selections.jsonl and DIR/dead_letters.jsonl).",
        optional(output_sink),
    )
    log_file: Path | None = setting(
        "TSI_LOG_FILE",
        "--log-file",
        "Write logs here (default: tsi-run.log when stderr is a terminal, else stderr).",
        optional(path),
    )

    def __post_init__(self) -> None:
        if self.registry is None and not self.experiments_topic:
            raise ConfigError(
                "give --registry FILE (TSI_REGISTRY), or --experiments-topic "
                "(TSI_EXPERIMENTS_TOPIC) to serve the experiments topic"
            )
        """Refuse settings that contradict each other (``ConfigError``)."""
        if self.no_changelog or self.no_recovery:  # it mirrors the recovery directory
            object.__setattr__(self, "topics", replace(self.topics, changelog=None))
        if (self.process_id is None) != (self.addresses is None):
            raise ConfigError("--process-id and --addresses go together")
        self._check_members()
        if self.backup_every > KEPT_EPOCHS * self.snapshot_every:
            raise ConfigError(
                f"--backup-every must stay within {KEPT_EPOCHS} snapshots ({KEPT_EPOCHS} x "
                f"--snapshot-every = {KEPT_EPOCHS * self.snapshot_every:g} s): the shards' "
                "logs keep the generation before the newest only that long"
            )

    def _check_members(self) -> None:
        try:
            Members(self.members, self.member)
        except MembersError as exc:
            raise ConfigError(f"--member/--members: {exc}") from None
        if self.members == 1:
            return
        if self.addresses is not None:
            raise ConfigError(
                "--members (independent processes) and --addresses (one Bytewax cluster) "
                "are two ways to run several processes: choose one"
            )
        if not self.topics.repartitioned:
            raise ConfigError(
                "--members needs the two input topics and the internal topic (members meet "
                "an instance's events in its internal partition), not --events-topic or "
                "--internal-topic ''"
            )
        if self.stop_at_end:
            raise ConfigError(
                "--members with --stop-at-end: a bounded run reads the inputs directly, "
                "without the internal topic the members share"
            )

    @property
    def application(self) -> str:
        """The application id (``application_id``): the group id, else ``DEFAULT_GROUP``."""
        return self.group_id or DEFAULT_GROUP

    @property
    def membership(self) -> Members:
        """This process's place among the members (``flows.service.connectors.members``)."""
        return Members(self.members, self.member)

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Settings:
        """The settings the variables describe (``ConfigError`` naming a bad one)."""
        values = {}
        for each in fields(cls):
            if "bundle" in each.metadata:
                values[each.name] = topics_from_env(env)
            else:
                values[each.name] = each.metadata["option"].read(env)
        return cls(**values)

    @property
    def processes(self) -> int:
        """Processes in the cluster (1 when alone)."""
        return len(self.addresses) if self.addresses else 1

    def guards(self, dead_letter_raw: int | None = None) -> Guards:
        """The flow's ``Guards``: the ts window, the skips, the dead letters' bound."""
        raw = DEFAULT_DEAD_LETTER_RAW if dead_letter_raw is None else dead_letter_raw
        return Guards(self.ts_window, raw, self.skip_offsets)

    def ready_after(self, snapshot_every: float) -> float:
        """Seconds without progress before ``/ready`` fails: well above an epoch."""
        if self.ready_timeout is not None:
            return self.ready_timeout
        return max(60.0, 3 * snapshot_every)


def options() -> Iterator[Option]:
    """Every setting's option, in the order of ``Settings`` (the topics where they sit)."""
    for each in fields(Settings):
        if "bundle" in each.metadata:
            yield from each.metadata["bundle"].values()
        else:
            yield each.metadata["option"]


def option(key: str) -> Option:
    """The option of the setting ``Settings.<key>``."""
    return next(f.metadata["option"] for f in fields(Settings) if f.name == key)


def consumer_from_env(env: Mapping[str, str]) -> tuple[str, dict[str, Any]]:
    """The bootstrap servers (comma-joined, as librdkafka takes them) and the consumer's
    client settings that ``CLIENT_OPTIONS`` read in ``env`` (``ConfigError``).

    >>> consumer_from_env({"KAFKA_BOOTSTRAP_SERVERS": "a:9092, b:9092"})
    ('a:9092,b:9092', {})
    """
    brokers, config = (each.read(env) for each in CLIENT_OPTIONS)
    consumer, _ = client_config(config)
    return ",".join(brokers), consumer


def settings_table() -> str:
    """The docs' table of the settings (docs/_hooks/reference.py renders it)."""
    rows = ["| variable | flag | meaning | default |", "|---|---|---|---|"]
    for each in options():
        flag = each.flag.split("/")[0] + (" (repeatable)" if each.kind == "list" else "")
        rows.append(f"| `{each.var}` | `{flag}` | {each.help} | {each.default_text} |")
    return "\n".join(rows) + "\n"


def dead_letter_bound(dlq_max_bytes: int, producer: Mapping[str, Any]) -> int:
    """Original bytes a dead letter may carry: under both the DLQ topic's limit and the
    producer's ``message.max.bytes`` (librdkafka's default 1000000), 64 KiB at most."""
    limit = min(dlq_max_bytes, int(producer.get("message.max.bytes", 1_000_000)))
    return min(DEFAULT_DEAD_LETTER_RAW, raw_limit_for(limit))
