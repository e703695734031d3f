"""What the service (``tsi run``), ``tsi demo`` and ``tsi replay`` write, joined into a
bandit-feedback log: the arm each request was served, its propensity, and its loss.

Three streams, as files or Kafka topics:

* **selections**: the service's answers, ``{"experiment", "unit", "request_id", "arm",
  "arm_name", "prob", "round", "why"?}`` (the selections topic, ``selections.jsonl``;
  ``why`` says what served the arm, ``bandit`` when absent);
* **feedback**: ``{"experiment", "unit"?, "request_id", "loss" | "reward", …}`` as sent
  (the feedback topic, ``feedback.jsonl``), or mixed with the requests;
* **requests** (optional, needed for contexts and eligible arms): ``{"experiment",
  "unit"?, "request_id", "context"?, "eligible"?, …}``; with the feedback in one combined
  stream each line has ``"type": "request"`` or ``"feedback"`` (the events topic,
  ``events.jsonl``).

The join is on (experiment, unit, request_id): a request's first selection (a retry's
answer repeats it) with its first valid feedback (what the service applies; a duplicate
changes nothing). A selection without feedback (expired, lost) and feedback without a
selection (refused, or outside the window read) are counted, not evaluated. Feedback and
requests are checked by the service's own parsers: a line the service would dead-letter is
counted as ``refused``.

>>> sel = b'{"experiment":"e","unit":null,"request_id":"r1","arm":1,"arm_name":"b","prob":0.5}'
>>> fb = b'{"experiment":"e","request_id":"r1","reward":3}'
>>> joined = join_served([sel], [fb])
>>> [(r.arm, r.prob, r.loss, r.why) for r in joined.log.records], joined.unmatched_selections
([(1, 0.5, -3.0, 'bandit')], 0)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from flows.service.wire.events import (
    DeadLetter,
    Feedback,
    Origin,
    Request,
    parse_event,
    parse_feedback,
    parse_request,
)
from flows.tools.evaluation.logs import (
    BANDIT,
    BanditRecord,
    EvaluationError,
    Log,
    check_why,
    is_int,
    json_object,
)

Key = tuple[str, str | None, str]  # experiment, unit, request_id
Context = int | dict[str, str] | None  # an index, or named attributes' values
Eligible = tuple[int | str, ...] | None

#: the files ``tsi demo`` and ``tsi replay`` write into their output directory
SELECTIONS_FILE, FEEDBACK_FILE, EVENTS_FILE, REGISTRY_FILE, INPUTS_FILE = (
    "selections.jsonl",
    "feedback.jsonl",
    "events.jsonl",
    "registry.toml",
    "inputs.json",
)


@dataclass(frozen=True)
class Served:
    """A joined log and what could not be joined."""

    log: Log
    selections: int  # distinct requests answered
    unmatched_selections: int  # answered, no (valid) feedback: expired or lost
    unmatched_feedback: int  # valid feedback for no selection read
    refused: int  # feedback or request lines the service would dead-letter
    retries: int  # repeated answers to the same request (one record each)

    def summary(self) -> str:
        """One sentence on the join, for reports."""
        return (
            f"{len(self.log):,} of {self.selections:,} served requests have their feedback; "
            f"{self.unmatched_selections:,} have none (expired or lost), "
            f"{self.unmatched_feedback:,} feedback events match no selection, "
            f"{self.refused:,} input lines were refused, {self.retries:,} answers repeated."
        )


def join_served(
    selections: Iterable[bytes],
    feedback: Iterable[bytes],
    requests: Iterable[bytes] | None = None,
    source: str = "<served>",
) -> Served:
    """Join selection lines with feedback lines (and request lines, for contexts).

    ``feedback`` may be a combined stream (lines with ``"type"``): its requests then give
    the contexts as ``requests`` would. Records follow the order of the selections.
    """
    answered, order, retries = _selections(selections, source)
    losses: dict[Key, float] = {}
    contexts: dict[Key, tuple[Context, Eligible]] = {}
    refused = _read_inputs(feedback, requests, losses, contexts)
    records = []
    for line, key in order:
        if key in losses:
            arm, prob, why = answered[key]
            context, eligible = contexts.get(key, (None, None))
            records.append(
                BanditRecord(line, key[0], key[1], context, arm, prob, losses[key], why, eligible)
            )
    if not records:
        raise EvaluationError(
            f"{source}: no served request has its feedback ({len(order):,} selections, "
            f"{len(losses):,} feedback events): nothing to evaluate"
        )
    return Served(
        Log(source, BANDIT, tuple(records)),
        selections=len(order),
        unmatched_selections=len(order) - len(records),
        unmatched_feedback=sum(1 for key in losses if key not in answered),
        refused=refused,
        retries=retries,
    )


def _selections(
    lines: Iterable[bytes], source: str
) -> tuple[dict[Key, tuple[int, float, str]], list[tuple[int, Key]], int]:
    """(arm, prob, why) by request, the requests in order with their line, and the
    repeats."""
    answered: dict[Key, tuple[int, float, str]] = {}
    order: list[tuple[int, Key]] = []
    retries = 0
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        key, *served = _selection(json_object(raw, source, number), f"{source}:{number}")
        if key in answered:
            retries += 1
            continue
        answered[key] = (served[0], served[1], served[2])
        order.append((number, key))
    return answered, order, retries


def _selection(data: dict[str, Any], where: str) -> tuple[Key, int, float, str]:
    experiment, unit, rid = data.get("experiment"), data.get("unit"), data.get("request_id")
    arm, prob = data.get("arm"), data.get("prob")
    if not isinstance(experiment, str) or not isinstance(rid, str):
        raise EvaluationError(f"{where}: a selection needs 'experiment' and 'request_id'")
    if unit is not None and not isinstance(unit, str):
        raise EvaluationError(f"{where}: unit must be a string or null, got {unit!r:.80}")
    if not is_int(arm, 0):
        raise EvaluationError(f"{where}: arm must be an integer >= 0, got {arm!r:.80}")
    if isinstance(prob, bool) or not isinstance(prob, int | float) or not 0.0 < prob <= 1.0:
        raise EvaluationError(f"{where}: prob must be in (0, 1], got {prob!r:.80}")
    why = check_why(data.get("why", "bandit"), where)
    return (experiment, unit, rid), arm, float(prob), why


def _read_inputs(
    feedback: Iterable[bytes],
    requests: Iterable[bytes] | None,
    losses: dict[Key, float],
    contexts: dict[Key, tuple[Context, Eligible]],
) -> int:
    """Fill the first valid loss, and the context and eligible arms, of each request; the
    refused lines."""
    refused = 0
    streams: list[tuple[Iterable[bytes], Any]] = [(feedback, None)]
    if requests is not None:
        streams.append((requests, parse_request))
    for lines, only in streams:
        for number, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            event = _parsed(raw, number, only)
            if isinstance(event, DeadLetter):
                refused += 1
            elif isinstance(event, Feedback):
                losses.setdefault((event.experiment, event.unit, event.request_id), event.loss)
            elif isinstance(event, Request):
                key = (event.experiment, event.unit, event.request_id)
                contexts.setdefault(key, (event.context, event.eligible))
    return refused


def _parsed(raw: bytes, number: int, only: Any) -> Any:
    """A line through the service's parser: the combined one when it names its ``type``."""
    origin = Origin("evaluate", None, number)
    if only is None:  # a line that is no JSON object is refused by either parser
        only = parse_event if b'"type"' in raw else parse_feedback
    return only(raw, origin)


def read_file_lines(path: Path) -> list[bytes]:
    """The lines of a file (``EvaluationError`` naming it when it cannot be read)."""
    try:
        return path.read_bytes().splitlines()
    except OSError as exc:
        raise EvaluationError(f"cannot read {path}: {exc.strerror}") from None


def served_directory(directory: Path) -> Served:
    """The join of what ``tsi demo`` or ``tsi replay`` wrote into ``directory``: its
    ``selections.jsonl`` with ``events.jsonl`` (requests and feedback) or, without it,
    ``feedback.jsonl``; for a replay, with the logs its ``inputs.json`` names."""
    selections = directory / SELECTIONS_FILE
    if not selections.is_file():
        raise EvaluationError(f"{directory}: no {SELECTIONS_FILE} (not a tsi demo/replay output)")
    replayed = replay_inputs(directory)
    if replayed is not None:
        inputs = replayed.get("events") or replayed.get("feedback")
        requests = replayed.get("requests")
        if inputs is None:
            topics = ", ".join(replayed.get("topics") or ["?"])
            raise EvaluationError(
                f"{directory}: replayed from Kafka ({topics}): evaluate the service's topics "
                "with --brokers, --selections-topic and --events-topic or --feedback-topic"
            )
        lines = read_file_lines(Path(inputs))
        extra = None if requests is None else read_file_lines(Path(requests))
        return join_served(read_file_lines(selections), lines, extra, str(directory))
    events, feedback = directory / EVENTS_FILE, directory / FEEDBACK_FILE
    inputs = events if events.is_file() else feedback
    if not inputs.is_file():
        raise EvaluationError(f"{directory}: neither {EVENTS_FILE} nor {FEEDBACK_FILE}")
    return join_served(read_file_lines(selections), read_file_lines(inputs), None, str(directory))


def replay_inputs(directory: Path) -> dict[str, Any] | None:
    """What ``tsi replay`` says it replayed (``inputs.json``), or None for another
    directory."""
    path = directory / INPUTS_FILE
    if not path.is_file():
        return None
    try:
        data = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise EvaluationError(f"{path}: cannot be read ({exc})") from None
    if not isinstance(data, dict):
        raise EvaluationError(f"{path}: not what tsi replay writes")
    return data
