"""The C table of packed bandits behaves as the dict it replaces, and costs less."""

import doctest
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from flows.service.instances import _packed_table
from flows.service.instances._packed_table import PackedTable

keys = st.one_of(
    st.sampled_from(["home:u1", "home:u2", "", "é:ü", "a\ud800b", "home:u1 "]),
    st.text(max_size=12),
    st.text(min_size=70, max_size=90),  # often over 127 bytes: a two-byte length
)
operations = st.lists(
    st.tuples(st.sampled_from(["set", "pop", "has"]), keys, st.binary(max_size=300)),
    max_size=400,
)


@settings(max_examples=300, deadline=None)
@given(operations)
def test_the_table_holds_what_a_dict_would(script):
    table, model = PackedTable(), {}
    for operation, key, value in script:
        if operation == "set":
            table[key] = value
            model[key] = value
        elif operation == "pop":
            assert table.pop(key) == model.pop(key, None)
        else:
            assert (key in table) == (key in model)
        assert len(table) == len(model)
    assert sorted(table.items()) == sorted(model.items())
    assert sorted(table) == sorted(model)


timed_operations = st.lists(
    st.tuples(
        st.sampled_from(["put", "put", "pop", "due"]),
        st.sampled_from([f"home:u{i}" for i in range(12)]),
        st.floats(0.0, 100.0),
    ),
    max_size=300,
)


@settings(max_examples=300, deadline=None)
@given(timed_operations)
def test_a_timed_table_finds_every_record_whose_deadline_has_come(script):
    """``due(now)``: exactly the held records with a deadline at or before ``now``, in
    (deadline, key) order; a record removed or replaced is never reported for its old
    deadline; the heap's stale entries are dropped (it stays within bounds)."""
    table, model = PackedTable(timed=True), {}
    for operation, key, when in script:
        if operation == "put":
            table.put(key, key.encode(), when)
            model[key] = when
        elif operation == "pop":
            assert table.pop(key) == (key.encode() if model.pop(key, None) is not None else None)
        else:
            expected = sorted((at, k) for k, at in model.items() if at <= when)
            assert table.due(when) == expected
            for _, k in expected:  # the caller builds (pops) what is due
                table.pop(k)
                del model[k]
        head = table.next_deadline()  # may be a removed record's: a wake-up for nothing
        assert not model or (head is not None and head <= min(model.values()))
    assert sorted(table.items()) == sorted((k, k.encode()) for k in model)


def test_a_timed_table_drops_the_heap_entries_of_records_gone():
    """Tickets answered long before their deadline leave heap entries behind: they do not
    accumulate."""
    table = PackedTable(timed=True)
    table.put("home:kept", b"x", 3600.0)
    size = table.nbytes()
    for i in range(100_000):
        table.put(f"home:u{i % 50}", b"ticket", 3600.0 + i)
        table.pop(f"home:u{i % 50}")
    assert table.nbytes() < size + 4096 and table.due(1e9) == [(3600.0, "home:kept")]
    for bad in (float("nan"),):
        try:
            table.put("home:u1", b"t", bad)
        except ValueError as exc:
            assert "nan" in str(exc)
        else:
            raise AssertionError("a NaN deadline was accepted")
    assert "home:u1" not in table


def test_holes_are_squeezed_out_and_the_table_stays_small():
    """10^5 entries cost less than a dict of str -> bytes (counted without malloc's
    rounding), and churn (pop, put back) does not grow the arena."""
    table, as_dict = PackedTable(), {}
    for i in range(100_000):
        table[f"home:u{i}"] = as_dict[f"home:u{i}"] = bytes(128)
    size = table.nbytes()
    in_dict = sys.getsizeof(as_dict) + sum(
        sys.getsizeof(k) + sys.getsizeof(v) for k, v in as_dict.items()
    )
    assert size < 0.8 * in_dict
    for _round in range(5):
        for i in range(0, 100_000, 3):
            table[f"home:u{i}"] = table.pop(f"home:u{i}")
    assert table.nbytes() < 1.6 * size and len(table) == 100_000


def test_lengths_of_every_size_round_trip():
    """A record's lengths are varints: one, two, three bytes and more."""
    table = PackedTable(timed=True)
    sizes = [0, 1, 127, 128, 16_383, 16_384, 2_097_152]
    for n in sizes:
        table.put("k" * n, bytes(range(256)) * (n // 256) + b"v" * (n % 256), float(n))
    for n in sizes:
        assert table.pop("k" * n) == bytes(range(256)) * (n // 256) + b"v" * (n % 256)
    assert len(table) == 0 and table.due(1e9) == []


def test_an_idle_instance_costs_about_its_own_bytes():
    """At 10^5 records of a 12-byte key and a 132-byte value (an idle 10-arm instance in
    a shard), the table adds under 30 B a record: 3 B of lengths, the 8-byte index
    slots at their load factor and the arena's growth step."""
    table = PackedTable()
    for i in range(100_000):
        table[f"home:u{i:07d}"] = bytes(132)
    assert table.nbytes() < 100_000 * (12 + 132 + 30)


def test_bad_keys_and_values_are_refused_with_their_type():
    table = PackedTable()
    for key, value in ((1, b""), (None, b""), ("k", "text"), ("k", None)):
        try:
            table[key] = value
        except TypeError as exc:
            assert type(key).__name__ in str(exc) or type(value).__name__ in str(exc)
        else:
            raise AssertionError(f"{key!r}: {value!r} was accepted")
    assert len(table) == 0


def test_the_doctests_of_the_compiled_module():
    assert doctest.testmod(_packed_table).failed == 0
