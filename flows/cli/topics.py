"""``tsi topics create`` and ``tsi topics check``: the service's Kafka topics."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import typer

from flows.cli.base import app, fail
from flows.cli.options import with_options
from flows.service.connectors.topics import Topics
from flows.service.runtime.settings import (
    CLIENT_OPTIONS,
    GROUP_OPTION,
    TOPIC_OPTIONS,
    ConfigError,
    client_config,
    option,
    topics_from_env,
)
from flows.service.runtime.shard_count import flow_shards, shard_count
from flows.service.runtime.shard_count import internal_partitions as internal_partitions_of
from flows.service.wire.keys import DEFAULT_SHARDS

topics_app = typer.Typer(no_args_is_help=True, help="Create and check the service's Kafka topics.")
app.add_typer(topics_app, name="topics")

_TIMEOUT = typer.Option(30.0, min=0.1, help="Seconds to wait for the brokers.")
#: What both commands are told of the service: its brokers, client settings, application
#: (the group id, which names the topics it owns) and topics.
SERVICE_OPTIONS = (*CLIENT_OPTIONS, GROUP_OPTION, *TOPIC_OPTIONS.values())


def _service_topic_names(topics: Topics) -> list[str]:
    """Every topic the service reads or writes: inputs, then outputs."""
    from flows.service.connectors.kafka_admin import service_topics

    inputs, outputs = service_topics(topics)
    return inputs + outputs


def _read_topics(topics: Topics) -> list[str]:
    """The topics the service reads, whose offsets it commits to its group: the inputs,
    and the internal topic it copies them into (when it has one)."""
    from flows.service.connectors.kafka_admin import service_topics

    inputs, _ = service_topics(topics)
    return inputs + ([topics.internal] if topics.repartitioned else [])


_PARTITIONS = typer.Option(
    None, min=1, help="Partitions of new topics (default 3); if given, existing must match."
)
_REPLICATION_FACTOR = typer.Option(
    None, min=1, help="Replicas of new topics (default 1); if given, existing must match."
)
_SHARDS = typer.Option(
    None,
    help="Shards of the service (1 to 1024): partitions of a new changelog topic, one "
    f"a shard; tsi run then serves with as many. Default: the existing changelog's, "
    f"else {DEFAULT_SHARDS}; if given, an existing changelog must match.",
)
_INTERNAL_PARTITIONS = typer.Option(
    None,
    help="Partitions of a new internal topic: the most members the service can have "
    "(each a Kafka consumer where it is read); must divide --shards. Default: the greatest "
    "common divisor of 32 and --shards (32 for 128 shards).",
)
_DLQ_MAX_MESSAGE_BYTES = typer.Option(
    None, min=1, help="max.message.bytes of a new dead-letter topic; if given, existing too."
)


@topics_app.command("create")
@with_options(*SERVICE_OPTIONS, option("no_changelog"))
def topics_create(
    env: Mapping[str, str],
    partitions: int | None = _PARTITIONS,
    replication_factor: int | None = _REPLICATION_FACTOR,
    shards: str | None = _SHARDS,
    internal_partitions: str | None = _INTERNAL_PARTITIONS,
    dlq_max_message_bytes: int | None = _DLQ_MAX_MESSAGE_BYTES,
    timeout: float = _TIMEOUT,
) -> None:
    """Create the service's topics: requests, feedback (or --events-topic), selections, DLQ,
    the internal topic (--internal-partitions: the most members; by default the greatest
    common divisor of 32 and --shards), and the changelog (--changelog-topic; compacted, one
    partition a shard; none with --no-changelog).

    Idempotent: an existing topic is reported ("exists, 3 partitions, ...") and left as is.
    It is an error (exit status 2, nothing created) only if it contradicts an option given:
    --partitions, --replication-factor or --dlq-max-message-bytes.
    Existing topics are never changed (more partitions would move keys to other partitions).
    Returns once every new topic has leaders.
    """
    from flows.service.connectors.kafka_admin import TopicError, create_topics

    try:
        brokers, config, topics = _service(env)
        if option("no_changelog").read(env):
            topics = replace(topics, changelog=None)
        limits = (
            {} if dlq_max_message_bytes is None else {topics.dead_letters: dlq_max_message_bytes}
        )
        consumer, _ = client_config(config)
        count = _shards(brokers, consumer, topics, shards, timeout)
        internal = _internal_partitions(internal_partitions, count)
        lines = create_topics(
            brokers,
            consumer,
            _service_topic_names(topics),
            partitions=partitions,
            replication_factor=replication_factor,
            max_bytes=limits,
            timeout=timeout,
            changelog=None if topics.changelog is None else (topics.changelog, count),
            internal=(topics.internal, internal) if topics.repartitioned else None,
        )
    except (ConfigError, TopicError) as exc:
        fail("topics", str(exc))
    for line in lines:
        typer.echo(line)


@topics_app.command("check")
@with_options(*SERVICE_OPTIONS, option("no_changelog"))
def topics_check(env: Mapping[str, str], timeout: float = _TIMEOUT) -> None:
    """Each of the service's topics: partitions, replication, max.message.bytes or missing;
    then the consumer group's lag on every partition the service reads: the offset it
    committed, the partition's end, and the messages between them.

    Exit status 2 when a topic is missing (but the changelog, which tsi run creates).
    """
    from flows.service.connectors.kafka_admin import TopicError, group_lag, topic_infos

    try:
        brokers, config, topics = _service(env)
        if option("no_changelog").read(env):
            topics = replace(topics, changelog=None)
        group_id = GROUP_OPTION.read(env)
        consumer, _ = client_config(config)
        infos = topic_infos(brokers, consumer, _service_topic_names(topics), timeout)
        read = [t for t in _read_topics(topics) if infos.get(t) is not None]
        lags = group_lag(brokers, consumer, group_id, read, timeout) if group_id else []
    except (ConfigError, TopicError) as exc:
        fail("topics", str(exc))
    for name, info in infos.items():
        made = " (tsi run creates it)" if name == topics.changelog else ""
        typer.echo(f"{name}: {'missing' + made if info is None else info.summary()}")
    for line in _lag_lines(group_id, read, lags):
        typer.echo(line)
    missing = [name for name, info in infos.items() if info is None and name != topics.changelog]
    if missing:
        fail("topics", f"missing topic(s) {', '.join(missing)}; create them: tsi topics create")


def _shards(
    brokers: list[str], consumer: dict, topics: Topics, given: str | None, timeout: float
) -> int:
    """The shard count ``tsi topics create`` makes the changelog for: ``--shards`` (checked),
    else the existing changelog topic's (``shard_count.flow_shards``), else the default;
    ``ConfigError`` naming both when they disagree."""
    from flows.service.connectors.kafka_admin import topic_infos

    try:
        requested = None if given is None else shard_count(given)
    except ValueError as exc:
        raise ConfigError(f"--shards {exc}") from None
    existing = None
    if topics.changelog is not None:
        info = topic_infos(brokers, consumer, [topics.changelog], timeout)[topics.changelog]
        existing = None if info is None else info.partitions
    return flow_shards(requested, None, existing)


def _internal_partitions(given: str | None, shards: int) -> int:
    """The internal topic's partitions ``tsi topics create`` makes it with
    (``shard_count.internal_partitions``); ``ConfigError`` naming a bad one."""
    try:
        return internal_partitions_of(given, shards)
    except ValueError as exc:
        raise ConfigError(f"--internal-partitions {exc}") from None


def _service(env: Mapping[str, str]) -> tuple[list[str], Path | None, Topics]:
    """The brokers, the client settings file and the topics ``env`` gives (``ConfigError``)."""
    brokers, config = (each.read(env) for each in CLIENT_OPTIONS)
    return brokers, config, topics_from_env(env)


def _lag_lines(group: str | None, read: list[str], lags: list) -> list[str]:
    """What ``tsi topics check`` says of the group's lag on the topics the service reads."""
    if not group:
        return ["no consumer group given (--group-id ''): lag not shown"]
    if not read:
        return []
    if all(lag.committed is None for lag in lags):
        return [
            f"consumer group {group!r} has committed nothing on {', '.join(read)}: tsi run "
            "commits each finished epoch's offsets, so it has not finished one with this "
            "group (is --group-id / TSI_GROUP_ID the one tsi run uses?)"
        ]
    total = sum(lag.lag or 0 for lag in lags)
    lines = [f"consumer group {group!r}, lag on the topics the service reads:"]
    lines += [f"  {lag.summary()}" for lag in lags]
    lines.append(f"  total lag: {total} message{'' if total == 1 else 's'}")
    return lines
