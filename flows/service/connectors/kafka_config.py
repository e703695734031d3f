"""Kafka client settings: the TOML file, secrets masked in logs, librdkafka logs rate-limited.

The settings file (``--kafka-config`` / ``TSI_KAFKA_CONFIG``)::

    [kafka]                       # both clients
    security.protocol = "SASL_SSL"      # a dotted key: the same as "security.protocol"
    "sasl.mechanism" = "SCRAM-SHA-512"
    [kafka.consumer]              # the consumer only
    fetch.min.bytes = 1
    [kafka.producer]              # the producer only
    compression.type = "lz4"

TOML reads an unquoted dotted key as nested tables; they are flattened back into the
dotted librdkafka names (only ``consumer`` and ``producer`` directly under ``[kafka]`` are
the side tables). Every name and value is checked by librdkafka itself, one setting at a
time on a client that has no brokers (nothing is contacted): an unknown name, a bad value
or a setting of the other side (``group.id`` for the producer; librdkafka only warns and
ignores it, which hides the mistake) is an error naming the setting, its table and the
file. ``bootstrap.servers`` is refused too: the brokers come from ``--brokers`` /
``KAFKA_BOOTSTRAP_SERVERS`` only. Settings that only fail together (SASL without
``sasl.username``, a missing certificate file with ``security.protocol = "SSL"``) are
reported when a client is first built (`flows.service.connectors.kafka.check_topics` at start).
"""

from __future__ import annotations

import logging
import re
import threading
import time
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka import KafkaError as ConfluentKafkaError

SIDES = ("consumer", "producer")
MASK = "****"

#: A setting whose name contains one of these holds a secret.
SECRET_WORDS = ("password", "secret", "token", "passphrase", "credential", "private")
#: Secrets whose names say nothing of it.
SECRET_SETTINGS = frozenset(
    {
        "ssl.key.pem",
        "ssl_key",
        "ssl.keystore.password",
        "sasl.oauthbearer.config",
        "sasl.oauthbearer.extensions",
        "sasl.jaas.config",
    }
)

#: The brokers come from --brokers / KAFKA_BOOTSTRAP_SERVERS only.
BROKER_SETTINGS = frozenset({"bootstrap.servers", "metadata.broker.list"})

#: Settings an admin client needs to reach the brokers (security, addresses, sockets).
CONNECTION_PREFIXES = (
    "bootstrap.",
    "security.",
    "sasl.",
    "ssl.",
    "ssl_",
    "client.",
    "socket.",
    "broker.",
    "api.version.",
    "enable.ssl.",
    "enable.sasl.",
    "https.",
    "plugin.",
    "reconnect.",
    "connections.",
    "oauth_cb",
)


#: Defaults of every client of the service (the settings file overrides them): a broker
#: back after an outage is found again within a second or two, not minutes.
RECONNECT_DEFAULTS: dict[str, Any] = {
    # The pause between two connection attempts to a broker doubles up to this cap
    # (librdkafka's own: 10 s), and every connection (each partition leader's, each
    # client's) waits out its own: a broker back just after a long pause was found only a
    # whole cap later. One second keeps the attempts to a down broker few.
    "reconnect.backoff.ms": 100,
    "reconnect.backoff.max.ms": 1000,
    # A broker that accepts a connection and does not answer it (hung, or still loading
    # its logs after a restart) is given up on after this and connected again, instead
    # of after librdkafka's 30 s.
    "socket.connection.setup.timeout.ms": 5000,
    # A request the broker took and never answered (the broker died or hung holding it)
    # is failed and sent again after this, not after librdkafka's 60 s: the writes and
    # fetches in flight when the broker went are what the return waits for.
    "socket.timeout.ms": 10000,
    # A failed request (no leader yet, a leader that moved) is asked again after a
    # pause doubling up to this: librdkafka's defaults, written down as the service's.
    "retry.backoff.ms": 100,
    "retry.backoff.max.ms": 1000,
    # Partitions without a known leader (all of them when a broker returns) have their
    # metadata asked again this often until they have one.
    "topic.metadata.refresh.fast.interval.ms": 100,
}


def with_reconnect_defaults(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` over `RECONNECT_DEFAULTS` (what the settings file sets wins).

    >>> with_reconnect_defaults({"socket.timeout.ms": 30000})["socket.timeout.ms"]
    30000
    >>> with_reconnect_defaults({})["reconnect.backoff.max.ms"]
    1000
    """
    return {**RECONNECT_DEFAULTS, **config}


class KafkaSettingsError(ValueError):
    """The Kafka settings file is unreadable or names a setting librdkafka refuses."""


# ------------------------------------------------------------------------------ the file
def load_client_settings(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(consumer, producer) settings of a TOML file, flattened and checked by librdkafka."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise KafkaSettingsError(f"cannot read Kafka config {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise KafkaSettingsError(f"Kafka config {path} is not valid TOML: {exc}") from None
    other = sorted(k for k in data if k != "kafka")
    if other:
        raise KafkaSettingsError(
            f"{path}: unknown table or key {other[0]!r}; Kafka settings go under [kafka], "
            "[kafka.consumer] and [kafka.producer]"
        )
    table = data.get("kafka", {})
    if not isinstance(table, dict):
        raise KafkaSettingsError(f"{path}: [kafka] must be a table")
    common = flatten({k: v for k, v in table.items() if k not in SIDES}, f"{path}: [kafka]")
    sides: dict[str, dict[str, Any]] = {}
    for side in SIDES:
        extra = table.get(side, {})
        if not isinstance(extra, dict):
            raise KafkaSettingsError(f"{path}: [kafka.{side}] must be a table")
        sides[side] = flatten(extra, f"{path}: [kafka.{side}]")
    check_settings(common, sides["consumer"], sides["producer"], str(path))
    return {**common, **sides["consumer"]}, {**common, **sides["producer"]}


def flatten(table: Mapping[str, Any], where: str, prefix: str = "") -> dict[str, Any]:
    """Nested tables as dotted names: ``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; scalars only.

    >>> flatten({"security": {"protocol": "SSL"}, "linger.ms": 5}, "x")
    {'security.protocol': 'SSL', 'linger.ms': 5}
    """
    out: dict[str, Any] = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        items = flatten(value, where, f"{name}.") if isinstance(value, dict) else {name: value}
        for flat, scalar in items.items():
            if not isinstance(scalar, str | int | float | bool):
                raise KafkaSettingsError(
                    f"{where}: Kafka setting {flat!r} must be a scalar "
                    f"(string, number or boolean), got {scalar!r}"
                )
            if flat in out:
                raise KafkaSettingsError(f"{where}: Kafka setting {flat!r} is set twice")
            out[flat] = scalar
    return out


# ------------------------------------------------------------------- librdkafka's opinion
def check_settings(
    common: Mapping[str, Any],
    consumer: Mapping[str, Any],
    producer: Mapping[str, Any],
    where: str,
) -> None:
    """Raise `KafkaSettingsError` for the first setting librdkafka refuses on its side(s)."""
    for table, settings, kinds in (
        ("[kafka]", common, SIDES),
        ("[kafka.consumer]", consumer, ("consumer",)),
        ("[kafka.producer]", producer, ("producer",)),
    ):
        for key, value in settings.items():
            for kind in kinds:
                problem = setting_problem(kind, key, value)
                if problem is not None:
                    raise KafkaSettingsError(f"{where}: {table}: {problem}")


def setting_problem(kind: str, key: str, value: Any) -> str | None:
    """Why a `kind` ("consumer" or "producer") client refuses ``key = value``, or None.

    >>> setting_problem("producer", "linger.ms", 5) is None
    True
    >>> setting_problem("producer", "linger.msec", 5)
    "unknown Kafka setting 'linger.msec' (librdkafka: No such configuration property)"
    >>> setting_problem("producer", "group.id", "g")
    "'group.id' is a consumer setting: librdkafka ignores it here; move it to [kafka.consumer]"
    """
    if key in BROKER_SETTINGS:  # also keeps the check from connecting anywhere
        return (
            f"{key!r} does not belong in the Kafka config: give the brokers with --brokers "
            "or KAFKA_BOOTSTRAP_SERVERS"
        )
    warnings: list[str] = []
    config: dict[str, Any] = {"logger": _capture(warnings)}
    if kind == "consumer":
        config["group.id"] = "tsi-settings-check"  # required to build a consumer
    if key == "security.protocol":  # alone, SASL would default to GSSAPI (not built in)
        config["sasl.mechanism"] = "OAUTHBEARER"  # needs nothing else to build a client
    config[key] = value
    try:
        client = Consumer(config) if kind == "consumer" else Producer(config)
        client.poll(0)  # serves the configuration warnings to the logger
        if kind == "consumer":
            client.close()
    except KafkaException as exc:
        reason = exc.args[0].str() if exc.args else str(exc)
        if reason.startswith("No such configuration property"):
            return f"unknown Kafka setting {key!r} (librdkafka: No such configuration property)"
        return f"invalid value {value!r} for Kafka setting {key!r} ({reason})"
    except Exception as exc:  # python-level settings (error_cb, logger, ...) raise others
        return f"invalid value {value!r} for Kafka setting {key!r} ({exc})"
    for text in warnings:
        other = re.search(r"is a (consumer|producer) property and will be ignored", text)
        if other:
            side = other.group(1)
            return (
                f"{key!r} is a {side} setting: librdkafka ignores it here; "
                f"move it to [kafka.{side}]"
            )
    return None


class _ListHandler(logging.Handler):
    def __init__(self, into: list[str]) -> None:
        super().__init__()
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record.getMessage())


def _capture(into: list[str]) -> logging.Logger:
    """A logger outside the logging tree that appends every message to ``into``."""
    logger = logging.Logger("tsi.kafka.settings-check", logging.DEBUG)
    logger.addHandler(_ListHandler(into))
    return logger


def connection_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of ``config`` an admin client needs to reach the same brokers."""
    return {k: v for k, v in config.items() if k.startswith(CONNECTION_PREFIXES)}


# --------------------------------------------------------------------- what gets logged
def is_secret(name: str) -> bool:
    """Whether the value of setting ``name`` must not be logged.

    >>> [is_secret(n) for n in ("sasl.password", "ssl.key.pem", "sasl.username")]
    [True, True, False]
    """
    lowered = name.lower()
    return lowered in SECRET_SETTINGS or any(word in lowered for word in SECRET_WORDS)


def shown_value(name: str, value: Any) -> str:
    """``value`` as logged: masked for secrets, ``true``/``false``, callables by name."""
    if is_secret(name):
        return MASK
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, logging.Logger):
        return f"<logger {value.name}>"
    if callable(value):
        return f"<{getattr(value, '__qualname__', type(value).__name__)}>"
    return str(value)


def describe_settings(label: str, settings: Mapping[str, Any]) -> str:
    """One line ``label: name=value, ...`` (sorted, secrets masked).

    >>> describe_settings("producer", {"sasl.password": "hunter2", "acks": "all"})
    'producer: acks=all, sasl.password=****'
    """
    shown = ", ".join(f"{k}={shown_value(k, settings[k])}" for k in sorted(settings))
    return f"{label}: {shown or '(librdkafka defaults)'}"


def settings_lines(consumer: Mapping[str, Any], producer: Mapping[str, Any]) -> list[str]:
    """The lines to log at start: the effective consumer and producer settings, masked."""
    return [describe_settings("consumer", consumer), describe_settings("producer", producer)]


# ------------------------------------------------------------- librdkafka logs, bounded
@dataclass
class _Window:
    start: float
    passed: int
    suppressed: int
    logger: str
    sample: str = ""
    level: int = logging.DEBUG  # the highest level suppressed


class RateLimitFilter(logging.Filter):
    """At most ``burst`` records per message pattern per ``interval`` seconds.

    The pattern is the librdkafka facility plus the message with every number replaced
    (ports, counts, ids differ between repeats). Once the window of a pattern is over,
    the first record that arrives (of any pattern) emits, through the same logger and
    before itself, one line per pattern that was cut: ``suppressed K similar messages in
    the last S s: <the last of them>`` (at the highest level cut); `flush` emits the
    pending ones at once. Attach it to the logger the clients log to (`kafka_logger`
    does), not to a handler.
    """

    def __init__(
        self, burst: int = 3, interval: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        if burst < 1 or interval <= 0:
            msg = f"burst must be >= 1 and interval > 0, got {burst!r}, {interval!r}"
            raise ValueError(msg)
        self.burst = burst
        self.interval = interval
        self._clock = clock
        self._windows: dict[tuple[str, str], _Window] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "tsi_summary", False):
            return True
        key, now = pattern_of(record), self._clock()
        with self._lock:
            due = self._expired(now)
            window = self._windows.get(key)
            if window is None:
                window = self._windows[key] = _Window(now, 0, 0, record.name)
            window.passed += 1
            keep = window.passed <= self.burst
            if not keep:
                window.suppressed += 1
                window.sample = record.getMessage()
                window.level = max(window.level, record.levelno)
        self._emit(due, now)
        return keep

    def flush(self) -> None:
        """Emit the summary of every pattern with suppressed records now."""
        now = self._clock()
        with self._lock:
            due = [w for w in self._windows.values() if w.suppressed]
            self._windows.clear()
        self._emit(due, now)

    def _expired(self, now: float) -> list[_Window]:
        """Remove the windows that are over; return those that suppressed something."""
        over = [k for k, w in self._windows.items() if now - w.start >= self.interval]
        return [w for w in (self._windows.pop(k) for k in over) if w.suppressed]

    def _emit(self, windows: Iterable[_Window], now: float) -> None:
        for w in windows:
            logger = logging.getLogger(w.logger)
            summary = logger.makeRecord(
                w.logger,
                w.level,
                __file__,
                0,
                "suppressed %d similar messages in the last %.0f s: %s",
                (w.suppressed, now - w.start, w.sample),
                None,
            )
            summary.tsi_summary = True
            logger.handle(summary)


def pattern_of(record: logging.LogRecord) -> tuple[str, str]:
    """(facility, message with numbers as ``#``) of a record; client names are dropped.

    confluent_kafka logs ``"%s [%s] %s"`` with (facility, client name, message).
    """
    args = record.args
    if isinstance(args, tuple) and len(args) == 3 and all(isinstance(a, str) for a in args):
        facility, text = args[0], args[2]
    else:
        facility, text = record.name, record.getMessage()
    return facility, re.sub(r"\d+", "#", text)


def kafka_logger(name: str = "tsi.kafka", burst: int = 3, interval: float = 60.0) -> logging.Logger:
    """The logger Kafka clients log to, with one `RateLimitFilter` (added once)."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, RateLimitFilter) for f in logger.filters):
        logger.addFilter(RateLimitFilter(burst, interval))
    return logger


def with_rate_limited_logs(
    config: Mapping[str, Any], logger: logging.Logger | None = None
) -> dict[str, Any]:
    """``config`` plus ``logger`` and ``error_cb``: librdkafka's logs and errors go to
    ``logger`` (default `kafka_logger()`), where `RateLimitFilter` bounds them.

    Without this librdkafka writes every failed connection attempt to stderr, many times
    a second during a broker outage. Errors are logged at WARNING (fatal ones at ERROR;
    connection failures at DEBUG: librdkafka logs them already, as ``FAIL``). An
    ``error_cb`` already in ``config`` is still called. librdkafka hands logs to Python
    while the client is polled (consume, poll, flush), from that thread.
    """
    logger = logger or kafka_logger()
    chained: Callable[[ConfluentKafkaError], None] | None = config.get("error_cb")

    def on_error(err: ConfluentKafkaError) -> None:
        if err.fatal():
            level = logging.ERROR
        elif err.code() == ConfluentKafkaError._TRANSPORT:  # also logged as FAIL
            level = logging.DEBUG
        else:
            level = logging.WARNING
        logger.log(level, "%s [%s] %s", "ERROR", err.name(), err.str())
        if chained is not None:
            chained(err)

    return {**config, "logger": logger, "error_cb": on_error}
