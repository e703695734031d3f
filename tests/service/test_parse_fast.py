"""The compiled fast lane of ``parse_and_route`` (``flows.service.wire._parse``) against the
Python path it stands for: ``events.parse_*`` and ``dataflow.route``, message by message.

Results are compared whole with ``==`` and, stricter, by ``exact``: types count (a ``ts``
of 5 is not 5.0, ``True`` is not 1), the sign of zero counts, experiments by identity.
"""

import dataclasses
import doctest
import gc
import json
import math
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flows.service import dataflow
from flows.service.dataflow import Guards, by_group, parse_and_route, route
from flows.service.instances.registry import Experiment, LiveRegistry, Registry
from flows.service.wire import _parse
from flows.service.wire.events import (
    DEFAULT_TS_WINDOW,
    MAX_MESSAGE_BYTES,
    DeadLetter,
    Origin,
    ParseBySource,
    parse_event,
    parse_feedback,
    parse_request,
)
from flows.service.wire.keys import DEFAULT_SHARDS, UNIT_SEPARATOR, group_of

REGISTRY = Registry.from_toml(
    """
[experiments.shared]
arms = ["a", "b"]

[experiments.per_user]
arms = ["x", "y"]
per_unit = true

[experiments."ünï"]
arms = ["z"]
per_unit = true
"""
)
PARSERS = [parse_request, parse_feedback, parse_event]
WINDOWS = [DEFAULT_TS_WINDOW, 3600.0, math.inf, 100]  # an int window: ts goes the slow way
ORIGIN = Origin("tsi.requests", 2, 40)


def reference(parse, window, batch, shards=DEFAULT_SHARDS):
    """The Python path: ``dataflow.parse_and_route`` without the lane (its routed events
    grouped by key group and shard of ``shards``, in order)."""
    routed, dead = [], []
    for raw, origin in batch:
        event = parse(raw, origin, ts_window=window)
        if not isinstance(event, DeadLetter):
            event = route(REGISTRY, event, shards)
        (dead if isinstance(event, DeadLetter) else routed).append(event)
    return by_group(routed, shards), dead


def fast(parse, window, batch, routing=route, shards=DEFAULT_SHARDS):
    return _parse.parse_and_route(parse, routing, window, REGISTRY, batch, shards=shards)


def exact(value):
    """A value as nested (type, content), for comparisons ``==`` would blur."""
    if isinstance(value, Experiment):
        return ("experiment", id(value))
    if dataclasses.is_dataclass(value):
        fields = dataclasses.fields(value)
        return (type(value), tuple(exact(getattr(value, f.name)) for f in fields))
    if isinstance(value, list | tuple):
        return (type(value), tuple(exact(item) for item in value))
    if isinstance(value, float):
        return (float, repr(value))
    return (type(value), value)


def assert_same(got, want):
    assert got == want
    assert exact(got) == exact(want)


def counting(calls):
    """``route``, recording the events the Python path brings it."""

    def counted(registry, event, shards):
        calls.append(event)
        return route(registry, event, shards)

    return counted


# -- generated messages: JSON text built field by field, valid ones then mutated ----------

LITERALS = [
    "1e309",
    "-1e309",
    "1e300",
    "-1e300",
    "1.0000000000000002e300",
    "1e-400",
    "-0",
    "-0.0",
    "0",
    "-1",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775809",
    "1" + "0" * 400,
    "NaN",
    "Infinity",
    "true",
    "false",
    "null",
    "[]",
    "{}",
    '{"a": [1, {"b": null}]}',
    '"1"',
    '""',
    '"request"',
    '"feedback"',
    '"shared"',
    # the compiled scanner's edges: ints at its 18 digits, numbers JSON refuses, floats it
    # reads with the C library, texts it leaves to orjson (escapes, DEL, non-ASCII)
    "999999999999999999",
    "-999999999999999999",
    "1000000000000000000",
    "9223372036854775807",
    "0.1e1",
    "1E2",
    "1e+2",
    "-0e0",
    "2.5e-324",
    "0.30000000000000004441",
    "00",
    "01",
    "1.",
    ".5",
    "+1",
    "1e",
    "-",
    '"a\x7fb"',
    '"a\\u0041"',
    '"\\n"',
    '"\\""',
    '"é"',
]
ODD_IDS = ["", "r", "x" * 256, "x" * 257, "ü" * 256, "ü" * 257, "🙂" * 256, "\x1f", "日本"]
KEYS = ["experiment", "unit", "request_id", "context", "ts", "loss", "reward", "arm", "type"]

ids = st.sampled_from(ODD_IDS) | st.text(max_size=5) | st.text(min_size=250, max_size=260)
valid_ids = ids.filter(lambda s: 0 < len(s) <= 256)
numbers = (
    st.integers(-(2**64), 2**64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.floats(min_value=9e299, max_value=1.1e300)
)


@st.composite
def timestamps(draw):
    offset = draw(st.sampled_from([0.0, 1.5, -1800.0, 7200.0, 4e8, -4e8, 1e12]))
    ts = time.time() + offset
    return draw(st.sampled_from([ts, int(ts)]))


def text_of(value):
    return json.dumps(value, ensure_ascii=False)


values = (
    st.sampled_from(LITERALS)
    | ids.map(text_of)
    | numbers.map(text_of)
    | timestamps().map(text_of)
    | st.sampled_from(["shared", "per_user", "ünï", "nope"]).map(text_of)
)


@st.composite
def valid_fields(draw, parse):
    """The fields of a message the lane could take with ``parse`` (before mutations)."""
    experiment = draw(st.sampled_from(["shared", "per_user", "ünï"]))
    kinds = {parse_request: "request", parse_feedback: "feedback"}
    kind = draw(st.just(kinds[parse]) if parse in kinds else st.sampled_from(list(kinds.values())))
    fields = {"experiment": experiment, "request_id": draw(valid_ids)}
    if experiment != "shared" or draw(st.booleans()):
        fields["unit"] = draw(valid_ids)
    if kind == "request" and draw(st.booleans()):
        fields["context"] = draw(st.integers(0, 2**64 - 1))
    if kind == "feedback":
        loss = draw(st.integers(-(2**63), 2**64 - 1) | st.floats(-1e300, 1e300))
        fields[draw(st.sampled_from(["loss", "reward"]))] = loss
        if draw(st.booleans()):
            fields["arm"] = draw(st.integers(0, 2**64 - 1) | valid_ids)
    if draw(st.booleans()):
        fields["ts"] = time.time() + draw(st.sampled_from([0.0, 1.5, -30.0]))
    if draw(st.integers(0, 7)) < (6 if parse is parse_event else 1):
        fields["type"] = kind
    return [(key, text_of(value)) for key, value in fields.items()]


@st.composite
def json_messages(draw, parse):
    pairs = draw(valid_fields(parse).flatmap(st.permutations))
    for _ in range(draw(st.sampled_from([0, 0, 0, 0, 0, 1, 1, 2, 3]))):
        if pairs and draw(st.booleans()):
            del pairs[draw(st.integers(0, len(pairs) - 1))]
        else:  # a key set again (orjson keeps the last) or a new one
            key = draw(st.sampled_from(KEYS) | st.sampled_from(["extra", "Type", "unit "]))
            pairs.insert(draw(st.integers(0, len(pairs))), (key, draw(values)))
    ws = draw(st.sampled_from(["", "", "", " ", "\n\t", "\r ", "\x0b"]))  # \x0b: not JSON's
    body = f"{ws},{ws}".join(f"{text_of(key)}{ws}:{ws}{value}" for key, value in pairs)
    return (ws + "{" + ws + body + ws + "}" + ws).encode()


odd_messages = st.sampled_from(
    [
        b"",
        b"{not json",
        b"\xff\xfe",
        b'{"experiment": "shared", "request_id": "r1"',
        b"[1, 2]",
        b'"text"',
        b"null",
        b"17",
        b'{"experiment": "shared", "request_id": "\\ud800"}',
        b'{"experiment": "shared", "request_id": "r", "pad": "' + b"x" * MAX_MESSAGE_BYTES + b'"}',
    ]
)


@st.composite
def messages(draw, parse):
    """Mostly JSON objects for ``parse`` (some valid, some mutated), some odd bytes, some
    not bytes at all."""
    raw = draw(odd_messages if draw(st.integers(0, 7)) == 0 else json_messages(parse))
    wrap = draw(st.sampled_from([bytes] * 12 + [bytearray, memoryview, bytes.decode]))
    return wrap(raw) if wrap is not bytes.decode else raw.decode("utf-8", "replace")


def batches(parse):
    return st.lists(messages(parse), max_size=25).map(
        lambda raws: [(raw, Origin("t", 0, offset)) for offset, raw in enumerate(raws)]
    )


@pytest.mark.parametrize("parse", PARSERS, ids=lambda p: p.__name__)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), window=st.sampled_from(WINDOWS), shards=st.sampled_from([1, 8, 32, 128]))
def test_the_lane_gives_what_the_python_path_gives(parse, data, window, shards):
    batch = data.draw(batches(parse))
    got = fast(parse, window, batch, shards=shards)
    assert_same(got, reference(parse, window, batch, shards))


@settings(max_examples=100, deadline=None)
@given(data=st.data(), parse=st.sampled_from(PARSERS))
def test_parse_and_route_gives_what_the_python_path_gives(data, parse):
    batch = data.draw(batches(parse))
    got = parse_and_route(parse, Guards(), LiveRegistry(REGISTRY), batch)
    assert_same(got, reference(parse, DEFAULT_TS_WINDOW, batch))


@st.composite
def internal_batches(draw):
    """Copies on the internal topic: each names the topic it came from, and holds a
    message for that topic's parser (or an odd one)."""
    batch = []
    for offset in range(draw(st.integers(0, 25))):
        source = draw(st.sampled_from(["tsi.requests", "tsi.feedback"]))
        parse = parse_request if source == "tsi.requests" else parse_feedback
        raw = draw(messages(parse) | messages(parse_event))
        batch.append((raw, Origin(source, offset % 3, offset)))
    return batch


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=internal_batches(), window=st.sampled_from(WINDOWS))
def test_the_internal_topics_copies_take_the_lane_of_their_source(batch, window):
    """``ParseBySource``: a copy of a request is parsed as a request, any other as
    feedback, in the lane exactly as in Python."""
    parse = ParseBySource("tsi.requests")
    assert _parse.has_lane(parse)
    assert_same(fast(parse, window, batch), reference(parse, window, batch))


# -- explicit cases ------------------------------------------------------------------------


def now_ts():
    return json.dumps(time.time()).encode()


def plain_messages():
    """(parser, message) pairs the lane takes: plain valid messages."""
    ts, now = now_ts(), int(time.time())
    request = b'{"experiment":"per_user","unit":"u1","request_id":"r1"}'
    feedback = b'{"experiment":"per_user","unit":"u1","request_id":"r1","loss":0.5}'
    return [
        (parse_request, request),
        (parse_request, b'{"experiment":"shared","request_id":"r1","context":3,"ts":' + ts + b"}"),
        (parse_request, b'{"experiment":"shared","unit":null,"request_id":"r","ts":null}'),
        (parse_request, '{"experiment":"ünï","unit":"ü🙂","request_id":"日本"}'.encode()),
        (parse_request, b'{"experiment":"shared","request_id":"' + b"x" * 256 + b'"}'),
        (parse_feedback, feedback),
        (parse_feedback, b'{"experiment":"shared","request_id":"r1","reward":2,"arm":"b"}'),
        (parse_feedback, b'{"experiment":"shared","request_id":"r","reward":0,"arm":1}'),
        (parse_feedback, b'{"experiment":"shared","request_id":"r","loss":-1e300,"ts":%d}' % now),
        (parse_event, b'{"type":"request",' + request[1:]),
        (parse_event, b'{"type":"feedback",' + feedback[1:]),
    ]


#: ids by position: some messages hold the time they were made, and every process that
#: collects the tests (a parallel run's workers) must name them alike
PLAIN = [pytest.param(p, r, id=f"{p.__name__}-{i}") for i, (p, r) in enumerate(plain_messages())]


@pytest.mark.parametrize(("parse", "raw"), PLAIN)
def test_plain_valid_messages_take_the_lane(parse, raw):
    calls, batch = [], [(raw, ORIGIN)]
    got = fast(parse, DEFAULT_TS_WINDOW, batch, counting(calls))
    assert calls == [] and len(got[0]) == 1  # the Python parser's events never came
    assert_same(got, reference(parse, DEFAULT_TS_WINDOW, batch))


@pytest.mark.parametrize(("parse", "raw"), PLAIN)
def test_the_lanes_events_are_not_walked_by_the_collector(parse, raw):
    """The lane's routed events (the young generation's bulk while a batch is in flight)
    are left out of the collector's walks: they hold no container but the experiment,
    so they close no cycle."""
    [(_group, [(_shard, [routed])])], _ = fast(
        parse, DEFAULT_TS_WINDOW, [(raw, ORIGIN)], counting([])
    )
    _key, experiment, event = routed
    assert not any(gc.is_tracked(x) for x in (routed, event))
    fields = [f.name for f in dataclasses.fields(event) if f.name != "origin"]  # the source's
    assert not any(gc.is_tracked(getattr(event, name)) for name in fields)
    assert isinstance(experiment, Experiment)  # tracked, and long-lived: it holds no event


def test_a_message_at_the_size_limit_takes_the_lane_one_byte_more_is_oversize():
    head = b'{"experiment":"shared","request_id":"r"'
    at_limit = head + b" " * (MAX_MESSAGE_BYTES - len(head) - 1) + b"}"
    batch = [(at_limit, ORIGIN), (at_limit + b" ", ORIGIN)]
    calls = []
    got = fast(parse_request, DEFAULT_TS_WINDOW, batch, counting(calls))
    assert calls == [] and len(got[0]) == 1 and got[1][0].reason == "oversize"
    assert_same(got, reference(parse_request, DEFAULT_TS_WINDOW, batch))


@pytest.mark.parametrize(
    ("parse", "raw"),
    [
        (parse_request, b'{"experiment":"shared","request_id":"r","sent_at":"today"}'),
        (parse_request, b'{"experiment":"shared","request_id":"r","type":"request"}'),
        (parse_feedback, b'{"experiment":"shared","request_id":"r","loss":1,"context":0}'),
        (parse_event, b'{"type":"request","experiment":"shared","request_id":"r","loss":1}'),
        (parse_request, bytearray(b'{"experiment":"shared","request_id":"r"}')),
        (parse_request, memoryview(b'{"experiment":"shared","request_id":"r"}')),
    ],
)
def test_what_the_lane_cannot_decide_goes_to_the_python_parser(parse, raw):
    calls, batch = [], [(raw, ORIGIN)]
    got = fast(parse, DEFAULT_TS_WINDOW, batch, counting(calls))
    assert len(calls) == 1 and len(got[0]) == 1
    assert_same(got, reference(parse, DEFAULT_TS_WINDOW, batch))


REFUSALS = [
    (parse_request, b"{not json", "malformed_json"),
    (parse_request, b'{"experiment": "shared", "request_id": NaN}', "malformed_json"),
    (parse_request, b'{"experiment": "shared", "request_id": "r", "ts": 1e309}', "malformed_json"),
    (parse_request, b"\xff\xfe", "malformed_json"),
    (parse_request, b"[1, 2]", "not_an_object"),
    (parse_request, b'{"request_id": "r"}', "missing_field"),
    (parse_request, b'{"experiment": "shared"}', "missing_field"),
    (parse_request, b'{"experiment": "per_user", "request_id": "r"}', "missing_field"),
    (parse_feedback, b'{"experiment": "shared", "request_id": "r"}', "missing_field"),
    (parse_event, b'{"experiment": "shared", "request_id": "r"}', "missing_field"),
    (parse_request, b'{"experiment": 5, "request_id": "r"}', "wrong_type"),
    (parse_request, b'{"experiment": "shared", "request_id": ["r"]}', "wrong_type"),
    (parse_request, b'{"experiment": "shared", "unit": 7, "request_id": "r"}', "wrong_type"),
    (parse_request, b'{"experiment": "shared", "request_id": "r", "context": true}', "wrong_type"),
    (parse_request, b'{"experiment": "shared", "request_id": "r", "context": 1.0}', "wrong_type"),
    (parse_request, b'{"experiment": "shared", "request_id": "r", "ts": "now"}', "wrong_type"),
    (parse_request, b'{"experiment": "shared", "request_id": "r", "ts": false}', "wrong_type"),
    (parse_feedback, b'{"experiment": "shared", "request_id": "r", "loss": "1"}', "wrong_type"),
    (parse_feedback, b'{"experiment": "shared", "request_id": "r", "loss": true}', "wrong_type"),
    (parse_feedback, b'{"experiment":"shared","request_id":"r","loss":1,"arm":[0]}', "wrong_type"),
    (parse_request, b'{"experiment": "", "request_id": "r"}', "bad_value"),
    (parse_request, b'{"experiment": "shared", "request_id": "' + b"x" * 257 + b'"}', "bad_value"),
    (
        parse_request,
        ('{"experiment":"shared","request_id":"' + "ü" * 257 + '"}').encode(),
        "bad_value",
    ),
    (parse_request, '{"experiment": "shared", "request_id": "r"}', "wrong_type"),  # str, not bytes
    (parse_request, b'{"experiment": "shared", "request_id": "r", "context": -1}', "bad_value"),
    (parse_request, b'{"experiment": "shared", "request_id": "r", "ts": 0}', "bad_value"),
    (parse_request, b'{"experiment": "shared", "request_id": "r", "ts": 1e308}', "bad_value"),
    (parse_feedback, b'{"experiment":"shared","request_id":"r","loss":1,"reward":1}', "bad_value"),
    (parse_feedback, b'{"experiment":"shared","request_id":"r","loss":1,"arm":""}', "bad_value"),
    (parse_feedback, b'{"experiment":"shared","request_id":"r","loss":1,"arm":-2}', "bad_value"),
    (parse_event, b'{"type": "other", "experiment": "shared", "request_id": "r"}', "bad_value"),
    (parse_event, b'{"type": 1, "experiment": "shared", "request_id": "r"}', "bad_value"),
    (parse_feedback, b'{"experiment":"shared","request_id":"r","loss":1e301}', "loss_out_of_range"),
    (
        parse_feedback,
        b'{"experiment":"shared","request_id":"r","reward":-1.0000000000000002e300}',
        "loss_out_of_range",
    ),
    (
        parse_request,
        b'{"experiment": "shared", "request_id": "r", "pad": "' + b"x" * MAX_MESSAGE_BYTES + b'"}',
        "oversize",
    ),
    (parse_request, b'{"experiment": "nope", "request_id": "r"}', "unknown_experiment"),
    (parse_feedback, b'{"experiment":"Shared","request_id":"r","loss":0}', "unknown_experiment"),
    (
        parse_event,
        '{"type":"request","experiment":"ünï","request_id":"r"}'.encode(),
        "missing_field",
    ),
]


@pytest.mark.parametrize(("parse", "raw", "reason"), REFUSALS)
def test_each_refusal_is_the_python_parsers(parse, raw, reason):
    batch = [(raw, ORIGIN)]
    got = fast(parse, DEFAULT_TS_WINDOW, batch)
    assert [letter.reason for letter in got[1]] == [reason]
    assert_same(got, reference(parse, DEFAULT_TS_WINDOW, batch))


@pytest.mark.parametrize("lane", [True, False])
def test_ungrouped_events_keep_the_batchs_order_across_shards(lane):
    """What the internal topic's copies are written from: its reader drops a copy whose
    input offset is below one it has read, so a batch's events must stay in order
    (grouped by shard they would not: these 60 units fall in many shards)."""
    raws = [
        b'{"experiment":"per_user","unit":"u%d","request_id":"r%d"}' % (i % 60, i)
        for i in range(300)
    ]
    batch = [(raw, Origin("t", 0, i)) for i, raw in enumerate(raws)]
    guards = Guards() if lane else Guards(skip=frozenset({("t", 0, 10_000)}))
    live = LiveRegistry(REGISTRY)
    routed, dead = parse_and_route(parse_request, guards, live, batch, grouped=False)
    groups, _ = parse_and_route(parse_request, guards, live, batch)
    shards = [part for _, parts in groups for part in parts]
    assert dead == [] and len(shards) > 20
    assert [event.origin.offset for _, _, event in routed] == list(range(300))
    keys = [f"per_user{UNIT_SEPARATOR}u{i % 60}" for i in range(300)]
    assert [key for key, _, _ in routed] == keys
    assert sorted(map(exact, routed)) == sorted(exact(r) for _, rs in shards for r in rs)


def test_a_ts_outside_a_narrow_window_is_refused_inside_it_taken():
    now = time.time()
    batch = [
        (b'{"experiment":"shared","request_id":"r","ts":%r}' % (now + offset), ORIGIN)
        for offset in (0.0, -50.0, 200.0, -1e9)
    ]
    calls = []
    got = fast(parse_request, 100.0, batch, counting(calls))
    assert calls == [] and [d.reason for d in got[1]] == ["bad_value", "bad_value"]
    assert_same(got, reference(parse_request, 100.0, batch))


def test_a_mixed_batch_keeps_its_order_and_each_message_in_one_list():
    raws = [raw for _, raw in plain_messages()[:5]] + [raw for _, raw, _ in REFUSALS[:8]]
    batch = [(raw, Origin("t", 0, i)) for i, raw in enumerate(raws * 3)]
    groups, dead = got = fast(parse_request, DEFAULT_TS_WINDOW, batch)
    shards = [part for _, parts in groups for part in parts]
    offsets = [event.origin.offset for _, events in shards for _, _, event in events]
    offsets += [letter.origin.offset for letter in dead]
    assert sorted(offsets) == list(range(len(batch)))  # each message once
    for _, events in shards:  # a shard's events in the batch's order
        assert [e.origin.offset for _, _, e in events] == sorted(
            e.origin.offset for _, _, e in events
        )
    assert len({shard for shard, _ in shards}) == len(shards)  # one list a shard
    assert len({group for group, _ in groups}) == len(groups)  # one item a group
    assert all(group_of(shard) == group for group, parts in groups for shard, _ in parts)
    assert_same(got, reference(parse_request, DEFAULT_TS_WINDOW, batch))


# -- dataflow.parse_and_route uses the lane for the standard parsers only -------------------


def replayed(raw, origin, ts_window):
    """A parser of a replay: not one of the standard three."""
    return parse_request(raw, origin, ts_window)


@pytest.mark.parametrize(
    ("parse", "guards", "lane"),
    [
        (parse_request, Guards(), True),
        (parse_feedback, Guards(ts_window=60.0), True),
        (parse_event, Guards(), True),
        (ParseBySource("t"), Guards(), True),
        (ParseBySource("elsewhere"), Guards(), True),
        (parse_request, Guards(skip=frozenset({("x", 0, 1)})), False),
        (replayed, Guards(), False),
    ],
)
def test_parse_and_route_takes_the_lane_for_standard_parsers_without_skips(
    monkeypatch, parse, guards, lane
):
    calls = []
    monkeypatch.setattr(dataflow, "route", counting(calls))
    raw = b'{"experiment":"per_user","unit":"u1","request_id":"r1"}'
    if parse not in (parse_request, replayed, ParseBySource("t")):
        raw = b'{"type":"feedback","experiment":"per_user","unit":"u1","request_id":"r1","loss":2}'
        raw = raw if parse is parse_event else raw.replace(b'"type":"feedback",', b"")
    batch = [(raw, Origin("t", 0, i)) for i in range(3)]
    got = parse_and_route(parse, guards, LiveRegistry(REGISTRY), batch)
    assert len(calls) == (0 if lane else 3) and [len(events) for _, [(_, events)] in got[0]] == [3]
    assert_same(got, reference(parse, guards.ts_window, batch))


def test_a_skipped_offset_is_still_a_skipped_dead_letter():
    raw = b'{"experiment":"shared","request_id":"r"}'
    batch = [(raw, Origin("t", 0, 1)), (raw, Origin("t", 0, 2))]
    routed, dead = parse_and_route(
        parse_request, Guards(skip=frozenset({("t", 0, 2)})), LiveRegistry(REGISTRY), batch
    )
    assert [len(events) for _, events in routed] == [1] and [d.reason for d in dead] == ["skipped"]


def test_the_modules_examples_hold():
    """pytest's --doctest-modules does not read compiled modules: run the examples here."""
    result = doctest.testmod(_parse)
    assert result.attempted > 0 and result.failed == 0
