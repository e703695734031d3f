"""The C table of packed bandits behaves as the dict it replaces, and costs less."""

import doctest
import sys

from flows.service._packed_table import PackedTable
from hypothesis import given, settings
from hypothesis import strategies as st

from flows.service import _packed_table

keys = st.one_of(
    st.sampled_from(["home:u1", "home:u2", "", "é:ü", "a\ud800b", "home:u1 "]),
    st.text(max_size=12),
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
