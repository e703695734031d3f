"""An instance's book of kept answers holds what the entries held, exactly, in C rows."""

import doctest
import pickle
import sys
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flows.service.instances import _answer_book
from flows.service.instances.instance import Instance, Settled
from flows.service.instances.registry import Registry
from tsi_core import Ticket
from tsi_core._kernel import WHYS

AnswerBook, LIMIT = _answer_book.AnswerBook, _answer_book.LIMIT
RIDS = [f"r{i}" for i in range(LIMIT + 8)]

answers = st.tuples(
    st.sampled_from(["s", "x"]),
    st.sampled_from(RIDS),
    st.tuples(
        st.sampled_from(["home", "home\x00u1"]),
        st.integers(1, 2**63 - 1),
        st.integers(0, 50),
        st.floats(0, 1),
        st.floats(0, 1),
        st.one_of(st.none(), st.integers(0, 2**40)),
        st.sampled_from(WHYS),
    ),
    st.one_of(st.none(), st.text(max_size=5)),
    st.floats(-1e12, 1e12, allow_nan=False),
)
operations = st.lists(
    st.one_of(
        answers.map(lambda a: ("add", a)),
        st.sampled_from(RIDS).map(lambda r: ("pop", r)),
        st.floats(-1e12, 1e12, allow_nan=False).map(lambda t: ("expire", t)),
    ),
    max_size=200,
)


def same(a, b) -> bool:
    """Equal, with the same types throughout (a float stays a float, None stays None)."""
    if type(a) is not type(b):
        return False
    if type(a) is tuple:
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@settings(max_examples=300, deadline=None)
@given(operations)
def test_the_book_behaves_as_an_ordered_dict_of_its_tuples(ops):
    """Against a dict of the compact tuples in insertion order: what it holds, finds,
    hands back, drops at a deadline, and its earliest and latest deadlines."""
    book, model = AnswerBook(), {}
    for op, arg in ops:
        if op == "add":
            fits = arg[1] not in model and len(model) < LIMIT
            assert book.add(*arg) is fits
            if fits:
                model[arg[1]] = arg
        elif op == "pop":
            taken = book.pop(arg)
            expected = model.pop(arg, None)
            assert same(taken, expected), (taken, expected)
        else:
            dropped = book.expire(arg)
            kept = {rid: item for rid, item in model.items() if item[4] > arg}
            assert dropped == len(model) - len(kept)
            model = kept
        assert len(book) == len(model)
        assert all(same(a, b) for a, b in zip(book, model.values(), strict=True))
        assert all((rid in book) is (rid in model) for rid in RIDS)
        deadlines = [item[4] for item in model.values()]
        assert book.next_deadline() == (min(deadlines) if deadlines else None)
        assert book.newest() == (max(deadlines) if deadlines else None)


@pytest.mark.parametrize(
    "bad",
    [
        ("s", "r1", ("home", True, 0, 0.5, 0.5, None, "bandit"), None, 1.0),  # a bool round
        ("s", "r1", ("home", 1, 0, 1, 0.5, None, "bandit"), None, 1.0),  # an int prob
        ("s", "r1", ("home", 1, -1, 0.5, 0.5, None, "bandit"), None, 1.0),  # a negative arm
        ("s", "r1", ("home", 2**63, 0, 0.5, 0.5, None, "bandit"), None, 1.0),  # round > int64
        ("s", "r1", ("home", 1, 0, 0.5, 0.5, -3, "bandit"), None, 1.0),  # a negative context
        ("s", "r1", ("home", 1, 0, 0.5, 0.5, None, "bandit"), b"u1", 1.0),  # a unit not a str
        ("s", "r1", (b"home", 1, 0, 0.5, 0.5, None, "bandit"), None, 1.0),  # instance not str
        ("s", "r1", ("home", 1, 0, 0.5, 0.5, None, "nudge"), None, 1.0),  # an unknown why
        ("s", "r1", ("home", 1, 0, 0.5, 0.5, None), None, 1.0),  # six fields: before ``why``
        ("s", "r1", ("home", 1, 0, 0.5, 0.5), None, 1.0),  # a ticket of five fields
        ("o", "r1", ("home", 1, 0, 0.5, 0.5, None, "bandit"), None, 1.0),  # not an answer's kind
    ],
)
def test_a_value_a_row_cannot_hold_exactly_is_refused_and_changes_nothing(bad):
    """The caller then keeps the answer as an entry: nothing is rounded or retyped."""
    book = AnswerBook()
    book.add("s", "r0", ("home", 1, 0, 0.5, 0.5, None, "bandit"), None, 2.0)
    before = list(book)
    assert book.add(*bad) is False
    assert list(book) == before and "r1" not in book
    assert AnswerBook.of([*before, bad]) is None


def test_a_deadline_that_is_not_a_float_is_refused_from_compact_tuples():
    assert AnswerBook.of([("s", "r1", ("home", 1, 0, 0.5, 0.5, None, "bandit"), None, 9)]) is None


def test_a_full_book_refuses_the_next_answer():
    book = AnswerBook()
    for i in range(LIMIT):
        assert book.add("s", f"r{i}", ("home", i + 1, 0, 0.5, 0.5, None, "burn_in"), None, i * 1.0)
    assert not book.add("s", "one more", ("home", 99, 0, 0.5, 0.5, None, "bandit"), None, 1.0)
    assert len(book) == LIMIT and "one more" not in book


def test_a_book_pickles_as_its_answers():
    book = AnswerBook()
    book.add("x", "r1", ("home", 3, 1, 0.25, 0.5, 2, "holdout"), "u1", 5.5)
    again = pickle.loads(pickle.dumps(book))
    assert list(again) == list(book) and again.due == 5.5


def test_a_book_pickled_before_why_reads_its_tickets_as_the_bandits():
    """A book pickled when tickets had six fields unpickles with why "bandit"."""
    old = _answer_book._book_of([("x", "r1", ("home", 3, 1, 0.25, 0.5, 2), "u1", 5.5)])
    assert list(old) == [("x", "r1", ("home", 3, 1, 0.25, 0.5, 2, "bandit"), "u1", 5.5)]


def test_the_strings_a_book_held_are_let_go():
    """Every reference a row takes is given back: popped, expired, or with the book."""
    rid, unit, instance = "".join(["r", "1"]), "".join(["u", "1"]), "".join(["ho", "me"])
    counts = [sys.getrefcount(s) for s in (rid, unit, instance)]
    for leave in ("pop", "expire", "drop"):
        book = AnswerBook()
        book.add("s", rid, (instance, 1, 0, 0.5, 0.5, None, "bandit"), unit, 1.0)
        assert [sys.getrefcount(s) for s in (rid, unit, instance)] == [c + 1 for c in counts]
        if leave == "pop":
            item = book.pop(rid)
            del item
        elif leave == "expire":
            assert book.expire(1.0) == 1
        del book
        assert [sys.getrefcount(s) for s in (rid, unit, instance)] == counts


def test_the_modules_examples_hold():
    """pytest's --doctest-modules does not read compiled modules: run them here."""
    result = doctest.testmod(_answer_book)
    assert result.attempted > 0 and result.failed == 0


def test_a_kept_answer_costs_two_fifths_of_its_entry_at_most():
    """10,000 instances with five answers each: the bytes the answers take as book rows
    (88 bytes a row, room for eight) and as ``Settled`` entries with their tickets, dict
    and heap (what an instance held before), the strings they share apart."""
    exp = Registry.from_toml('[experiments.e]\narms = ["a", "b"]\nper_unit = true')["e"]
    rids = [f"r{i}" for i in range(5)]

    def held(as_book: bool) -> int:
        instances = [Instance(exp, f"e\x00u{i}") for i in range(10_000)]
        tracemalloc.start()
        for n, inst in enumerate(instances):
            answers = []
            for i, rid in enumerate(rids):
                ticket = Ticket(inst.key, i + 1, i % 2, 0.5 + n * 1e-9, 0.5 + i * 1e-9)
                answers.append(("s", rid, tuple(ticket), None, 100.0 + n))
                if not as_book:
                    inst.put(Settled(rid, ticket, None, 100.0 + n))
            if as_book:
                inst.keep_compact(tuple(answers))
        size = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        return size

    book, entries = held(True), held(False)
    per_answer = book / 50_000
    assert per_answer <= 160 and book * 2.5 <= entries, (per_answer, entries / 50_000)
