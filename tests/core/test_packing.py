"""``Bandit.pack`` / ``unpack``: the bytes keep their layout (stored states are read back
years later), every value is checked as it comes in, and a state's rule is the kernel's."""

import doctest
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core.packed_layout import HEAD, columns_of, compact_of, layout_of, varint
from tsi_core import Bandit, Contextual, Fixed, Markov, Switching, _packing

COMPETITIONS = {
    "fixed": lambda: Fixed(),
    "contextual": lambda: Contextual(3),
    "switching": lambda: Switching(rate=0.05),
    "switching, decaying": lambda: Switching(),
    "markov": lambda: Markov([[0.8, 0.2, 0.0], [0.1, 0.8, 0.1], [0.0, 0.2, 0.8]], [0, 1, 2]),
}


def played(kind: str, rounds: int, seed: int) -> Bandit:
    """A bandit of 3 arms after ``rounds`` heavy-tailed losses."""
    competition = COMPETITIONS[kind]()
    contexts = competition.n_contexts if isinstance(competition, Contextual) else 1
    b = Bandit(3, competition, instance_id=f"{kind}-{seed}")
    rng = np.random.default_rng(seed)
    for i in range(rounds):
        context = i % contexts if contexts > 1 else None
        t = b.select(context, u=rng.random())
        b.update(t, float(rng.standard_cauchy() * 10.0 ** rng.integers(-3, 4)))
    return b


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(COMPETITIONS)), st.integers(0, 300), st.integers(0, 2**32 - 1))
def test_packed_bytes_have_the_documented_layout_and_unpack_to_the_same_bandit(kind, rounds, seed):
    b = played(kind, rounds, seed)
    blob = b.pack()
    assert blob == layout_of(b)
    again = Bandit.unpack(blob, Bandit(3, COMPETITIONS[kind]()), b.instance_id)
    assert again.to_dict() == b.to_dict()
    assert again.pack() == blob


@pytest.mark.parametrize("kind", ["fixed", "contextual"])
def test_columns_written_by_the_release_before_compact_arms_read_as_the_same_bandit(kind):
    b = played(kind, 300, 5)
    old = columns_of(b._row)  # every column as float64, no layout tag
    again = Bandit.unpack(old, Bandit(3, COMPETITIONS[kind]()), b.instance_id)
    assert again.to_dict() == b.to_dict()
    assert again.pack() == b.pack() and len(b.pack()) < len(old)


COUNTS = st.sampled_from([0, 1, 127, 128, 16_383, 16_384, 2**21, 2**53 - 1, 2**53])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(COUNTS, st.floats(0.0, 1e300)), min_size=3, max_size=3))
def test_compact_arms_hold_every_count_up_to_2_to_the_53_and_every_mean_square(arms):
    b = played("fixed", 20, 1)
    row = np.array(b._row)
    row[4] = 2**53  # updates: every count below it is allowed
    counts = np.array([c for c, _ in arms], dtype=float)
    squares = np.array([s if c else 0.0 for c, s in arms])
    row[-7:] = [np.count_nonzero(counts), *squares, *counts]
    blob = compact_of(row, 3)
    again = Bandit.unpack(blob, Bandit(3), "x")
    assert np.array_equal(again._row, row)
    assert again.pack() == blob
    assert len(blob) == HEAD.size + 8 * 3 + sum(len(varint(c)) + 8 * (c > 0) for c, _ in arms)


def test_the_layout_module_examples_hold():
    assert doctest.testmod(_packing).failed == 0


def test_packing_stays_exact_over_a_long_heavy_tailed_run():
    """10^4 rounds, packed and unpacked after every one, choose as the live bandit does."""
    live, moved = Bandit(5, Fixed(), instance_id="x"), Bandit(5, Fixed(), instance_id="x")
    template = Bandit(5)
    rng = np.random.default_rng(11)
    for _ in range(10_000):
        u, loss = rng.random(), float(rng.standard_cauchy() * 1e6)
        a, b = live.select(u=u), moved.select(u=u)
        assert a == b
        live.update(a, loss)
        moved.update(b, loss)
        moved = Bandit.unpack(moved.pack(), template, "x")
    assert moved.to_dict() == live.to_dict()


def damaged(field: int, value: float | int, tag: int | None = None) -> bytes:
    """Bytes of a played bandit with head field ``field`` set to ``value`` (the layout tag
    kept, or set to ``tag``)."""
    blob = played("fixed", 20, 1).pack()
    values = list(HEAD.unpack_from(blob))
    kept = values[5] >> 56 if tag is None else tag
    values[field] = value
    values[5] = values[5] & (2**56 - 1) | kept << 56
    return HEAD.pack(*values) + blob[HEAD.size :]


def compact_arms(*arms: bytes) -> bytes:
    """Bytes of a 3-arm bobw bandit after 20 rounds with its arms' block replaced."""
    blob = played("fixed", 20, 1).pack()
    return blob[: HEAD.size + 8 * 3] + b"".join(arms)


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (lambda: damaged(0, math.nan), "psi=nan"),
        (lambda: damaged(1, math.inf), "vn=inf"),
        (lambda: damaged(1, -1.0), "vn=-1.0"),
        (lambda: damaged(2, 1.0), "d=1.0"),
        (lambda: damaged(2, -0.25), "d=-0.25"),
        (lambda: damaged(4, -1), "invalid: -1, "),
        (lambda: damaged(5, 2**53 + 1), f"invalid: 20, {2**53 + 1}"),
        (lambda: played("fixed", 20, 1).pack() + b"\0", "1 bytes after the packed arm"),
        (lambda: "not bytes", "bytes"),
        (lambda: b"\0" * 47, "bytes"),
        (lambda: damaged(5, 20, tag=2), "layout 2 and"),
        (lambda: damaged(5, 20, tag=0), "a packed \\(1, 3\\) bandit is 128 bytes, got 99"),
        (lambda: compact_arms(varint(1) + b"\0" * 8, varint(1)), "end early, at arm 1"),
        (lambda: compact_arms(varint(1) + b"\0" * 8, b"\x80"), "end early"),
        (lambda: compact_arms(b"\x81\x00" + b"\0" * 8, varint(0), varint(0)), "shortest"),
        (lambda: compact_arms(varint(2**53 + 1), b"\0" * 8, varint(0), varint(0)), "2\\^53"),
        (lambda: compact_arms(varint(21) + b"\0" * 8, varint(0), varint(0)), "n_updates = 20"),
    ],
)
def test_unpack_names_each_damaged_value(blob, message):
    template = Bandit(3)
    before = template.to_dict()
    with pytest.raises(ValueError, match=message.replace("+", r"\+")):
        Bandit.unpack(blob(), template, "x")
    assert template.to_dict() == before


VALUES = st.lists(
    st.sampled_from([0.0, 1.5, -2.0, 1e300, -1e300, math.inf, -math.inf, math.nan, 5e-324]),
    min_size=3,
    max_size=3,
)


def rule_of(kind: str, values: np.ndarray) -> str | None:
    """Each kind's rule, written with numpy (the oracle)."""
    if kind in ("fixed", "contextual"):
        return None if np.isfinite(values).all() else "cumulative losses Φ/D must be finite"
    if kind.startswith("switching"):
        ok = np.isfinite(values).all() and (values >= 0).all() and values.sum() > 0
        return None if ok else "switching weights must be finite, >= 0, and not all 0"
    ok = not np.isnan(values).any() and not (values == math.inf).any()
    ok = ok and np.isfinite(values).any()
    return None if ok else "a state needs finite values or -inf, and at least one finite one"


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["fixed", "switching", "markov"]), VALUES)
def test_a_state_is_refused_by_its_kinds_rule_in_snapshots_and_in_bytes(kind, values):
    b = played(kind, 10, 3)
    kernel = b._table.kernel
    state = np.asarray(values, dtype=float)
    expected = rule_of(kind, state)
    assert kernel.state_problem(state) == expected
    data = b.to_dict()
    data["weights"] = [None if v == -math.inf else v for v in values]  # to_dict's -inf
    packed = b.pack()
    rest = packed[HEAD.size + 8 * state.size :]  # the Tsallis learner's arm statistics
    blob = packed[: HEAD.size] + state.astype("<f8").tobytes() + rest
    template = Bandit(3, COMPETITIONS[kind]())
    if expected is None:
        assert Bandit.unpack(blob, template, "x").pack() == blob
    else:
        with pytest.raises(ValueError, match=expected):
            Bandit.unpack(blob, template, "x")
        with pytest.raises(ValueError, match=expected):
            Bandit.from_dict(data)


def test_a_state_of_another_size_is_refused():
    kernel = Bandit(3)._table.kernel
    with pytest.raises(ValueError, match="a state has 3 values, got 4"):
        kernel.state_problem([0.0] * 4)
