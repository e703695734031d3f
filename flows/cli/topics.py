"""``tsi topics create`` and ``tsi topics check``: the service's Kafka topics."""

from __future__ import annotations

from pathlib import Path

import typer

from flows.cli.base import (
    BROKERS,
    DLQ_TOPIC,
    EVENTS_TOPIC,
    FEEDBACK_TOPIC,
    INTERNAL_TOPIC,
    KAFKA_CONFIG,
    REQUESTS_TOPIC,
    SELECTIONS_TOPIC,
    app,
    fail,
)
from flows.service.connectors.kafka import Topics
from flows.service.settings import ConfigError, client_config

topics_app = typer.Typer(no_args_is_help=True, help="Create and check the service's Kafka topics.")
app.add_typer(topics_app, name="topics")

_TIMEOUT = typer.Option(30.0, min=0.1, help="Seconds to wait for the brokers.")


def _service_topic_names(
    requests: str,
    feedback: str,
    events: str | None,
    selections: str,
    dlq: str,
    internal: str = Topics.internal,
) -> list[str]:
    from flows.service.connectors.kafka_admin import service_topics

    topics = Topics(requests, feedback, selections, dlq, events or None, internal or None)
    inputs, outputs = service_topics(topics)
    return inputs + outputs


@topics_app.command("create")
def topics_create(
    brokers: str = BROKERS,
    kafka_config: Path | None = KAFKA_CONFIG,
    requests_topic: str = REQUESTS_TOPIC,
    feedback_topic: str = FEEDBACK_TOPIC,
    events_topic: str | None = EVENTS_TOPIC,
    selections_topic: str = SELECTIONS_TOPIC,
    dlq_topic: str = DLQ_TOPIC,
    internal_topic: str = INTERNAL_TOPIC,
    partitions: int | None = typer.Option(
        None, min=1, help="Partitions of new topics (default 3); if given, existing must match."
    ),
    replication_factor: int | None = typer.Option(
        None, min=1, help="Replicas of new topics (default 1); if given, existing must match."
    ),
    dlq_max_message_bytes: int | None = typer.Option(
        None, min=1, help="max.message.bytes of a new dead-letter topic; if given, existing too."
    ),
    timeout: float = _TIMEOUT,
) -> None:
    """Create the service's topics: requests, feedback (or --events-topic), selections, DLQ.

    Idempotent: an existing topic is reported ("exists, 3 partitions, ...") and left as is.
    It is an error (exit status 2, nothing created) only if it contradicts an option given:
    --partitions, --replication-factor or --dlq-max-message-bytes.
    Existing topics are never changed (more partitions would move keys to other partitions).
    Returns once every new topic has leaders.
    """
    from flows.service.connectors.kafka_admin import TopicError, create_topics

    names = _service_topic_names(
        requests_topic, feedback_topic, events_topic, selections_topic, dlq_topic, internal_topic
    )
    limits = {} if dlq_max_message_bytes is None else {dlq_topic: dlq_max_message_bytes}
    try:
        consumer, _ = client_config(kafka_config)
        lines = create_topics(
            brokers.split(","),
            consumer,
            names,
            partitions=partitions,
            replication_factor=replication_factor,
            max_bytes=limits,
            timeout=timeout,
        )
    except (ConfigError, TopicError) as exc:
        fail("topics", str(exc))
    for line in lines:
        typer.echo(line)


@topics_app.command("check")
def topics_check(
    brokers: str = BROKERS,
    kafka_config: Path | None = KAFKA_CONFIG,
    requests_topic: str = REQUESTS_TOPIC,
    feedback_topic: str = FEEDBACK_TOPIC,
    events_topic: str | None = EVENTS_TOPIC,
    selections_topic: str = SELECTIONS_TOPIC,
    dlq_topic: str = DLQ_TOPIC,
    internal_topic: str = INTERNAL_TOPIC,
    timeout: float = _TIMEOUT,
) -> None:
    """Each of the service's topics: partitions, replication, max.message.bytes or missing.

    Exit status 2 when a topic is missing.
    """
    from flows.service.connectors.kafka_admin import TopicError, topic_infos

    names = _service_topic_names(
        requests_topic, feedback_topic, events_topic, selections_topic, dlq_topic, internal_topic
    )
    try:
        consumer, _ = client_config(kafka_config)
        infos = topic_infos(brokers.split(","), consumer, names, timeout)
    except (ConfigError, TopicError) as exc:
        fail("topics", str(exc))
    for name, info in infos.items():
        typer.echo(f"{name}: {'missing' if info is None else info.summary()}")
    missing = [name for name, info in infos.items() if info is None]
    if missing:
        fail("topics", f"missing topic(s) {', '.join(missing)}; create them: tsi topics create")
