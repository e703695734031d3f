"""What the service (``tsi run``), ``tsi demo`` and ``tsi replay`` write, joined into a
bandit-feedback log: the arm each request was served, its propensity, and the loss the
service applied to it.

Three streams, as files or Kafka topics:

* **selections**: the service's answers, ``{"experiment", "unit", "request_id", "arm",
  "arm_name", "prob", "round", "why"?}`` (the selections topic, ``selections.jsonl``;
  ``why`` says what served the arm, ``bandit`` when absent);
* **feedback**: ``{"experiment", "unit"?, "request_id", "loss" | "reward", "ts"?, …}`` as
  sent (the feedback topic, ``feedback.jsonl``), or mixed with the requests;
* **requests** (optional, needed for contexts, eligible arms and windows):
  ``{"experiment", "unit"?, "request_id", "context"?, "eligible"?, "ts"?, …}``; with the
  feedback in one combined stream each line has ``"type": "request"`` or ``"feedback"``
  (the events topic, ``events.jsonl``).

The join is on (experiment, unit, request_id): a request's first selection (a retry's
answer repeats it) with the loss the service applied, by the rules of the **served
registry** (the one the service ran with; ``flows.tools.evaluation.windows``): the valid
feedback within the experiment's window (``feedback_ttl`` after the request: later
feedback is the service's ``late_feedback``) combined by its ``aggregate``, or its
``default_loss`` when the window got none. Without the served registry each request's
first valid feedback is its loss and no window is checked. A selection whose loss the
service did not apply (no feedback and no default: expired, lost), one whose window was
still open at the end of the log, and feedback without a selection (refused, or outside
the window read) are counted, not evaluated. Feedback and requests are checked by the
service's own parsers: a line the service would dead-letter is counted as ``refused``.

An event's time is its ``ts`` (the time the service uses on event time: ``tsi demo``,
``tsi replay``), else the time Kafka stamped it with when read from a topic (what ``tsi
run`` uses), else unknown; a request's time is that of its first request line. Where a
time is missing the window is not checked (see ``windows``) and the summary says how many
requests that concerns.

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

from flows.service.instances.registry import Registry
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
from flows.tools.evaluation.windows import Rules, Tally, Timed, applied_loss

Key = tuple[str, str | None, str]  # experiment, unit, request_id
Context = int | dict[str, str] | None  # an index, or named attributes' values
Eligible = tuple[int | str, ...] | None
#: a line as read: its bytes, or its bytes with the time Kafka stamped it with
Line = bytes | tuple[bytes, float | None]

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
    unmatched_selections: int  # answered, no loss applied: no feedback, no default
    unmatched_feedback: int  # valid feedback for no selection read
    refused: int  # feedback or request lines the service would dead-letter
    retries: int  # repeated answers to the same request (one record each)
    defaulted: int = 0  # requests given their experiment's default_loss
    combined: int = 0  # requests whose loss combines several feedback (aggregate)
    late_feedback: int = 0  # feedback after its window
    open_windows: int = 0  # requests whose window was open at the end of the log
    untimed: int = 0  # requests whose window could not be checked (no time)

    def summary(self) -> str:
        """One sentence on the join, for reports."""
        return (
            f"{len(self.log):,} of {self.selections:,} served requests have their loss "
            f"({self.defaulted:,} the default_loss of a window without feedback, "
            f"{self.combined:,} several feedback combined); "
            f"{self.unmatched_selections:,} have none (expired or lost), "
            f"{self.open_windows:,} were still in their window at the end of the log, "
            f"{self.untimed:,} could not have their window checked (no time); "
            f"{self.late_feedback:,} feedback events came after their window, "
            f"{self.unmatched_feedback:,} match no selection, "
            f"{self.refused:,} input lines were refused, {self.retries:,} answers repeated."
        )


@dataclass
class _Read:
    """What the feedback and request lines say, by request."""

    feedback: dict[Key, list[Timed]]  # valid feedback, in the order it came
    requests: dict[Key, tuple[Context, Eligible, float | None]]  # the first request's
    end: float | None = None  # the newest time read
    refused: int = 0


def join_served(
    selections: Iterable[Line],
    feedback: Iterable[Line],
    requests: Iterable[Line] | None = None,
    source: str = "<served>",
    registry: Registry | None = None,
) -> Served:
    """Join selection lines with feedback lines (and request lines, for contexts and
    times) by the rules of ``registry``, the one the service ran with (every experiment
    of the selections must be in it; None: first feedback, no window, no default).

    ``feedback`` may be a combined stream (lines with ``"type"``): its requests then give
    the contexts as ``requests`` would. Records follow the order of the selections.
    """
    answered, order, retries = _selections(selections, source)
    read = _read_inputs(feedback, requests)
    rules = _rules(registry, {key[0] for _, key in order}, source)
    tally = Tally()
    records = []
    for line, key in order:
        context, eligible, served_at = read.requests.get(key, (None, None, None))
        loss = applied_loss(rules[key[0]], served_at, read.feedback.get(key, ()), read.end, tally)
        if loss is not None:
            arm, prob, why = answered[key]
            records.append(
                BanditRecord(line, key[0], key[1], context, arm, prob, loss, why, eligible)
            )
    if not records:
        raise EvaluationError(
            f"{source}: no served request has its loss ({len(order):,} selections, "
            f"{sum(map(len, read.feedback.values())):,} feedback events): nothing to evaluate"
        )
    return Served(
        Log(source, BANDIT, tuple(records)),
        selections=len(order),
        unmatched_selections=len(order) - len(records) - tally.open,
        unmatched_feedback=sum(1 for key in read.feedback if key not in answered),
        refused=read.refused,
        retries=retries,
        defaulted=tally.defaulted,
        combined=tally.combined,
        late_feedback=tally.late,
        open_windows=tally.open,
        untimed=tally.untimed,
    )


def _rules(registry: Registry | None, experiments: set[str], source: str) -> dict[str, Rules]:
    """Each experiment's rules in the served registry (``EvaluationError`` naming one it
    lacks)."""
    if registry is None:
        return {name: Rules() for name in experiments}
    missing = sorted(experiments - set(registry.experiments))
    if missing:
        raise EvaluationError(
            f"{source}: experiment{'s' * (len(missing) > 1)} {missing} of the selections "
            f"not in the served registry (it has {sorted(registry.experiments)})"
        )
    return {name: Rules.of(registry.experiments[name]) for name in experiments}


def _selections(
    lines: Iterable[Line], source: str
) -> tuple[dict[Key, tuple[int, float, str]], list[tuple[int, Key]], int]:
    """(arm, prob, why) by request, the requests in order with their line, and the
    repeats."""
    answered: dict[Key, tuple[int, float, str]] = {}
    order: list[tuple[int, Key]] = []
    retries = 0
    for number, line in enumerate(lines, start=1):
        raw = line if isinstance(line, bytes) else line[0]
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


def _read_inputs(feedback: Iterable[Line], requests: Iterable[Line] | None) -> _Read:
    """Every valid feedback (loss and time) of each request in the order it came, the
    context, eligible arms and time of its first request, the newest time, the refused
    lines."""
    read = _Read({}, {})
    streams: list[tuple[Iterable[Line], Any]] = [(feedback, None)]
    if requests is not None:
        streams.append((requests, parse_request))
    for lines, only in streams:
        for number, line in enumerate(lines, start=1):
            raw, stamped = (line, None) if isinstance(line, bytes) else line
            if not raw.strip():
                continue
            event = _parsed(raw, number, only)
            if isinstance(event, DeadLetter):
                read.refused += 1
                continue
            at = event.ts if event.ts is not None else stamped
            if at is not None and (read.end is None or at > read.end):
                read.end = at
            key = (event.experiment, event.unit, event.request_id)
            if isinstance(event, Feedback):
                read.feedback.setdefault(key, []).append((event.loss, at))
            elif isinstance(event, Request):
                read.requests.setdefault(key, (event.context, event.eligible, at))
    return read


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


def served_directory(directory: Path, registry: Registry | None = None) -> Served:
    """The join of what ``tsi demo`` or ``tsi replay`` wrote into ``directory``: its
    ``selections.jsonl`` with ``events.jsonl`` (requests and feedback) or, without it,
    ``feedback.jsonl``; for a replay, with the logs its ``inputs.json`` names. The served
    registry is ``registry``, else the one the directory names (``directory_registry``)
    if it is there."""
    selections = directory / SELECTIONS_FILE
    if not selections.is_file():
        raise EvaluationError(f"{directory}: no {SELECTIONS_FILE} (not a tsi demo/replay output)")
    if registry is None and directory_registry(directory).is_file():
        registry = Registry.load(directory_registry(directory))
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
        return join_served(read_file_lines(selections), lines, extra, str(directory), registry)
    events, feedback = directory / EVENTS_FILE, directory / FEEDBACK_FILE
    inputs = events if events.is_file() else feedback
    if not inputs.is_file():
        raise EvaluationError(f"{directory}: neither {EVENTS_FILE} nor {FEEDBACK_FILE}")
    lines = read_file_lines(inputs)
    return join_served(read_file_lines(selections), lines, None, str(directory), registry)


def directory_registry(directory: Path) -> Path:
    """The registry a ``tsi demo`` or ``tsi replay`` directory ran with: the one its
    ``inputs.json`` names, else its ``registry.toml`` (which may be missing)."""
    replayed = replay_inputs(directory)
    if replayed is not None and replayed.get("registry"):
        return Path(replayed["registry"])
    return directory / REGISTRY_FILE


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
