"""Records built from compiled code equal the Python constructors' (flows.service.wire._records)."""

import dataclasses
import doctest
import gc
import pickle

import orjson
import pytest
from bytewax.connectors.kafka import KafkaSinkMessage
from hypothesis import given
from hypothesis import strategies as st

from flows.service.connectors.kafka import _split_batch
from flows.service.connectors.kafka_sink import _CheckedPartition
from flows.service.instances.registry import Registry
from flows.service.shards.logic import logic_builder
from flows.service.wire import _records
from flows.service.wire.events import (
    DeadLetter,
    Feedback,
    Origin,
    Request,
    Selection,
    parse_request,
)

Layout, kafka_message, kafka_batch = _records.Layout, _records.kafka_message, _records.kafka_batch
internal_copy, internal_message = _records.internal_copy, _records.internal_message
ORIGIN_FIELDS = ("source", "partition", "offset", "time")
values = st.one_of(st.none(), st.integers(), st.floats(allow_nan=False), st.text())


@given(st.tuples(values, values, values, values))
def test_a_built_record_equals_the_constructors(fields):
    assert Layout(Origin, ORIGIN_FIELDS).new(fields) == Origin(*fields)


def test_a_layout_refuses_fields_the_class_does_not_have():
    with pytest.raises(ImportError, match=r"reads Origin\('source', 'partition'\)"):
        Layout(Origin, ("source", "partition"))

    @dataclasses.dataclass  # no slots: nothing to fill
    class Loose:
        a: int

    with pytest.raises(ImportError, match="Loose"):
        Layout(Loose, ("a",))
    with pytest.raises(ValueError, match="has 4 fields"):
        Layout(Origin, ORIGIN_FIELDS).new(("t", 0))


def test_a_layout_reads_each_field_as_getattr_does():
    """``get`` reads at the slot's offset: the same values as getattr for every field, of
    a dataclass and of a plain ``__slots__`` class; by name for any other class (a
    subclass too); AttributeError for a slot never set."""
    layout = Layout(Origin, ORIGIN_FIELDS)
    made = Origin("t", 3, 17, 1.5)
    assert [layout.field(made, i) for i in range(4)] == ["t", 3, 17, 1.5]

    class Named:
        def __init__(self):
            self.source, self.partition, self.offset, self.time = "n", 1, 2, 3.0

    assert [layout.field(Named(), i) for i in range(4)] == ["n", 1, 2, 3.0]

    class Plain:
        __slots__ = ("a", "b")

        def __init__(self):
            self.a, self.b = "A", "B"

    plain = Layout(Plain, ("a", "b"))
    assert (plain.field(Plain(), 0), plain.field(Plain(), 1)) == ("A", "B")

    class Later(Plain):
        __slots__ = ("c",)

    later = Later()
    later.c = "C"
    assert plain.field(later, 1) == "B"  # by name: the subclass is not the class read
    with pytest.raises(AttributeError, match="'b'"):
        plain.field(Plain.__new__(Plain), 1)
    with pytest.raises(ImportError, match="Plain"):
        Layout(Plain, ("b", "a"))  # not the order of its slots
    with pytest.raises(IndexError):
        layout.field(made, 4)


class Message:
    """What a confluent-kafka Message answers (a unit test of the conversion alone; the
    Kafka tests run it against the broker)."""

    def __init__(self, value, offset, timestamp, error=None, headers=None):
        self._value, self._offset, self._timestamp = value, offset, timestamp
        self._error, self._headers = error, headers

    def headers(self):
        return self._headers

    def error(self):
        return self._error

    def value(self):
        return self._value

    def offset(self):
        return self._offset

    def timestamp(self):
        return self._timestamp


@pytest.mark.parametrize(
    ("timestamp", "time"), [((1, 1_700_000_000_123), 1_700_000_000.123), ((0, -1), None)]
)
def test_a_kafka_message_becomes_its_bytes_and_origin(timestamp, time):
    raw, origin = kafka_message(Message(b"{}", 17, timestamp), "tsi.requests", 2)
    assert raw == b"{}" and origin == Origin("tsi.requests", 2, 17, time)


class Error:
    def __init__(self, code):
        self._code = code

    def code(self):
        return self._code


def test_a_kafka_batch_keeps_order_turns_errors_into_items_and_stops_at_the_end():
    stamp = (1, 2_000)
    messages = [
        Message(b"a", 4, stamp),
        Message(None, 5, stamp, Error(7)),
        Message(b"b", 6, stamp),
        Message(None, 7, stamp, Error(-191)),  # the end of the partition
        Message(b"c", 8, stamp),
    ]
    out, last, eof = kafka_batch(messages, "t", 1, None, lambda m, e: ("error", e.code()), -191)
    assert out == [(b"a", Origin("t", 1, 4, 2.0)), ("error", 7), (b"b", Origin("t", 1, 6, 2.0))]
    assert (last, eof) == (6, True)
    dropped = kafka_batch(messages[:1], "t", 1, lambda m: None, None, -191)
    assert dropped == ([], 4, False)  # a converter's None drops the message (second copies)


TAGS = {"tsi.requests": b"r", "tsi.feedback": b"f"}
INPUTS = {tag: topic for topic, tag in TAGS.items()}
origins = st.builds(
    Origin,
    st.sampled_from(sorted(TAGS)),
    st.integers(0, 2**31 - 1),
    st.integers(0, 2**62),
    st.none() | st.integers(1, 2**45).map(lambda ms: ms / 1000),
)


def read_copy(copy, seen, offset=0):
    """The internal topic's message that ``copy`` (key, value, headers) would make, read
    back."""
    message = Message(copy[1], offset, (1, 1_000), headers=copy[2])
    return internal_message(seen, INPUTS, "internal", 3, message)


@given(st.lists(origins, min_size=1, max_size=20))
def test_an_internal_copy_reads_back_as_its_original_and_a_second_copy_is_dropped(originals):
    seen = {}
    for origin in originals:
        args = internal_copy(("e:u", b"{}", origin), TAGS)
        assert args[0] == b"e:u"
        where = (TAGS[origin.source], origin.partition)
        first = origin.offset > seen.get(b"%s:%d" % where, -1)
        read = read_copy(args, seen)
        assert read == ((b"{}", origin) if first else None)
        assert read_copy(args, seen) is None  # the same copy again: a crash's second copy


headers = st.lists(
    st.tuples(
        st.sampled_from(["o", "t", "x"]),
        st.none() | st.binary(max_size=30) | st.sampled_from([b"r:0:1", b"f:2:", b"r:-1:2"]),
    ),
    max_size=4,
)


@given(headers)
def test_a_message_the_service_did_not_write_is_a_dead_letter_never_an_error(header_list):
    seen = {}
    message = Message(b"junk", 9, (1, 2_000), headers=header_list or None)
    read = internal_message(seen, INPUTS, "internal", 3, message)
    named = dict(header_list).get("o")
    stamped = dict(header_list).get("t")
    parts = named.split(b":") if type(named) is bytes else []
    well_formed = (
        len(parts) == 3
        and parts[0] in INPUTS
        and all(p.isdigit() and len(p) <= 19 for p in parts[1:])
        and (stamped is None or (stamped.isdigit() and len(stamped) <= 19))
    )
    if well_formed:
        assert type(read) is tuple and read[1].offset == int(parts[2])
    else:
        assert type(read) is DeadLetter and read.reason == "not_a_copy"
        assert read.raw == b"junk" and read.origin == Origin("internal", 3, 9, 2.0)
        assert seen == {}  # changed nothing


@given(
    st.lists(
        st.builds(
            Selection,
            st.text(),
            st.none() | st.text(),
            st.text(),
            st.text(),
            st.integers(0, 9),
            st.text(),
            st.floats(0, 1),
            st.integers(1, 2**40),
        )
        | st.builds(DeadLetter, st.text(), st.text(), st.binary(), st.just(Origin("t")))
    )
)
def test_split_outputs_writes_what_selection_to_json_writes(outputs):
    selections, dead = _records.split_outputs(outputs)
    assert selections == [
        (o.instance, _records.selection_json(o)) for o in outputs if type(o) is Selection
    ]
    assert [json for _, json in selections] == [
        orjson_oracle(o) for o in outputs if type(o) is Selection
    ]
    assert dead == [o for o in outputs if type(o) is DeadLetter]


def orjson_oracle(answer: Selection) -> bytes:
    """The test oracle of the answers' wire format (``_records.selection_json``): the
    dict orjson writes, as the service wrote it before its writer was compiled."""
    return orjson.dumps(
        {
            "experiment": answer.experiment,
            "unit": answer.unit,
            "request_id": answer.request_id,
            "arm": answer.arm,
            "arm_name": answer.arm_name,
            "prob": answer.prob,
            "round": answer.round,
            "why": answer.why,
        }
    )


#: text the C writer takes (ASCII from the space on, no quote or backslash) and what is
#: next to it: control characters, quotes, backslashes, DEL, non-ASCII, long
PLAIN = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E, exclude_characters='"\\'))
EDGY = st.text(st.sampled_from(["a", " ", "\x1f", "\x00", '"', "\\", "\x7f", "é", "\u2028", "😀"]))
LONG = st.integers(100, 600).map(lambda n: "x" * n)
OUTSIDE_INT64 = st.sampled_from([2**63, -(2**63) - 1, True])


@given(
    st.lists(
        st.builds(
            Selection,
            PLAIN | EDGY,
            st.none() | PLAIN | EDGY,
            PLAIN | LONG,
            PLAIN,
            st.integers(0, 9)
            | st.integers(-(2**63), 2**63 - 1)
            | st.sampled_from([2**63, -(2**63) - 1, True]),
            PLAIN | EDGY,
            st.floats(0, 1) | st.sampled_from([1e-7, 1e-5, 5e-324, 1.0, 0.0, 1e22, 2**53 + 0.0]),
            st.integers(1, 2**40) | st.sampled_from([0, -1, 2**64]),
        ),
        max_size=20,
    )
)
def test_answers_written_in_c_are_the_bytes_orjson_writes(outputs):
    """The answers' JSON is written in C when its texts are plain: byte for byte what
    the oracle (orjson) writes, at every edge (escapes, non-ASCII, int64's
    bounds, bools, tiny and huge floats, answers longer than the C buffer); an int orjson
    refuses is refused the same way."""
    for answer in outputs:
        try:
            expected = orjson_oracle(answer)
        except TypeError as exc:  # orjson: an int beyond 64 bits
            with pytest.raises(TypeError, match=str(exc)):
                _records.split_outputs([answer])
            continue
        assert _records.split_outputs([answer]) == ([(answer.instance, expected)], [])
        assert _records.selection_json(answer) == expected


def test_what_a_shard_keeps_per_ticket_is_not_walked_by_the_collector():
    registry = Registry.from_toml('[experiments.e]\narms = ["a", "b"]\n')
    shard = logic_builder(registry, clock=lambda: 0.0)(None)
    experiment = registry["e"]

    def ask(rid):
        raw = b'{"experiment":"e","request_id":"%s"}' % rid.encode()
        return [("e", experiment, parse_request(raw, Origin("t", 0, 1)))]

    shard.handle(ask("r1"))  # a new instance
    [answer] = shard.handle(ask("r2"))  # a live one
    shard.handle(ask("r3"))  # and the third, beside two: a table and a heap of deadlines
    instance = shard.store.instances["e"]
    entry = instance.entries()["r2"]
    assert not gc.is_tracked(entry) and not gc.is_tracked(entry.ticket)
    assert not gc.is_tracked(entry.origin)
    assert not gc.is_tracked(instance.entries()["r1"])  # however it was served
    assert not gc.is_tracked(answer)  # nor its answer, alive until the outputs are written
    assert instance.holding()["table"]  # a heap of C times and keys, which the GC never walks
    [written], _ = _records.split_outputs([answer])
    assert not gc.is_tracked(written)


def test_a_read_message_is_not_walked_by_the_collector():
    """A batch in flight is the young generation's bulk: its messages and origins are
    left out of the collector's walks (they hold bytes, strings and numbers only)."""
    messages = [Message(b"a", 4, (1, 2_000)), Message(b"b", 5, (0, -1))]
    out, _, _ = kafka_batch(messages, "t", 1, None, None, -191)
    single = kafka_message(messages[0], "t", 1)
    for item in [*out, single]:
        assert not gc.is_tracked(item) and not gc.is_tracked(item[1])
        origin = item[1]
        assert not any(gc.is_tracked(getattr(origin, name)) for name in ORIGIN_FIELDS)


def test_the_modules_examples_hold():
    """pytest's --doctest-modules does not read compiled modules: run the examples here."""
    result = doctest.testmod(_records)
    assert result.attempted > 0 and result.failed == 0


events = st.builds(
    lambda kind, text, number, time, raw, ctx: (
        Request(text, text or None, text + "q", number, time, raw,
                Origin(text, number, number, time))
        if kind
        else Feedback(text, None if ctx else text, text + "r", time or 0.0, ctx, time, raw,
                      Origin(text, None, None, None))
    ),
    st.booleans(),
    st.text(),
    st.integers(-(2**70), 2**70),
    st.one_of(st.none(), st.floats(allow_nan=False)),
    st.binary(),
    st.one_of(st.none(), st.integers(0, 9), st.text(max_size=3)),
)  # fmt: skip


@given(st.lists(events, max_size=8))
def test_events_cross_processes_pickled_as_their_fields_and_come_back_equal(batch):
    """Bytewax pickles a shard's items between processes: events are written as their
    layout's number and fields (``_records.unpickled`` reads them), come back equal, of
    their class, and out of the collector's walk as a batch in flight is."""
    blob = pickle.dumps(batch)
    back = pickle.loads(blob)
    assert back == batch and [type(e) for e in back] == [type(e) for e in batch]
    assert all(not gc.is_tracked(e) and not gc.is_tracked(e.origin) for e in back)
    if batch:
        assert b"unpickled" in blob


@pytest.mark.parametrize(
    ("kind", "fields", "problem"),
    [(3, (), "no record kind 3"), (-1, (), "no record kind -1"), (0, ("t", 0), "Origin has 4")],
)
def test_a_bad_pickled_record_is_refused_by_name(kind, fields, problem):
    with pytest.raises(ValueError, match=problem):
        _records.unpickled(kind, fields)


class _Pair(tuple):
    """A tuple subclass: the sink writes it, through its per-item check."""


SINK_ITEMS = [
    ("k", b"v"),
    (None, b"v"),
    ("k", b"v", [("h", b"1")]),
    ("k", b"v", []),
    ("k", b"v", "headers"),
    ("k", b"v", (("h", b"1"),)),
    ("k",),
    ("k", b"v", [], "extra"),
    ["k", b"v"],
    _Pair(("k", b"v")),
    {"topic": "t", "key": "k", "value": b"v"},
    KafkaSinkMessage(b"k", b"v"),
    b"just bytes",
]


@given(st.lists(st.sampled_from(SINK_ITEMS), max_size=6))
def test_a_batch_is_producible_as_it_is_only_if_the_sinks_check_keeps_every_item(items):
    """``producible`` lets the sink skip ``_produce_args`` item by item: true exactly when
    every item is a plain tuple that the check would hand to ``produce`` unchanged (the
    check passes a dict on too, as ``produce``'s keyword arguments: not this fast path)."""
    part = _CheckedPartition(producer=None, topic="t", client_errors=[])

    def unchanged(item):
        try:
            return type(item) is tuple and part._produce_args(item) is item
        except (TypeError, ValueError):
            return False

    assert _records.producible(items) == all(unchanged(item) for item in items)


@given(st.lists(st.sampled_from(["message", "letter"]), max_size=8))
def test_a_consumed_batch_splits_into_its_messages_and_letters_in_order(kinds):
    """Messages only: the batch itself goes on (``messages_only``); else each item goes
    to its list, in order, as the item-by-item split did."""
    letter = DeadLetter("not_a_copy", "x", b"", Origin("t"))
    batch = [
        (b"%d" % i, Origin("t", 0, i)) if kind == "message" else letter
        for i, kind in enumerate(kinds)
    ]
    messages, letters = _split_batch(batch)
    assert messages == [item for item in batch if type(item) is tuple]
    assert letters == [item for item in batch if type(item) is DeadLetter]
    assert _records.messages_only(batch) == (letters == [])
