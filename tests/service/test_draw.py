"""The compiled draw (flows/service/instances/_draw.pyx) against the hashlib formula, bit for bit.

Served logs are replayed, so the draw is a compatibility contract: every input must give
the float the hashlib formula below gives, or raise the exception it raises.
"""

import doctest
import enum
import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flows.service.instances import _draw

uniform_draw = _draw.uniform_draw


def reference(seed, instance, request_id):
    """The contract: the service's original Python draw."""
    digest = hashlib.blake2b(
        f"{seed}\x00{instance}\x00{request_id}".encode(), digest_size=8
    ).digest()
    return (int.from_bytes(digest, "big") >> 11) / float(1 << 53)


def message_length(seed, instance, request_id):
    return len(f"{seed}\x00{instance}\x00{request_id}".encode())


def assert_same(seed, instance, request_id):
    u = uniform_draw(seed, instance, request_id)
    assert u.hex() == reference(seed, instance, request_id).hex()
    assert 0.0 <= u < 1.0


def outcome(f, *args):
    try:
        return ("value", f(*args).hex())
    except UnicodeEncodeError as exc:
        return ("UnicodeEncodeError", str(exc))


seeds = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.integers(min_value=-(2**200), max_value=2**200),  # incl. ints outside int64
    st.sampled_from([0, -1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, -(2**64)]),
)
# st.text() leaves out lone surrogates: this is every str that .encode() accepts
texts = st.text(max_size=300)


@settings(max_examples=400)
@given(seed=seeds, instance=texts, request_id=texts)
def test_equals_hashlib(seed, instance, request_id):
    assert_same(seed, instance, request_id)


@settings(max_examples=200)
@given(
    seed=seeds,
    instance=st.text(alphabet=st.characters(codec="utf-8"), max_size=300),
    request_id=st.text(alphabet=st.sampled_from("a\x00é\u20ac\U0001f600"), max_size=300),
)
def test_equals_hashlib_multibyte(seed, instance, request_id):
    """Multi-byte characters (and NULs) land on every position of the 128-byte blocks."""
    assert_same(seed, instance, request_id)


@settings(max_examples=20, deadline=None)
@given(
    seed=seeds,
    piece=st.text(min_size=1, max_size=16),
    length=st.integers(min_value=64 * 1024 - 300, max_value=64 * 1024 + 300),
    in_instance=st.booleans(),
)
def test_equals_hashlib_near_64_kib(seed, piece, length, in_instance):
    long = (piece * (length // len(piece) + 1))[:length]
    if in_instance:
        assert_same(seed, long, "r1")
    else:
        assert_same(seed, "home", long)


@pytest.mark.parametrize("n_bytes", [65535, 65536, 65537, 1 << 20])
@pytest.mark.parametrize("char", ["a", "é", "\u20ac", "\U0001f600"])
def test_long_text(n_bytes, char):
    width = len(char.encode())
    text = char * (n_bytes // width) + "a" * (n_bytes % width)
    assert len(text.encode()) == n_bytes
    assert_same(3, text, "r1")
    assert_same(3, "home", text)


@pytest.mark.parametrize("length", [127, 128, 129, 255, 256, 257, 383, 384, 385, 1023, 1024, 1025])
@pytest.mark.parametrize("seed", [7, -7, 10**30])
def test_message_lengths_on_block_boundaries(length, seed):
    """The encoded message is exactly ``length`` bytes: one or more full 128-byte blocks
    must be kept for the final compression (the last-block flag), not compressed early."""
    rest = length - message_length(seed, "", "")
    for instance, request_id in [
        ("", "r" * rest),
        ("h" * rest, ""),
        ("h" * (rest // 2), "r" * (rest - rest // 2)),
    ]:
        assert message_length(seed, instance, request_id) == length
        assert_same(seed, instance, request_id)


def test_every_length_and_split_up_to_three_blocks():
    for n in range(3 * 128 + 2):  # the message is "0", NUL, instance, NUL, request_id
        for split in {0, n // 3, n}:
            instance = "é" * (split // 2) + "x" * (split % 2)
            request_id = "r" * (n - split)
            assert message_length(0, instance, request_id) == 3 + n
            assert_same(0, instance, request_id)


def test_empty_strings():
    assert_same(0, "", "")


@pytest.mark.parametrize(
    "seed",
    [0, 1, -1, 9, 10, -10, 2**31, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, 10**50],
)
def test_int_seeds_around_int64(seed):
    assert_same(seed, "home", "r1")


class Color(enum.IntEnum):
    RED = 1


class MyInt(int):
    def __format__(self, spec):
        return "custom"


class MyStr(str):
    def __str__(self):
        return "other"


@pytest.mark.parametrize(
    "seed, instance, request_id",
    [
        (True, "home", "r1"),  # f"{True}" is "True", not "1"
        (False, "home", "r1"),
        (Color.RED, "home", "r1"),
        (MyInt(5), "home", "r1"),
        (1.5, "home", "r1"),
        ("5", "home", "r1"),
        (None, None, None),
        (5, MyStr("home"), MyStr("r1")),
        (5, 12, b"r1"),
    ],
)
def test_any_object_is_formatted_as_the_f_string_does(seed, instance, request_id):
    assert_same(seed, instance, request_id)


@pytest.mark.parametrize(
    "instance, request_id",
    [
        ("\ud800", "r1"),
        ("home", "\udfff"),
        ("hé\ud83d", "\ude00"),  # a pair split across the separator is still two lone ones
        ("home", "r" * 200 + "\ud800"),
    ],
)
def test_lone_surrogates_raise_the_same_error(instance, request_id):
    with pytest.raises(UnicodeEncodeError):
        reference(5, instance, request_id)
    with pytest.raises(UnicodeEncodeError):
        uniform_draw(5, instance, request_id)
    assert outcome(uniform_draw, 5, instance, request_id) == outcome(
        reference, 5, instance, request_id
    )


def test_surrogate_in_a_formatted_seed_raises_the_same_error():
    assert outcome(uniform_draw, "\ud800", "home", "r1") == outcome(
        reference, "\ud800", "home", "r1"
    )


@settings(max_examples=200)
@given(
    seed=seeds,
    instance=st.text(alphabet=st.characters(categories=["Cs", "Ll", "Lo"]), max_size=20),
    request_id=st.text(alphabet=st.characters(categories=["Cs", "Nd"]), max_size=20),
)
def test_text_with_surrogates_raises_or_equals(seed, instance, request_id):
    assert outcome(uniform_draw, seed, instance, request_id) == outcome(
        reference, seed, instance, request_id
    )


def test_int_too_large_to_format_raises_the_same_error():
    seed = 10**5000  # over sys.get_int_max_str_digits(): the f-string raises ValueError
    with pytest.raises(ValueError) as compiled:
        uniform_draw(seed, "home", "r1")
    with pytest.raises(ValueError) as expected:
        reference(seed, "home", "r1")
    assert str(compiled.value) == str(expected.value)


def test_known_values():
    """Pinned values: a change in hashlib or in the compiled draw would show here too."""
    assert uniform_draw(1, "home", "r1") == 0.449815937572541
    assert uniform_draw(0, "", "") == 0.16958615609837746


def test_compiled_module_doctests():
    """pytest's --doctest-modules does not read extension modules: run them here."""
    result = doctest.testmod(_draw)
    assert result.attempted > 0
    assert result.failed == 0
