"""Parsing of incoming messages: every bad input becomes a dead letter with its reason."""

import base64

import orjson
import pytest

from flows.service.wire._records import selection_json
from flows.service.wire.events import (
    MAX_MESSAGE_BYTES,
    DeadLetter,
    Feedback,
    Origin,
    Request,
    Selection,
    parse_feedback,
    parse_request,
)

ORIGIN = Origin("tsi.requests", 3, 41)


def test_valid_request_and_feedback_keep_their_fields_and_bytes():
    raw = b'{"experiment":"e","unit":"u7","request_id":"r","context":2,"ts":1767225600.5}'
    req = parse_request(raw, ORIGIN)
    assert isinstance(req, Request)
    assert (req.experiment, req.unit, req.request_id, req.context, req.ts) == (
        "e",
        "u7",
        "r",
        2,
        1767225600.5,
    )
    assert req.raw == raw and req.origin == ORIGIN
    fb = parse_feedback(b'{"experiment":"e","request_id":"r","reward":3}', ORIGIN)
    assert isinstance(fb, Feedback) and fb.loss == -3.0 and fb.unit is None


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"{not json", "malformed_json"),
        (b'{"experiment": "e", "request_id": NaN}', "malformed_json"),
        (b"\xff\xfe", "malformed_json"),
        (b"[1, 2]", "not_an_object"),
        (b'"text"', "not_an_object"),
        (b'{"request_id": "r"}', "missing_field"),
        (b'{"experiment": "e"}', "missing_field"),
        (b'{"experiment": 5, "request_id": "r"}', "wrong_type"),
        (b'{"experiment": "e", "request_id": ["r"]}', "wrong_type"),
        (b'{"experiment": "", "request_id": "r"}', "bad_value"),
        (b'{"experiment": "e", "request_id": "' + b"x" * 300 + b'"}', "bad_value"),
        (b'{"experiment": "e", "request_id": "r", "context": "2"}', "wrong_type"),
        (b'{"experiment": "e", "request_id": "r", "context": true}', "wrong_type"),
        (b'{"experiment": "e", "request_id": "r", "context": -1}', "bad_value"),
        (b'{"experiment": "e", "request_id": "r", "ts": "now"}', "wrong_type"),
        (b'{"experiment": "e", "request_id": "r", "ts": 1e308}', "bad_value"),
        (b'{"experiment": "e", "request_id": "r", "ts": -1e12}', "bad_value"),
        (b'{"experiment": "e", "request_id": "r", "ts": 0}', "bad_value"),
        (
            b'{"experiment": "e", "request_id": "r", "pad": "' + b"x" * MAX_MESSAGE_BYTES + b'"}',
            "oversize",
        ),
    ],
)
def test_bad_requests_become_dead_letters_with_reason_and_origin(raw, reason):
    out = parse_request(raw, ORIGIN)
    assert isinstance(out, DeadLetter)
    assert out.reason == reason and out.raw == raw and out.origin == ORIGIN
    assert out.detail  # a sentence for a person


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b'{"experiment": "e", "request_id": "r"}', "missing_field"),
        (b'{"experiment": "e", "request_id": "r", "loss": 1, "reward": 1}', "bad_value"),
        (b'{"experiment": "e", "request_id": "r", "loss": "1"}', "wrong_type"),
        (b'{"experiment": "e", "request_id": "r", "loss": false}', "wrong_type"),
        (b'{"experiment": "e", "request_id": "r", "loss": 1e400}', "malformed_json"),
        (b'{"experiment": "e", "request_id": "r", "loss": Infinity}', "malformed_json"),
        (b'{"experiment": "e", "request_id": "r", "loss": 1e301}', "loss_out_of_range"),
        (b'{"experiment": "e", "request_id": "r", "reward": -2e305}', "loss_out_of_range"),
        (b'{"experiment": "e", "request_id": "r", "loss": 1, "arm": 1.5}', "wrong_type"),
    ],
)
def test_bad_feedback_becomes_dead_letters(raw, reason):
    out = parse_feedback(raw, ORIGIN)
    assert isinstance(out, DeadLetter) and out.reason == reason and out.raw == raw


def test_non_bytes_message_is_a_dead_letter_not_a_crash():
    out = parse_request(None, ORIGIN)
    assert isinstance(out, DeadLetter) and out.reason == "wrong_type"


def test_outgoing_messages_are_json_with_everything_a_consumer_needs():
    sel = Selection("e", "u", "r", "e\x1fu", 2, "blue", 0.25, 7, "holdout")
    assert orjson.loads(selection_json(sel)) == {
        "experiment": "e",
        "unit": "u",
        "request_id": "r",
        "arm": 2,
        "arm_name": "blue",
        "prob": 0.25,
        "round": 7,
        "why": "holdout",
    }
    dead = DeadLetter("oversize", "too big", b"\x00\xffraw", ORIGIN, "e")
    data = orjson.loads(dead.to_json())
    assert base64.b64decode(data["raw_b64"]) == b"\x00\xffraw"
    assert (data["source"], data["partition"], data["offset"]) == ("tsi.requests", 3, 41)
    assert data["reason"] == "oversize"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b'{"type": "request", "experiment": "e", "request_id": "r"}', Request),
        (b'{"type": "feedback", "experiment": "e", "request_id": "r", "loss": 1}', Feedback),
        (b'{"type": "click", "experiment": "e", "request_id": "r"}', "bad_value"),
        (b'{"experiment": "e", "request_id": "r"}', "missing_field"),
        (b'{"type": "request", "experiment": "e"}', "missing_field"),
        (b"[]", "not_an_object"),
    ],
)
def test_combined_stream_dispatches_on_type(raw, expected):
    from flows.service.wire.events import parse_event

    out = parse_event(raw, ORIGIN)
    if isinstance(expected, str):
        assert isinstance(out, DeadLetter) and out.reason == expected and out.raw == raw
    else:
        assert isinstance(out, expected)


def test_ts_window_is_relative_to_the_wall_clock_and_configurable():
    import time

    now = time.time()
    near = orjson.dumps({"experiment": "e", "request_id": "r", "ts": now - 9 * 365 * 86400})
    assert isinstance(parse_request(near, ORIGIN), Request)
    far = orjson.dumps({"experiment": "e", "request_id": "r", "ts": 5.0})
    assert parse_request(far, ORIGIN).reason == "bad_value"
    assert parse_request(far, ORIGIN, ts_window=float("inf")).ts == 5.0  # replays of old logs
    assert parse_request(near, ORIGIN, ts_window=3600.0).reason == "bad_value"


@pytest.mark.parametrize("size", [0, 1, 100, 64 * 1024, 64 * 1024 + 1, 900_000])
def test_a_dead_letter_carries_the_original_whole_or_a_prefix_with_size_and_hash(size):
    import hashlib

    raw = bytes(range(256)) * (size // 256) + b"z" * (size % 256)
    data = orjson.loads(DeadLetter("oversize", "d" * 5000, raw, ORIGIN, "e").to_json())
    carried = base64.b64decode(data["raw_b64"])
    assert data["raw_size"] == size and len(data["detail"]) <= 500
    if size <= 64 * 1024:
        assert carried == raw and data["truncated"] is False and "raw_sha256" not in data
    else:
        assert carried == raw[: 64 * 1024] and data["truncated"] is True
        assert data["raw_sha256"] == hashlib.sha256(raw).hexdigest()


def test_raw_limit_keeps_every_dead_letter_under_the_message_limit():
    from flows.service.wire.events import raw_limit_for

    for limit in (10_000, 100_000, 1_000_000, 1_048_588):
        raw = b"\xff" * 2_000_000
        letter = DeadLetter("oversize", "x" * 10_000, raw, ORIGIN, "i" * 600)
        assert len(letter.to_json(raw_limit=raw_limit_for(limit))) < limit - 1000


def test_the_minimal_dead_letter_keeps_where_and_what_but_no_bytes():
    import hashlib

    from flows.service.wire.events import minimal_dead_letter

    raw = b"q" * 70_000
    full = DeadLetter("malformed_json", "bad", raw, ORIGIN, "e\x1fu").to_json(raw_limit=10**6)
    small = minimal_dead_letter(full, "MSG_SIZE_TOO_LARGE")
    data = orjson.loads(small)
    assert len(small) < 1000 and data["raw_b64"] == "" and data["truncated"] is True
    assert (data["reason"], data["source"], data["partition"], data["offset"]) == (
        "malformed_json",
        "tsi.requests",
        3,
        41,
    )
    assert data["raw_size"] == 70_000 and data["raw_sha256"] == hashlib.sha256(raw).hexdigest()
    assert "MSG_SIZE_TOO_LARGE" in data["detail"]
    garbage = orjson.loads(minimal_dead_letter(b"\x00not json", "x"))
    assert garbage["reason"] == "unreadable_dead_letter" and garbage["raw_size"] == 9
