"""The compiled kernel: its own exp and log, its table, its draws and its determinism."""

import hashlib
import math
import random
import struct
import subprocess
import sys
from decimal import Decimal, getcontext
from pathlib import Path

import numpy as np
import pytest

from tsi_core import Bandit, Contextual, Fixed, Markov, Switching
from tsi_core._kernel import Kernel, Table, exp, log
from tsi_core.migrate import migrate
from tsi_core.variant import DEFAULT_VARIANT

SRC = Path(__file__).resolve().parents[2] / "tsi_core" / "_kernel_src"
getcontext().prec = 50


def ulps(got: float, exact: Decimal) -> float:
    """|got - exact| in units of the last place of the float nearest to exact."""
    near = float(exact)
    if near == 0.0 or math.isinf(near):
        return 0.0 if got == near else math.inf
    return float(abs(Decimal(got) - exact) / Decimal(math.ulp(near)))


def test_exp_is_within_one_ulp_of_the_exact_value():
    rng = random.Random(1)
    xs = [rng.uniform(-745.0, 709.7) for _ in range(3000)]
    xs += [rng.uniform(-1e-3, 1e-3) for _ in range(500)] + [0.0, -0.0, 1.0, -1.0, 709.7, -745.0]
    worst = max(ulps(exp(x), Decimal(x).exp()) for x in xs)
    assert worst < 1.0, worst


def test_log_is_within_one_ulp_of_the_exact_value():
    rng = random.Random(2)
    xs = [math.ldexp(rng.uniform(0.5, 1.0), rng.randint(-1074, 1024)) for _ in range(3000)]
    xs += [1.0 + rng.uniform(-1e-2, 1e-2) for _ in range(500)] + [5e-324, 2.0, 10.0]
    worst = max(ulps(log(x), Decimal(x).ln()) for x in xs if x > 0)
    assert worst < 1.0, worst


@pytest.mark.parametrize(
    ("call", "x", "want"),
    [
        (exp, -math.inf, 0.0),
        (exp, math.inf, math.inf),
        (exp, 710.0, math.inf),
        (exp, -746.0, 0.0),
        (exp, -745.0, 5e-324),
        (log, 0.0, -math.inf),
        (log, math.inf, math.inf),
        (log, 1.0, 0.0),
    ],
)
def test_edges_of_exp_and_log(call, x, want):
    assert call(x) == want


def test_nan_and_negative_inputs_give_nan():
    assert math.isnan(exp(math.nan)) and math.isnan(log(math.nan)) and math.isnan(log(-1.0))


def test_the_exp_table_header_is_what_its_generator_writes():
    made = subprocess.run(
        [sys.executable, str(SRC / "make_exp_table.py")], capture_output=True, text=True, check=True
    ).stdout
    assert made == (SRC / "exp_table.h").read_text()


def test_own_draws_are_the_numpy_generators_numbers():
    own = Bandit(4, seed=123, instance_id="x")
    given = Bandit(4, instance_id="x")
    reference = np.random.default_rng(123)
    for t in range(300):
        mine, theirs = own.select(), given.select(u=reference.random())
        assert mine == theirs
        own.update(mine, float(t % 5))
        given.update(theirs, float(t % 5))


def test_own_draws_continue_from_a_restored_generator_state():
    b = Bandit(4, seed=5, instance_id="x")
    for _ in range(7):
        b.update(b.select(), 2.0)
    twin = Bandit.from_dict(b.to_dict())
    assert [b.select().arm for _ in range(20)] == [twin.select().arm for _ in range(20)]


CLASSES = {
    "fixed": Fixed(),
    "contextual": Contextual(3),
    "switching": Switching(rate=0.02),
    "decaying": Switching(),
    "markov": Markov(np.eye(6) * 0.9 + np.roll(np.eye(6), 1, axis=1) * 0.1, list(range(6))),
}

# Digests of 10,000 rounds of every class (each arm and the bits of its q), recorded on an
# AMD EPYC (x86-64, gcc 12). The kernel's arithmetic is fixed (own exp/log, no FMA, fixed
# sums): every machine must reproduce these bits; a change of the arithmetic changes them
# on purpose, and then they are re-recorded with the reason in the commit.
GOLDEN = {
    "fixed": "bda3b648effb8c9d0eed849a2c6a6752d915f7619190c2f09b91e2417d2a4844",
    "contextual": "859740e72f75cb82ee7bd416528d7a7fe46ff55d69ff2ae08211d605783cc5e9",
    "switching": "0eba490a0001b9ade82e04c2d8f43284abec6f8d4bba36786de2a0352b4cc067",
    "decaying": "f2ff68beaa48c2b8ce93ed6b025a9dfb1ff81fbb9b87a163ddb9adcdc1f1b762",
    "markov": "f0af7d0246fd1a5983512e5cb3d9a1c15105a7b5cbda266ac16ba0bfd0c7e56a",
}


# The same for the bobw variant (½-Tsallis-INF for Fixed and Contextual, robust's
# round for Switching and Markov), recorded on the same kind of machine.
GOLDEN_BOBW = {
    "contextual": "c1ccda545d62b1d383753c50313a1939eaf408dfc8fc8a295de47ad35f6f1b2a",
    "decaying": "f786773ba4662e47df6a9c714bd319f4e881753a992cfd44e2bb1e6c18a07ddf",
    "fixed": "e6abcf020dae1bfb1db3f8623efc5b2abaf5228e8cb1633825f937b88549783c",
    "markov": "2f5aa03511d337db409d1c8ed74fffc6f4797470cfda14cecfc6d4cb0d2ee2c7",
    "switching": "3ee1d7992e8022b04891c654212a26a01134e4f21fca2af6ae283f3ad970a96f",
}


def run_digest(name: str, variant: str = "paper", n_arms: int = 6, rounds: int = 10_000) -> str:
    """Inputs from Python's Mersenne Twister (its random() sequence is stable across Python
    versions) and exact float operations only: heavy-tailed losses as ratios of uniforms.
    6 arms by default: Σw's four lanes differ."""
    rng = random.Random(2026)
    b = Bandit(n_arms, CLASSES[name], instance_id="golden", variant=variant)
    digest = hashlib.sha256()
    for _ in range(rounds):
        ctx = int(rng.random() * 3) if name == "contextual" else None
        ticket = b.select(context=ctx, u=rng.random())
        digest.update(struct.pack("<qd", ticket.arm, ticket.prob))
        spread = (2.0 * rng.random() - 1.0) / (rng.random() + 1e-12)
        b.update(ticket, 1e6 * spread + 3.0 * ticket.arm)
    return digest.hexdigest()


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_selections_are_the_recorded_bits_on_every_machine(name):
    assert run_digest(name) == GOLDEN[name]


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_bobw_selections_are_the_recorded_bits_on_every_machine(name):
    assert run_digest(name, "bobw") == GOLDEN_BOBW[name]


# bobw with many arms (the sums' vector loop runs many times, and a tail of 1), 3,000
# rounds. Re-recorded when D became the mean over the arms of each arm's mean squared gap
# and when the bound on a negative estimate became 0.75/(η̃·sqrt(q)) (changes of the rule,
# not of the arithmetic; before them the lanes had kept every bit of the scalar chains).
GOLDEN_BOBW_WIDE = {
    ("fixed", 37): "de7deb939c59b2e9219ee1b19bb53423ff8f255246cd59e2c9a5eb7b2b0a3052",
    ("fixed", 1000): "7f1441968881d85e1b74e2874c90b16e67c2f1aea2afeb55d5736980f92272e9",
    ("contextual", 37): "71c6d3f9cf86d56ab79efc6ec08b5330f1d99106fa7a5587bd3471a68a85851e",
    ("contextual", 1000): "028b0f4fab5cb54254be3840bb6c9f7f5bc77974a4361528575cc2b4a2c9714a",
}


@pytest.mark.parametrize(("name", "n_arms"), sorted(GOLDEN_BOBW_WIDE))
def test_bobw_with_many_arms_plays_its_recorded_bits(name, n_arms):
    assert run_digest(name, "bobw", n_arms, rounds=3_000) == GOLDEN_BOBW_WIDE[name, n_arms]


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_the_default_variant_is_bobw_and_plays_its_recorded_bits(name):
    """An experiment that names no variant runs bobw, bit for bit."""
    assert DEFAULT_VARIANT == "bobw"
    assert run_digest(name, None) == GOLDEN_BOBW[name]


def test_the_table_refuses_bad_rows_and_arguments_before_changing_anything():
    k = Kernel("cumulative", n_arms=3, n_contexts=2, gamma=1.0)
    t = Table(k, k.initial_rows(2))
    before = t.rows.copy()
    for call in (
        lambda: t.select(2, 0, 0.5),
        lambda: t.select(0, 2, 0.5),
        lambda: t.select(0, 0, 1.0),
        lambda: t.update(0, 0, 3, 0.5, 0.5, 1.0),
        lambda: t.update(0, 0, 0, 0.0, 0.5, 1.0),
        lambda: t.update(0, 0, 0, 0.5, 0.5, math.nan),
        lambda: t.select_many(np.array([0, 5]), np.zeros(2, np.int64), np.zeros(2), *_outputs(2)),
    ):
        with pytest.raises(ValueError):
            call()
    assert np.array_equal(t.rows, before)


def _outputs(n):
    return np.empty(n, np.int64), np.empty(n), np.empty(n)


def test_many_events_in_one_call_equal_one_call_each_even_on_repeated_rows():
    k = Kernel("switching", n_arms=4, gamma=1.3, rate=None)
    one, many = Table(k, k.initial_rows(3)), Table(k, k.initial_rows(3))
    rng = np.random.default_rng(7)
    rows = rng.integers(0, 3, 400)
    u = rng.random(400)
    zeros = np.zeros(400, np.int64)
    arms, q, p = _outputs(400)
    many.select_many(rows, zeros, u, arms, q, p)
    singles = [one.select(int(r), 0, float(x)) for r, x in zip(rows, u, strict=True)]
    assert [s[:3] for s in singles] == list(zip(arms.tolist(), q.tolist(), p.tolist(), strict=True))
    losses = rng.standard_t(2.0, 400) * 1e3
    many.update_many(rows, zeros, arms, q, p, losses)
    for r, s, loss in zip(rows, singles, losses, strict=True):
        one.update(int(r), 0, s[0], s[1], s[2], float(loss))
    assert np.array_equal(one.rows, many.rows)


# Digests of the same 10,000 rounds under `robust` (recorded as GOLDEN above): a named
# variant keeps its bits whichever variant is the default.
GOLDEN_ROBUST = {
    "contextual": "6033699ceebbc80c70aaec9203c27e09c248d75f7576d2af8bdea17b44ebba12",
    "decaying": "39dbfa10053167c0379b44100f025b20a2ab296a7b35345bb1f7eabc2cb0fa84",
    "fixed": "c320cc24d58777bf22035bbba99a7942261b3329f87d7a2003c1eb2001d3a94f",
    "markov": "4e6ca7fc9368f21e00c3934f8a7d60fdfeac56b76cd3c9b10a762755ab57456e",
    "switching": "23c343cf42e8ef4e6ec94c9097dc07ef77a7bc5e0ceace075904dea79c7d0b60",
}


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_robust_selections_are_the_recorded_bits_on_every_machine(name):
    assert run_digest(name, "robust") == GOLDEN_ROBUST[name]


def migration_digest(name: str, variant: str = "robust") -> str:
    """2,000 rounds, then arms added, reordered and the class changed (``migrate`` runs
    log-sum-exps, logs and exps over the weights), then the bits of every context's q."""
    rng = random.Random(7)
    b = Bandit(6, CLASSES[name], instance_id="golden", variant=variant, seed=1)
    for _ in range(2000):
        ticket = b.select(context=int(rng.random() * 3) if name == "contextual" else None)
        b.update(ticket, (2.0 * rng.random() - 1.0) / (rng.random() + 1e-12))
    digest = hashlib.sha256()
    arm_map = [0, None, 2, 1, None, 3, 4, 5]
    for share, competition in ((None, None), (0.1, Contextual(3)), (None, Switching(0.01))):
        moved = migrate(b, arm_map, competition=competition, new_arm_share=share).bandit
        contexts = range(moved.structure.n_contexts) if moved.structure.n_contexts > 1 else [None]
        for context in contexts:
            digest.update(struct.pack(f"<{moved.n_arms}d", *moved.probabilities(context)))
    return digest.hexdigest()


# Digests of migration_digest, recorded on an AMD EPYC (x86-64, gcc 12) like GOLDEN.
GOLDEN_MIGRATION = {
    "contextual": "1aa0432dd6cf651a81bd8f91580aa23364a0f55c41e18292402444736758fef9",
    "decaying": "6705c7125c3b5f0535ac8f014686bce6e492b0e85678daaeae7f996336ebd9d1",
    "fixed": "7846f876d701cbdf91473f438e43b9aac78085f1d7a72eb790f35dd5d7d4b906",
    "markov": "81e662ab0bbadfd8a961071bf9992f21f1f10bff7cab167e514db47f867d6a54",
    "switching": "60849ca8ee31e5a30c356d7af9d1d61a7ddadfd2848446b674e49925a9f858e2",
}


# The same for bobw, the default (the Tsallis learner's migrations keep p, not Φ).
GOLDEN_MIGRATION_BOBW = {
    "contextual": "967971994b8a0f0cb55d65934c3341d83fc2b8f2956e8c3fd2604348b76fa0be",
    "decaying": "7bf7aff4a69d15d144aac515822f4427249953a0a5048aa32f9c0d70316cb627",
    "fixed": "a5bcffad79da33adac353caa04e03bc92d578a144f32441a873d4b293d761e79",
    "markov": "9bed575ca906afeaa122e8aef37facc9844ed7e4238308eda4b23bae72e14a88",
    "switching": "606b71454130924539466bce66c718c0710ef9c0afc055bf0042761e081aa632",
}


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_migration_gives_the_recorded_bits_on_every_machine(name):
    assert migration_digest(name) == GOLDEN_MIGRATION[name]
    assert migration_digest(name, "bobw") == GOLDEN_MIGRATION_BOBW[name]


@pytest.mark.parametrize("variant", ["robust", "bobw"])
@pytest.mark.parametrize("name", sorted(CLASSES))
def test_migration_never_uses_numpys_or_libms_exp_and_log(name, variant, monkeypatch):
    """Their last bits differ between machines (SIMD width, libm): only the kernel's."""

    def refused(*_args, **_kwargs):
        raise AssertionError("a machine-dependent exp/log was called")

    for module, names in (
        (np, ("exp", "log", "log1p", "expm1", "logaddexp")),
        (math, ("exp", "log")),
    ):
        for attribute in names:
            monkeypatch.setattr(module, attribute, refused)
    migration_digest(name, variant)
