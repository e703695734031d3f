"""How a command reaches Kafka and which topics it names: the options ``tsi run`` shares
with the client, the gateway and the other commands, declared once here (``Settings``
takes them as its fields), in a leaf module that loads no engine.

>>> topics_from_env({"TSI_GROUP_ID": "shop"}).changelog
'shop.changelog'
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flows.service.connectors.kafka_config import KafkaSettingsError, load_client_settings
from flows.service.connectors.topics import TOPIC_NAME, Topics
from flows.service.runtime.options import (
    ConfigError,
    Option,
    comma_list,
    name,
    optional,
    path,
    seconds,
)

DEFAULT_BROKERS = "127.0.0.1:9092"
DEFAULT_GROUP = "tsi"
#: In a topic's default name, the application id (``application_id``): the topics a
#: deployment owns are named from it, as Kafka Streams names ``<application.id>-...``.
APP = "{app}"

#: The consumer group id, which is also the application id (``application_id``).
GROUP_OPTION = Option(
    "TSI_GROUP_ID",
    "--group-id",
    "Consumer group the offsets of finished epochs are committed to (lag for standard "
    "tools; recovery uses the recovery directory); '' for none. It is the application's "
    "identity: the topics the service owns are named from it (`tsi` when none).",
    optional(name),
    DEFAULT_GROUP,
    empty=True,
)

#: The bootstrap servers.
BROKERS = Option(
    "KAFKA_BOOTSTRAP_SERVERS",
    "--brokers",
    "Kafka bootstrap servers, comma-separated.",
    comma_list,
    DEFAULT_BROKERS,
)
#: The client settings file.
KAFKA_CONFIG = Option(
    "TSI_KAFKA_CONFIG",
    "--kafka-config",
    "TOML of librdkafka client settings (SASL, TLS, ...): [kafka] for both clients, "
    "[kafka.consumer] and [kafka.producer] for one; names as in librdkafka, quoted or "
    'not (security.protocol = "SASL_SSL"). Unknown names are refused; secrets are '
    "masked when the effective settings are logged.",
    optional(path),
)
#: How a command reaches the brokers, as ``tsi run`` does: the bootstrap servers and the
#: client settings file. ``tsi topics``, ``tsi replay`` and ``tsi evaluate`` take it.
CLIENT_OPTIONS = (BROKERS, KAFKA_CONFIG)
#: How long a start waits for a broker.
CONNECT_TIMEOUT = Option(
    "TSI_CONNECT_TIMEOUT",
    "--connect-timeout",
    "Seconds to wait for a broker to answer at start.",
    seconds(0.1),
    "10",
)

#: The topic options, one bundle: ``tsi run``, ``tsi topics create`` and ``check`` take it.
TOPIC_OPTIONS: dict[str, Option] = {
    "requests": Option(
        "TSI_TOPIC_REQUESTS", "--requests-topic", "Requests topic.", name, Topics.requests
    ),
    "feedback": Option(
        "TSI_TOPIC_FEEDBACK", "--feedback-topic", "Feedback topic.", name, Topics.feedback
    ),
    "events": Option(
        "TSI_TOPIC_EVENTS",
        "--events-topic",
        "One topic for requests and feedback (field 'type'); replaces the two.",
        optional(name),
    ),
    "selections": Option(
        "TSI_TOPIC_SELECTIONS", "--selections-topic", "Selections topic.", name, Topics.selections
    ),
    "dead_letters": Option(
        "TSI_TOPIC_DLQ", "--dlq-topic", "Dead-letter topic.", name, Topics.dead_letters
    ),
    "internal": Option(
        "TSI_TOPIC_INTERNAL",
        "--internal-topic",
        "With two input topics: the instance-keyed topic the service copies both into and "
        "serves from, so a restart sees every instance's events in the same order ('' to "
        "serve straight from the two, without that guarantee).",
        optional(name),
        f"{APP}.events.internal",
        shown=f"`{APP}.events.internal`, {APP} the application id (the group id)",
        empty=True,
    ),
    "changelog": Option(
        "TSI_TOPIC_CHANGELOG",
        "--changelog-topic",
        "The compacted topic each shard's log is mirrored to, with --recovery-dir (one "
        "partition a shard; `tsi run` creates it when missing, and so does `tsi topics "
        "create`): the recovery directory is then a cache, rebuilt from it when lost or "
        "damaged. None with --no-changelog or --no-recovery, nor in replays and demos "
        "(files, memory).",
        optional(name),
        f"{APP}.changelog",
        shown=f"`{APP}.changelog`, {APP} the application id (the group id)",
    ),
}


def application_id(env: Mapping[str, str]) -> str:
    """The application a service is: its consumer group id (``DEFAULT_GROUP`` when none is
    given, or '' for none). Its own topics are named from it and its changelog's markers
    carry it, so two services with their own groups never share state.

    >>> [application_id(env) for env in ({}, {"TSI_GROUP_ID": "shop"}, {"TSI_GROUP_ID": ""})]
    ['tsi', 'shop', 'tsi']
    """
    return GROUP_OPTION.read(env) or DEFAULT_GROUP


def topics_from_env(env: Mapping[str, str]) -> Topics:
    """The topics the ``TSI_TOPIC_*`` variables (or their flags) name; a default name's
    ``{app}`` is the application id.

    >>> topics = topics_from_env({"TSI_GROUP_ID": "shop"})
    >>> topics.changelog, topics.internal, topics.requests
    ('shop.changelog', 'shop.events.internal', 'tsi.requests')
    """
    app = application_id(env)
    named = dict(env)
    for option in TOPIC_OPTIONS.values():
        chosen = option.given(env) or (option.empty and option.var in env)
        if option.default and APP in option.default and not chosen:
            named[option.var] = option.default.replace(APP, app)
            if not TOPIC_NAME.fullmatch(named[option.var]):
                raise ConfigError(
                    f"{GROUP_OPTION.names} {app!r} cannot name the topic {named[option.var]!r} "
                    f"(ASCII letters, digits, '.', '_' and '-'): give {option.names}"
                )
    return Topics(**{key: option.read(named) for key, option in TOPIC_OPTIONS.items()})


def client_config(path: str | Path | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(consumer, producer) librdkafka settings from a TOML file (see ``kafka_config``).

    ``[kafka]`` applies to both; ``[kafka.consumer]`` and ``[kafka.producer]`` to one (they
    win over ``[kafka]``). Dotted keys may be quoted or not; every setting is checked by
    librdkafka (unknown name, bad value, wrong side: one-line `ConfigError`).
    """
    if path is None:
        return {}, {}
    try:
        return load_client_settings(path)
    except KafkaSettingsError as exc:
        raise ConfigError(str(exc)) from None
