"""Reading evaluation logs: JSON Lines, one record a line, every line checked on its own.

>>> log = read_log(['{"experiment": "home", "arm": 1, "prob": 0.5, "loss": 2}', ""])
>>> log.kind, log.experiments, log.records[0].prob
('bandit', ['home'], 0.5)
>>> read_log(['{"experiment": "home", "arm": 0, "prob": 1.5, "loss": 0}'])
Traceback (most recent call last):
flows.tools.evaluation.logs.EvaluationError: <log>:1: prob must be in (0, 1], got 1.5
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from flows.service.wire.events import MAX_ABS_LOSS, MAX_ID_LENGTH
from tsi_core._kernel import WHYS

FULL_INFORMATION = "full-information"
BANDIT = "bandit"


class EvaluationError(ValueError):
    """A log or an evaluation request that cannot be evaluated; one line of text."""


class FullRecord(NamedTuple):
    """One full-information row: every arm's loss."""

    line: int
    experiment: str
    unit: str | None
    context: int | None
    losses: tuple[float, ...]


class BanditRecord(NamedTuple):
    """One bandit-feedback row: the logged arm, its logged propensity and its loss; what
    served it (``why``, one of ``tsi_core._kernel.WHYS``) and the arms the request allowed
    (``eligible``: names or indices, None for all), checked against the experiment's arms
    by ``evaluate``."""

    line: int
    experiment: str
    unit: str | None
    context: int | dict[str, str] | None  # an index, or named attributes' values
    arm: int
    prob: float
    loss: float
    why: str = "bandit"
    eligible: tuple[int | str, ...] | None = None


@dataclass(frozen=True)
class Log:
    """A parsed log: its ``kind`` (``FULL_INFORMATION`` or ``BANDIT``) and its records."""

    source: str
    kind: str
    records: tuple[FullRecord, ...] | tuple[BanditRecord, ...]

    @property
    def experiments(self) -> list[str]:
        """Experiment names in the order of their first record."""
        return list(dict.fromkeys(r.experiment for r in self.records))

    def __len__(self) -> int:
        return len(self.records)


def load_log(path: str | Path) -> Log:
    """Read and validate a JSON Lines log file (see ``read_log``)."""
    try:
        with open(path, "rb") as handle:
            return read_log(handle, str(path))
    except OSError as exc:
        raise EvaluationError(f"cannot read log {path}: {exc.strerror}") from None


def read_log(lines: Iterable[str | bytes], source: str = "<log>") -> Log:
    """Parse and validate log lines (a file object or a list of strings).

    Checks each line on its own (JSON object, field types, ``prob`` in (0, 1], finite
    losses with |loss| <= 1e300, like the service's feedback) and that all lines are of one
    kind. Checks that need the registry (arm counts, contexts, units) are made by
    ``evaluate``.
    """
    records: list[Any] = []
    kind: str | None = None
    first_line = 0
    for number, raw in enumerate(lines, start=1):
        text = raw.strip()
        if not text:
            continue
        data = json_object(text, source, number)
        this_kind = _kind_of(data, source, number)
        if kind is None:
            kind, first_line = this_kind, number
        elif this_kind != kind:
            raise EvaluationError(
                f"{source}:{number}: a {this_kind} record, but line {first_line} is a {kind} "
                "record: a log holds one kind"
            )
        records.append(_record(data, this_kind, f"{source}:{number}", number))
    if kind is None:
        raise EvaluationError(f"{source}: the log has no records")
    return Log(source, kind, tuple(records))


def json_object(text: str | bytes, source: str, number: int) -> dict[str, Any]:
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise EvaluationError(f"{source}:{number}: not valid JSON ({exc}): {_clip(text)}") from None
    if not isinstance(data, dict):
        raise EvaluationError(f"{source}:{number}: expected a JSON object, got {_clip(data)}")
    return data


def _kind_of(data: dict[str, Any], source: str, number: int) -> str:
    full = "losses" in data
    bandit = [k for k in ("arm", "prob", "loss") if k in data]
    if full and bandit:
        raise EvaluationError(
            f"{source}:{number}: both 'losses' (full information) and {bandit} "
            "(bandit feedback): a record is one or the other"
        )
    served = _served_hint(data)
    if served is not None and not full:
        raise EvaluationError(f"{source}:{number}: {served}")
    if not full and not bandit:
        raise EvaluationError(
            f"{source}:{number}: neither 'losses' (full information) nor 'arm', 'prob', "
            f"'loss' (bandit feedback) in {_clip(data)}"
        )
    return FULL_INFORMATION if full else BANDIT


def _served_hint(data: dict[str, Any]) -> str | None:
    """What to do with a line of the service's own output or input, else None."""
    how = (
        "tsi evaluate joins it with the rest: give the directory tsi demo wrote, or "
        "--selections FILE with --events FILE (or --feedback FILE)"
    )
    if "arm_name" in data and "loss" not in data:
        return f"a selection written by the service, without its loss: {how}"
    if data.get("type") in ("request", "feedback"):
        return f"a {data['type']} sent to the service, without the arm it was served: {how}"
    return None


def _record(data: dict[str, Any], kind: str, where: str, number: int) -> Any:
    """The record of one line (``where`` is ``source:line``), its fields checked."""
    experiment = _identifier(data, "experiment", where, required=True)
    unit = _identifier(data, "unit", where, required=False)
    context = data.get("context")
    if kind == BANDIT and isinstance(context, dict) and context:
        if not all(isinstance(v, str) for v in context.values()):
            raise EvaluationError(
                f"{where}: a named context maps attributes to strings, got {_clip(context)}"
            )
    elif context is not None and not is_int(context, 0):
        raise EvaluationError(f"{where}: context must be an integer >= 0, got {context!r}")
    if kind == FULL_INFORMATION:
        losses = _losses(data["losses"], where)
        return FullRecord(number, experiment, unit, context, losses)
    arm, prob, loss = _bandit_fields(data, where)
    why = check_why(data.get("why", "bandit"), where)
    eligible = check_eligible(data.get("eligible"), where)
    if why == "forced" and prob != 1.0:
        raise EvaluationError(f"{where}: a forced arm is served with prob 1, got prob {prob!r}")
    return BanditRecord(number, experiment, unit, context, arm, prob, loss, why, eligible)


def _losses(losses: Any, where: str) -> tuple[float, ...]:
    if not isinstance(losses, list) or not losses:
        raise EvaluationError(
            f"{where}: losses must be a non-empty list of numbers, got {_clip(losses)}"
        )
    for m, value in enumerate(losses):
        _check_loss(value, f"losses[{m}]", where)
    return tuple(float(x) for x in losses)


def _bandit_fields(data: dict[str, Any], where: str) -> tuple[int, float, float]:
    for name in ("arm", "prob", "loss"):
        if data.get(name) is None:
            raise EvaluationError(f"{where}: field {name!r} is required in a bandit record")
    arm, prob = data["arm"], data["prob"]
    if not is_int(arm, 0):
        raise EvaluationError(f"{where}: arm must be an integer >= 0, got {arm!r}")
    if not _is_real(prob) or not 0.0 < prob <= 1.0:
        raise EvaluationError(f"{where}: prob must be in (0, 1], got {prob!r}")
    return arm, float(prob), _check_loss(data["loss"], "loss", where)


def check_why(why: Any, where: str) -> str:
    """``why`` if it is one of ``WHYS`` (what served an arm), else ``EvaluationError``."""
    if not isinstance(why, str) or why not in WHYS:
        raise EvaluationError(f"{where}: why must be one of {', '.join(WHYS)}, got {_clip(why)}")
    return why


def check_eligible(eligible: Any, where: str) -> tuple[int | str, ...] | None:
    """A request's eligible arms as a tuple (None: every arm): a non-empty list of
    distinct arm names or indices, else ``EvaluationError`` naming it."""
    if eligible is None:
        return None
    if (
        not isinstance(eligible, list)
        or not eligible
        or not all(isinstance(a, str) or is_int(a, 0) for a in eligible)
        or len(set(eligible)) != len(eligible)
    ):
        raise EvaluationError(
            f"{where}: eligible must be a non-empty list of distinct arm names or indices, "
            f"got {_clip(eligible)}"
        )
    return tuple(eligible)


def _identifier(data: dict[str, Any], name: str, where: str, required: bool) -> str | None:
    value = data.get(name)
    if value is None:
        if required:
            raise EvaluationError(f"{where}: field {name!r} is required")
        return None
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_LENGTH:
        raise EvaluationError(
            f"{where}: {name} must be a string of 1 to {MAX_ID_LENGTH} characters, "
            f"got {_clip(value)}"
        )
    return value


def _check_loss(value: Any, name: str, where: str) -> float:
    if not _is_real(value) or not abs(value) <= MAX_ABS_LOSS:
        raise EvaluationError(
            f"{where}: {name} must be a finite number with |{name}| <= {MAX_ABS_LOSS:g}, "
            f"got {_clip(value)}"
        )
    return float(value)


def is_int(value: Any, minimum: int) -> bool:
    """Whether ``value`` is an int (not a bool) >= ``minimum``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _is_real(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _clip(value: Any) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
