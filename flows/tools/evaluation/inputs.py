"""Where ``tsi evaluate`` reads its log from: a log file, a demo or replay directory, the
service's output files, or its Kafka topics; and which registries it evaluates.

Exactly one source: ``log`` (a file, or a directory), or ``selections`` with ``events`` or
``feedback`` (and optionally ``requests``), or the same as topics with ``brokers``. The
registries default to the directory's ``registry.toml``.

>>> Inputs(selections=Path("s.jsonl")).problem()
'--selections needs --events or --feedback'
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flows.tools.evaluation.logs import EvaluationError, Log, load_log
from flows.tools.evaluation.served import (
    REGISTRY_FILE,
    Served,
    join_served,
    read_file_lines,
    replay_inputs,
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


def read_inputs(given: Inputs, registries: list[Path]) -> tuple[Data, list[Path]]:
    """The log and the registry files to evaluate (``EvaluationError`` naming what is
    missing or unreadable)."""
    problem = given.problem()
    if problem is not None:
        raise EvaluationError(problem)
    if given.log is not None and given.log.is_dir():
        served = served_directory(given.log)
        replayed = replay_inputs(given.log)
        default = given.log / REGISTRY_FILE
        if replayed is not None and replayed.get("registry"):
            default = Path(replayed["registry"])
        return Data(served.log, served), registries or _existing(default)
    if given.log is not None:
        return Data(load_log(given.log)), _required(registries)
    served = _served_files(given) if given.selections is not None else _served_topics(given)
    return Data(served.log, served), _required(registries)


def _existing(path: Path) -> list[Path]:
    if not path.is_file():
        raise EvaluationError(f"no {path}: give --registry")
    return [path]


def _required(registries: list[Path]) -> list[Path]:
    if not registries:
        raise EvaluationError("give --registry: the configuration to evaluate")
    return registries


def _served_files(given: Inputs) -> Served:
    inputs = given.events if given.events is not None else given.feedback
    return join_served(
        read_file_lines(given.selections),
        read_file_lines(inputs),
        None if given.requests is None else read_file_lines(given.requests),
        str(given.selections),
    )


def _served_topics(given: Inputs) -> Served:
    """The join of the topics as they are now (every partition, from the start)."""
    from flows.tools.replay_input import ReplayError, kafka_range

    def lines(topic: str | None) -> list[bytes] | None:
        if topic is None:
            return None
        try:
            return [raw for raw, _ in kafka_range(given.brokers, topic, config=given.consumer)]
        except ReplayError as exc:
            raise EvaluationError(str(exc)) from None

    inputs = given.events_topic if given.events_topic is not None else given.feedback_topic
    return join_served(
        lines(given.selections_topic),
        lines(inputs),
        lines(given.requests_topic),
        f"{given.brokers}/{given.selections_topic}",
    )
