"""Parsing of incoming messages: every bad input becomes a dead letter with its reason."""

import base64

import orjson
import pytest

from flows.events import (
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
    raw = b'{"experiment":"e","unit":"u7","request_id":"r","context":2,"ts":1.5,"extra":1}'
    req = parse_request(raw, ORIGIN)
    assert isinstance(req, Request)
    assert (req.experiment, req.unit, req.request_id, req.context, req.ts) == (
        "e",
        "u7",
        "r",
        2,
        1.5,
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
        (b'{"experiment": "e", "request_id": "r", "loss": 1, "reward": 1}', "missing_field"),
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
    sel = Selection("e", "u", "r", "e\x1fu", 2, "blue", 0.25, 7)
    assert orjson.loads(sel.to_json()) == {
        "experiment": "e",
        "unit": "u",
        "request_id": "r",
        "arm": 2,
        "arm_name": "blue",
        "prob": 0.25,
        "round": 7,
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
    from flows.events import parse_event

    out = parse_event(raw, ORIGIN)
    if isinstance(expected, str):
        assert isinstance(out, DeadLetter) and out.reason == expected and out.raw == raw
    else:
        assert isinstance(out, expected)
