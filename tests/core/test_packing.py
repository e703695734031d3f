"""``Bandit.pack`` / ``unpack``: the bytes keep their layout (stored states are read back
years later), every value is checked as it comes in, and a state's rule is the kernel's."""

import math
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tsi_core import Bandit, Contextual, Fixed, Markov, Switching

COMPETITIONS = {
    "fixed": lambda: Fixed(),
    "contextual": lambda: Contextual(3),
    "switching": lambda: Switching(rate=0.05),
    "switching, decaying": lambda: Switching(),
    "markov": lambda: Markov([[0.8, 0.2, 0.0], [0.1, 0.8, 0.1], [0.0, 0.2, 0.8]], [0, 1, 2]),
}
LAYOUT = struct.Struct("<dddqqq")  # ψ, V/D², D's mantissa, D's exponent, updates, rounds


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


def layout_of(b: Bandit) -> bytes:
    """The bytes of the documented layout, written with ``struct`` (the oracle)."""
    row = b._row
    head = LAYOUT.pack(row[0], row[1], row[2], int(row[3]), int(row[4]), int(row[5]))
    return head + np.asarray(row[6:], dtype="<f8").tobytes()


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(COMPETITIONS)), st.integers(0, 300), st.integers(0, 2**32 - 1))
def test_packed_bytes_have_the_documented_layout_and_unpack_to_the_same_bandit(kind, rounds, seed):
    b = played(kind, rounds, seed)
    blob = b.pack()
    assert blob == layout_of(b)
    again = Bandit.unpack(blob, Bandit(3, COMPETITIONS[kind]()), b.instance_id)
    assert again.to_dict() == b.to_dict()
    assert again.pack() == blob


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


def damaged(field: int, value: float | int) -> bytes:
    b = played("fixed", 20, 1)
    values = list(LAYOUT.unpack_from(b.pack()))
    values[field] = value
    return LAYOUT.pack(*values) + b.pack()[LAYOUT.size :]


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
        (lambda: played("fixed", 20, 1).pack() + b"\0", "bytes"),
        (lambda: "not bytes", "bytes"),
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
    rest = packed[LAYOUT.size + 8 * state.size :]  # the Tsallis learner's arm statistics
    blob = packed[: LAYOUT.size] + state.astype("<f8").tobytes() + rest
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
