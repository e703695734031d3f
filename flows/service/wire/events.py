"""Event contracts: parsing of incoming messages and serialisation of outgoing ones.

Every incoming message becomes either a typed event or a ``DeadLetter`` that keeps the
original bytes, the reason and where the message came from. Nothing raises.

>>> origin = Origin("tsi.requests", 0, 17)
>>> parse_request(b'{"experiment": "home", "request_id": "r1"}', origin).request_id
'r1'
>>> parse_request(b'{"experiment": "home"}', origin).reason
'missing_field'
"""

from __future__ import annotations

import base64
import hashlib
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson

from flows.guardrails.spec import METRIC_NAME
from flows.service.wire.fields import (
    MAX_ABS_LOSS,
    MAX_ID_LENGTH,
    MAX_MESSAGE_BYTES,
    arm_ok,
    identifier_ok,
    index_ok,
    loss_ok,
    number_ok,
    size_ok,
    time_ok,
)

TEN_YEARS = 10 * 365.25 * 86400.0
#: ``ts`` must lie within this many seconds of the wall clock (``ts_window``; inf: any finite)
DEFAULT_TS_WINDOW = TEN_YEARS
#: original bytes a dead letter carries whole; longer ones carry this prefix, size and SHA-256
DEFAULT_DEAD_LETTER_RAW = 64 * 1024
MAX_DETAIL_CHARS = 500
#: room for a dead letter's other fields and the record's overhead in a Kafka message
DEAD_LETTER_ENVELOPE = 8 * 1024


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a message came from: a topic (or file) with partition and offset (or line),
    and the time Kafka stamped it with (Unix seconds), when it came from Kafka."""

    source: str
    partition: int | None = None
    offset: int | None = None
    time: float | None = None


@dataclass(frozen=True, slots=True)
class Request:
    """A decision request; the instance is the experiment, or experiment + unit."""

    experiment: str
    unit: str | None
    request_id: str
    context: int | dict[str, str] | None  # an index, or named attributes' values
    ts: float | None
    raw: bytes
    origin: Origin
    eligible: tuple[int | str, ...] | None = None  # the arms (names or indices) it may get


@dataclass(frozen=True, slots=True)
class Feedback:
    """The loss of a served selection (``reward`` arrives as ``loss = -reward``)."""

    experiment: str
    unit: str | None
    request_id: str
    loss: float
    arm: int | str | None  # the served arm's index or name, if the sender echoes it
    ts: float | None
    raw: bytes
    origin: Origin
    #: guardrail metrics sent with it, (name, value) pairs (``flows.guardrails``), or None
    guardrails: tuple[tuple[str, float], ...] | None = None


@dataclass(frozen=True, slots=True)
class Selection:
    """The answer to a request; ``prob`` is the probability the arm was served with (all
    of the allocation applied: floor, holdout, burn-in, eligibility) and ``why`` what
    served it: ``bandit``, ``holdout``, ``burn_in`` or ``forced``. Its JSON on the
    selections topic has one home: ``flows.service.wire._records.selection_json``."""

    experiment: str
    unit: str | None
    request_id: str
    instance: str
    arm: int
    arm_name: str
    prob: float
    round: int
    why: str = "bandit"
    #: which of a shard's two outputs this is (``DeadLetter`` says True): an answer
    dead_letter: ClassVar[bool] = False


def raw_limit_for(max_message_bytes: int) -> int:
    """The most original bytes a dead letter may carry to fit ``max_message_bytes``.

    Base64 makes 3 bytes 4; the other fields and Kafka's record overhead fit in
    ``DEAD_LETTER_ENVELOPE``.

    >>> raw_limit_for(1_000_000)
    743856
    """
    return max(0, (max_message_bytes - DEAD_LETTER_ENVELOPE) * 3 // 4)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """An input that changed nothing, with the reason (a code and a human sentence).

    Its JSON carries the original bytes whole up to ``raw_limit`` (base64), else their
    first ``raw_limit`` bytes with ``"truncated": true``, the original size and SHA-256,
    so a dead letter always fits its topic.

    >>> letter = DeadLetter("oversize", "too big", b"x" * 10, Origin("t", 0, 5))
    >>> data = orjson.loads(letter.to_json(raw_limit=4))
    >>> data["raw_b64"], data["raw_size"], data["truncated"]
    ('eHh4eA==', 10, True)
    """

    reason: str
    detail: str
    raw: bytes
    origin: Origin
    instance: str | None = None
    #: which of a shard's two outputs this is (``Selection`` says False): a dead letter
    dead_letter: ClassVar[bool] = True

    def to_json(self, raw_limit: int = DEFAULT_DEAD_LETTER_RAW) -> bytes:
        raw, detail = self.raw, self.detail
        if len(detail) > MAX_DETAIL_CHARS:
            detail = detail[: MAX_DETAIL_CHARS - 1] + "…"
        letter = {
            "reason": self.reason,
            "detail": detail,
            "source": self.origin.source,
            "partition": self.origin.partition,
            "offset": self.origin.offset,
            "instance": self.instance,
            "raw_b64": base64.b64encode(raw[:raw_limit]).decode("ascii"),
            "raw_size": len(raw),
            "truncated": len(raw) > raw_limit,
        }
        if len(raw) > raw_limit:
            letter["raw_sha256"] = hashlib.sha256(raw).hexdigest()
        return orjson.dumps(letter)


def minimal_dead_letter(letter_json: bytes, why: str) -> bytes:
    """A few hundred bytes standing for a dead letter that could not be written: where the
    message came from, its reason, the original's size and SHA-256, no original bytes.

    >>> full = DeadLetter("oversize", "too big", b"abc", Origin("t", 1, 9)).to_json()
    >>> small = orjson.loads(minimal_dead_letter(full, "MSG_SIZE_TOO_LARGE"))
    >>> small["offset"], small["raw_size"], small["truncated"], small["raw_b64"]
    (9, 3, True, '')
    """
    try:
        data = orjson.loads(letter_json)
        raw = base64.b64decode(data.get("raw_b64", ""))
        size = data.get("raw_size", len(raw))
        digest = data.get("raw_sha256") or hashlib.sha256(raw).hexdigest()
        letter = {k: data.get(k) for k in ("reason", "source", "partition", "offset", "instance")}
        detail = str(data.get("detail", ""))[:200]
    except (orjson.JSONDecodeError, ValueError, TypeError, AttributeError):
        size, digest = len(letter_json), hashlib.sha256(letter_json).hexdigest()
        letter = {"reason": "unreadable_dead_letter"}
        detail = ""
    letter |= {
        "detail": f"{detail} [the full dead letter was refused: {why[:200]}]",
        "raw_b64": "",
        "raw_size": size,
        "truncated": True,
        "raw_sha256": digest,
    }
    return orjson.dumps(letter)


class _InvalidError(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def _load(raw: bytes) -> dict[str, Any]:
    if not isinstance(raw, bytes | bytearray | memoryview):
        raise _InvalidError("wrong_type", f"message must be bytes, got {type(raw).__name__}")
    if not size_ok(len(raw)):
        raise _InvalidError("oversize", f"message has {len(raw)} bytes, limit {MAX_MESSAGE_BYTES}")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise _InvalidError("malformed_json", f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise _InvalidError("not_an_object", f"expected a JSON object, got {type(data).__name__}")
    return data


def missing_field(name: str) -> str:
    """The detail of a ``missing_field`` dead letter for a required field ``name``.

    >>> missing_field("unit")
    "field 'unit' is required"
    """
    return f"field {name!r} is required"


def _identifier(data: dict[str, Any], name: str, required: bool = True) -> str | None:
    value = data.get(name)
    if identifier_ok(value):  # the common case, first
        return value
    if value is None:
        if required:
            raise _InvalidError("missing_field", missing_field(name))
        return None
    if not isinstance(value, str):
        raise _InvalidError("wrong_type", f"{name} must be a string, got {value!r}")
    if not value or len(value) > MAX_ID_LENGTH:
        raise _InvalidError("bad_value", f"{name} must have 1 to {MAX_ID_LENGTH} characters")
    return value


def _optional_index(data: dict[str, Any], name: str) -> int | None:
    value = data.get(name)
    if index_ok(value):
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise _InvalidError("wrong_type", f"{name} must be an integer, got {value!r}")
    if value < 0:
        raise _InvalidError("bad_value", f"{name} must be >= 0, got {value!r}")
    return value


def _optional_arm(data: dict[str, Any]) -> int | str | None:
    """The served arm a feedback echoes: its index, or its name (which survives arms being
    reordered in the registry)."""
    value = data.get("arm")
    if arm_ok(value):
        return value
    if isinstance(value, str):
        if not value or len(value) > MAX_ID_LENGTH:
            raise _InvalidError("bad_value", f"arm must have 1 to {MAX_ID_LENGTH} characters")
        return value
    return _optional_index(data, "arm")


def _context(data: dict[str, Any]) -> int | dict[str, str] | None:
    """An index, or a non-empty object of attribute names to values (strings)."""
    value = data.get("context")
    if not isinstance(value, dict):
        return _optional_index(data, "context")
    if not value or not all(identifier_ok(name) and identifier_ok(v) for name, v in value.items()):
        raise _InvalidError(
            "wrong_type",
            f"context must be an integer or an object of attribute names to strings, got {value!r}",
        )
    return value


def _eligible(data: dict[str, Any]) -> tuple[int | str, ...] | None:
    """The arms a request may get: a list of arm names or indices (checked against the
    experiment's arms where it is served)."""
    value = data.get("eligible")
    if value is None:
        return None
    if not isinstance(value, list) or not all(arm_ok(arm) and arm is not None for arm in value):
        raise _InvalidError(
            "wrong_type", f"eligible must be a list of arm names or indices, got {value!r}"
        )
    return tuple(value)


def _optional_time(data: dict[str, Any], window: float) -> float | None:
    value = data.get("ts")
    if value is None:
        return None
    if not number_ok(value):
        raise _InvalidError("wrong_type", f"ts must be a number, got {value!r}")
    ts = float(value)
    if not time_ok(ts, window, time.time()):
        raise _InvalidError(
            "bad_value",
            f"ts {ts!r} is not within {window:g} s of the wall clock (Unix seconds expected)",
        )
    return ts


def _loss(data: dict[str, Any]) -> float:
    has_loss, has_reward = data.get("loss") is not None, data.get("reward") is not None
    if has_loss and has_reward:
        raise _InvalidError("bad_value", "give 'loss' or 'reward', not both")
    if not has_loss and not has_reward:
        raise _InvalidError("missing_field", "one of 'loss' or 'reward' is required")
    name = "loss" if has_loss else "reward"
    value = data[name]
    if not number_ok(value):
        raise _InvalidError("wrong_type", f"{name} must be a number, got {value!r}")
    value = float(value)
    if not loss_ok(value):
        raise _InvalidError("loss_out_of_range", f"|{name}| must be at most {MAX_ABS_LOSS:g}")
    return value if has_loss else -value


#: the most guardrail metrics one feedback may send
MAX_GUARDRAILS = 32
#: the largest magnitude of a guardrail value (its square is summed: it stays finite)
MAX_GUARDRAIL_VALUE = 1e12


def _guardrails(data: dict[str, Any]) -> tuple[tuple[str, float], ...] | None:
    """A feedback's ``guardrails``: an object of metric names (``METRIC_NAME``) to finite
    numbers, e.g. ``{"latency_ms": 120.5, "error": 1}``."""
    value = data.get("guardrails")
    if value is None:
        return None
    if not isinstance(value, dict) or not 0 < len(value) <= MAX_GUARDRAILS:
        raise _InvalidError(
            "wrong_type",
            f"guardrails must be an object of 1 to {MAX_GUARDRAILS} metric names to numbers, "
            f"got {value!r}",
        )
    for name, number in value.items():
        if not METRIC_NAME.fullmatch(name):
            raise _InvalidError(
                "bad_value", f"guardrail name {name!r} is not letters, digits and _ (up to 64)"
            )
        if not number_ok(number) or not abs(number) <= MAX_GUARDRAIL_VALUE:
            raise _InvalidError(
                "bad_value",
                f"guardrail {name!r} must be a number within {MAX_GUARDRAIL_VALUE:g}, "
                f"got {number!r}",
            )
    return tuple((name, float(number)) for name, number in value.items())


def _request(data: dict[str, Any], raw: bytes, origin: Origin, window: float) -> Request:
    return Request(
        experiment=_identifier(data, "experiment"),
        unit=_identifier(data, "unit", required=False),
        request_id=_identifier(data, "request_id"),
        context=_context(data),
        ts=_optional_time(data, window),
        raw=bytes(raw),
        origin=origin,
        eligible=_eligible(data),
    )


def _feedback(data: dict[str, Any], raw: bytes, origin: Origin, window: float) -> Feedback:
    return Feedback(
        experiment=_identifier(data, "experiment"),
        unit=_identifier(data, "unit", required=False),
        request_id=_identifier(data, "request_id"),
        loss=_loss(data),
        arm=_optional_arm(data),
        ts=_optional_time(data, window),
        raw=bytes(raw),
        origin=origin,
        guardrails=_guardrails(data),
    )


def _event(data: dict[str, Any], raw: bytes, origin: Origin, window: float) -> Request | Feedback:
    kind = data.get("type")
    if kind == "request":
        return _request(data, raw, origin, window)
    if kind == "feedback":
        return _feedback(data, raw, origin, window)
    detail = f"field 'type' must be 'request' or 'feedback', got {kind!r}"
    raise _InvalidError("missing_field" if kind is None else "bad_value", detail)


def _parse(build: Any, raw: bytes, origin: Origin, window: float) -> Any:
    try:
        return build(_load(raw), raw, origin, window)
    except _InvalidError as bad:
        return DeadLetter(bad.reason, bad.detail, _as_bytes(raw), origin)
    except Exception as exc:  # a parser bug must not stop the flow on this message
        return DeadLetter("internal_error", f"{type(exc).__name__}: {exc}", _as_bytes(raw), origin)


def parse_request(
    raw: bytes, origin: Origin, ts_window: float = DEFAULT_TS_WINDOW
) -> Request | DeadLetter:
    """A decision request, or the dead letter that says why not."""
    return _parse(_request, raw, origin, ts_window)


def parse_feedback(
    raw: bytes, origin: Origin, ts_window: float = DEFAULT_TS_WINDOW
) -> Feedback | DeadLetter:
    """A feedback event (loss or reward of a served request), or its dead letter."""
    return _parse(_feedback, raw, origin, ts_window)


def parse_event(
    raw: bytes, origin: Origin, ts_window: float = DEFAULT_TS_WINDOW
) -> Request | Feedback | DeadLetter:
    """A message of the combined stream: ``"type"`` is ``"request"`` or ``"feedback"``.

    One topic for both kinds, keyed by instance, fixes the order in which an instance sees
    its requests and feedback; that order is what makes a replay after a crash re-emit
    identical selections. ``ts`` outside ``ts_window`` seconds of the wall clock is
    refused (``bad_value``).
    """
    return _parse(_event, raw, origin, ts_window)


@dataclass(frozen=True)
class ParseBySource:
    """The parser of the internal topic, whose copies name the topic they came from: a
    copy of ``requests`` is parsed as a request, any other as feedback. The compiled lane
    (``flows.service.wire._parse``) knows it as it knows the three above.

    >>> parse = ParseBySource("tsi.requests")
    >>> parse(b'{"experiment":"e","request_id":"r1"}', Origin("tsi.requests")).request_id
    'r1'
    >>> parse(b'{"experiment":"e","request_id":"r1"}', Origin("tsi.feedback")).reason
    'missing_field'
    """

    requests: str

    def __call__(
        self, raw: bytes, origin: Origin, ts_window: float = DEFAULT_TS_WINDOW
    ) -> Request | Feedback | DeadLetter:
        parse = parse_request if origin.source == self.requests else parse_feedback
        return parse(raw, origin, ts_window)


def _as_bytes(raw: Any) -> bytes:
    if isinstance(raw, bytes | bytearray | memoryview):
        return bytes(raw)
    return repr(raw).encode("utf-8", "replace")
