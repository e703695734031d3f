"""Where ``tsi evaluate`` reads its log from: a log file, a demo or replay directory, the
service's output files, or its Kafka topics; and which registries it evaluates.

Exactly one source: ``log`` (a file, or a directory), or ``selections`` with ``events`` or
``feedback`` (and optionally ``requests``), or the same as topics with ``brokers``. The
registries to evaluate default to the directory's (``served.directory_registry``).

A served log is joined by the rules of the **served registry**, the one the service ran
with (``served``): ``--served-registry`` if given, else the directory's own registry (a
``tsi demo`` or ``tsi replay`` directory), else the first ``--registry``.

>>> Inputs(selections=Path("s.jsonl")).problem()
'--selections needs --events or --feedback'
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flows.service.instances.registry import Registry
from flows.tools.evaluation.logs import EvaluationError, Log, load_log
from flows.tools.evaluation.served import (
    Line,
    Served,
    directory_registry,
    join_served,
    read_file_lines,
    served_directory,
)


@dataclass(frozen=True)
class Inputs:
    """The sources named on the command line."""

    log: Path | None = None
    selections: Path | None = None
    events: Path | None = None
    feedback: Path | None = None
    requests: Path | None = None
    brokers: str | None = None
    selections_topic: str | None = None
    events_topic: str | None = None
    feedback_topic: str | None = None
    requests_topic: str | None = None
    consumer: dict[str, Any] | None = None  # the topics' client settings (librdkafka's)

    def problem(self) -> str | None:
        """Why these sources cannot be read together, or None."""
        files = self.selections is not None
        topics = self.selections_topic is not None
        if sum([self.log is not None, files, topics]) != 1:
            return (
                "give one source: a LOG (file or directory), --selections, or "
                "--selections-topic (TSI_TOPIC_SELECTIONS)"
            )
        if files and (self.events is None) == (self.feedback is None):
            return "--selections needs --events or --feedback"
        if topics and (self.events_topic is None) == (self.feedback_topic is None):
            return "--selections-topic needs --events-topic or --feedback-topic"
        if topics and not self.brokers:
            return "--selections-topic needs --brokers (or KAFKA_BOOTSTRAP_SERVERS)"
        return None


@dataclass(frozen=True)
class Data:
    """The log to evaluate and, for a served log, the join it came from."""

    log: Log
    served: Served | None = None


def read_inputs(
    given: Inputs, registries: list[Path], served_registry: Path | None = None
) -> tuple[Data, list[Path]]:
    """The log and the registry files to evaluate (``EvaluationError`` naming what is
    missing or unreadable; ``RegistryError`` for a bad served registry). A served log is
    joined by the rules of ``served_registry`` (see the module)."""
    problem = given.problem()
    if problem is not None:
        raise EvaluationError(problem)
    if given.log is not None and given.log.is_dir():
        default = directory_registry(given.log)
        served_by = served_registry or (default if default.is_file() else None)
        served = served_directory(given.log, _served_rules(served_by, registries))
        return Data(served.log, served), registries or _existing(default)
    if given.log is not None:
        return Data(load_log(given.log)), _required(registries)
    rules = _served_rules(served_registry, _required(registries))
    read = _served_files if given.selections is not None else _served_topics
    served = read(given, rules)
    return Data(served.log, served), registries


def _served_rules(served_registry: Path | None, registries: list[Path]) -> Registry | None:
    """The served registry: ``served_registry``, else the first of ``registries``."""
    path = served_registry or (registries[0] if registries else None)
    return None if path is None else Registry.load(path)


def _existing(path: Path) -> list[Path]:
    if not path.is_file():
        raise EvaluationError(f"no {path}: give --registry")
    return [path]


def _required(registries: list[Path]) -> list[Path]:
    if not registries:
        raise EvaluationError("give --registry: the configuration to evaluate")
    return registries


def _served_files(given: Inputs, registry: Registry | None) -> Served:
    inputs = given.events if given.events is not None else given.feedback
    return join_served(
        read_file_lines(given.selections),
        read_file_lines(inputs),
        None if given.requests is None else read_file_lines(given.requests),
        str(given.selections),
        registry,
    )


def _served_topics(given: Inputs, registry: Registry | None) -> Served:
    """The join of the topics as they are now (every partition, from the start), each
    message with the time Kafka stamped it with."""
    from flows.tools.replay_input import ReplayError, kafka_range

    def lines(topic: str | None) -> list[Line] | None:
        if topic is None:
            return None
        try:
            messages = kafka_range(given.brokers, topic, config=given.consumer)
            return [(raw, origin.time) for raw, origin in messages]
        except ReplayError as exc:
            raise EvaluationError(str(exc)) from None

    inputs = given.events_topic if given.events_topic is not None else given.feedback_topic
    return join_served(
        lines(given.selections_topic),
        lines(inputs),
        lines(given.requests_topic),
        f"{given.brokers}/{given.selections_topic}",
        registry,
    )
