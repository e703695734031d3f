"""Records built from compiled code equal the Python constructors' (flows.service._records)."""

import dataclasses
import doctest
import gc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flows.service import _records
from flows.service.events import DeadLetter, Origin, Selection, parse_request
from flows.service.logic import logic_builder
from flows.service.registry import Registry

Layout, kafka_message, kafka_batch = _records.Layout, _records.kafka_message, _records.kafka_batch
ORIGIN_FIELDS = ("source", "partition", "offset", "time")
values = st.one_of(st.none(), st.integers(), st.floats(allow_nan=False), st.text())


@given(st.tuples(values, values, values, values))
def test_a_built_record_equals_the_constructors(fields):
    assert Layout(Origin, ORIGIN_FIELDS).new(fields) == Origin(*fields)


def test_a_layout_refuses_fields_the_class_does_not_have():
    with pytest.raises(ImportError, match=r"builds Origin\('source', 'partition'\)"):
        Layout(Origin, ("source", "partition"))

    @dataclasses.dataclass  # no slots: nothing to fill
    class Loose:
        a: int

    with pytest.raises(ImportError, match="Loose"):
        Layout(Loose, ("a",))
    with pytest.raises(ValueError, match="has 4 fields"):
        Layout(Origin, ORIGIN_FIELDS).new(("t", 0))


class Message:
    """What a confluent-kafka Message answers (a unit test of the conversion alone; the
    Kafka tests run it against the broker)."""

    def __init__(self, value, offset, timestamp, error=None):
        self._value, self._offset, self._timestamp = value, offset, timestamp
        self._error = error

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
    assert selections == [(o.instance, o.to_json()) for o in outputs if type(o) is Selection]
    assert dead == [o for o in outputs if type(o) is DeadLetter]


def test_what_a_shard_keeps_per_ticket_is_not_walked_by_the_collector():
    registry = Registry.from_toml('[experiments.e]\narms = ["a", "b"]\n')
    shard = logic_builder(registry, clock=lambda: 0.0)(None)
    experiment = registry["e"]

    def ask(rid):
        raw = b'{"experiment":"e","request_id":"%s"}' % rid.encode()
        return [("e", experiment, parse_request(raw, Origin("t", 0, 1)))]

    shard.handle(ask("r1"))  # the Python path builds the instance
    shard.handle(ask("r2"))  # the compiled lane serves the second
    entry = shard.instances["e"].entries()["r2"]
    assert not gc.is_tracked(entry) and not gc.is_tracked(entry.ticket)
    assert not gc.is_tracked(entry.origin)
    assert gc.is_tracked(shard.instances["e"].entries()["r1"])  # the Python path's


def test_the_modules_examples_hold():
    """pytest's --doctest-modules does not read compiled modules: run the examples here."""
    result = doctest.testmod(_records)
    assert result.attempted > 0 and result.failed == 0
