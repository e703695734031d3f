"""Long-horizon properties: what any implementation of the engine (the compiled kernel too)
must keep over 10,000 rounds of heavy-tailed losses with late, out-of-order feedback.

1. ``Bandit`` and ``BatchBandit`` are one arithmetic: the same arms and the same bits of q
   and p at every round, and the same state at the end, for every competition class and γ.
2. Losses scaled by 2**k give the same arms and the same bits of q at every round.
3. The probabilities agree with the paper's transcription (``paper_reference``) to 1e-9 for
   the cases ``test_reference.py`` leaves out: other γ, three contexts, fixed-share rates
   above (M-1)/M, larger and sparse Markov classes, some classes without prior mass, and
   feedback that arrives late and out of order.
4. A refused call (bad loss, draw, context, instance or ticket) raises a ``ValueError`` that
   names the value and leaves the instance exactly as it was: its twin, which never saw the
   bad call, stays identical afterwards.

Every stream, draw and delay comes from seeded generators: nothing here is an expected
value written down, every check compares two computations.
"""

from __future__ import annotations

import functools
import json
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from tests.core.paper_reference import PaperReference
from tsi_core import (
    VARIANTS,
    Bandit,
    BatchBandit,
    Contextual,
    Fixed,
    Markov,
    Switching,
    Ticket,
    TicketBatch,
)

ROUNDS = 10_000
N_ARMS = 4
N_INSTANCES = 3


# ------------------------------------------------------------------ competition classes


def sparse_chain(k: int = 12, m: int = 4) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A banded K×K chain over K = 12 classes of 4 arms (3 classes per arm): each class stays
    with 0.9 or moves one or three classes on (to another arm); 36 of 144 entries are
    non-zero. Only the first four classes have prior mass: the rest start at log w = -inf."""
    t = np.zeros((k, k))
    i = np.arange(k)
    t[i, i] = 0.9
    t[i, (i + 1) % k] = 0.07
    t[i, (i + 3) % k] = 0.03
    initial = np.zeros(k)
    initial[:m] = 1.0 / m
    return t, i % m, initial


DENSE_CHAIN = np.array(
    [
        [0.85, 0.05, 0.05, 0.05],
        [0.10, 0.70, 0.10, 0.10],
        [0.02, 0.03, 0.90, 0.05],
        [0.25, 0.25, 0.25, 0.25],
    ]
)
DENSE_ARM_OF = [0, 1, 2, 2]

CLASSES: dict[str, Callable[[], Any]] = {
    "fixed": Fixed,
    "contextual": lambda: Contextual(3),
    "switching": lambda: Switching(rate=0.02),
    "decaying": Switching,  # rate None: α_k = 1/(k+1)
    "markov-dense": lambda: Markov(DENSE_CHAIN, DENSE_ARM_OF),
    "markov-sparse": lambda: Markov(*sparse_chain()),
}
GAMMAS = {"default": None, "0.1": 0.1, "1": 1.0, "10": 10.0}


def n_contexts(name: str) -> int:
    return 3 if name == "contextual" else 1


# ---------------------------------------------------------------------------- streams


@dataclass(frozen=True)
class Stream:
    """Everything a run consumes, drawn in advance: draws, contexts, losses and the
    feedback schedule. ``due[t]`` lists, in the order to apply them after round t's
    selection, the parts (round s <= t, instance mask) whose feedback arrives then."""

    u: np.ndarray  # (rounds, instances)
    contexts: np.ndarray | None  # (rounds, instances), None for classes without contexts
    losses: np.ndarray  # (rounds, instances, arms)
    due: list[list[tuple[int, np.ndarray]]]


@functools.cache
def stream(n_ctx: int, rounds: int = ROUNDS, n: int = N_INSTANCES, m: int = N_ARMS) -> Stream:
    """Heavy-tailed losses: Student-t (df 1.5) times 1e6 around a shifted mean; the best arm
    changes every 2,500 rounds and with the context. Feedback comes 0-8 rounds late; a
    quarter of the rounds are settled in two parts (instance masks) at different times;
    the parts due together are applied in a random order (so often newest first)."""
    rng = np.random.default_rng(20240611 + n_ctx)
    u = rng.random((rounds, n))
    contexts = rng.integers(0, n_ctx, size=(rounds, n)) if n_ctx > 1 else None
    best = (np.arange(rounds)[:, None] // 2500 + (0 if contexts is None else contexts)) % m
    worse = (np.arange(m) != best[:, :, None]) * 3.0
    losses = -4.2e7 + 1e6 * (worse + rng.standard_t(1.5, size=(rounds, n, m)))
    due: list[list[tuple[int, np.ndarray]]] = [[] for _ in range(rounds)]
    for t in range(rounds):
        delay = int(rng.choice([0, 0, 1, 2, 3, 5]))
        if rng.random() < 0.25:
            first = rng.random(n) < 0.5
            parts = [(first, delay), (~first, delay + int(rng.integers(0, 4)))]
        else:
            parts = [(np.ones(n, dtype=bool), delay)]
        for mask, d in parts:
            if mask.any():
                due[min(t + d, rounds - 1)].append((t, mask))
    for t in range(rounds):
        order = rng.permutation(len(due[t]))
        due[t] = [due[t][j] for j in order]
    return Stream(u, contexts, losses, due)


def context_of(s: Stream, t: int, i: int) -> int | None:
    return None if s.contexts is None else int(s.contexts[t, i])


def apply_due(s: Stream, t: int, issued: list, batch: BatchBandit, singles: list) -> None:
    """The feedback due after round ``t`` (late, out of order, partial), given to the batch
    and to each single bandit alike: ``issued[r]`` is round r's (batch tickets, single
    tickets, losses)."""
    for source, mask in s.due[t]:
        late_batch, late_singles, losses = issued[source]
        batch.update(late_batch, losses, where=mask)
        for i in np.flatnonzero(mask):
            singles[i].update(late_singles[i], float(losses[i]))


def first_difference(a: list[Any], b: list[Any]) -> str:
    j = next(j for j, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
    x, y = a[j], b[j]
    if isinstance(x, float) and isinstance(y, float) and x and y:
        return f"instance {j}: {x!r} != {y!r} (relative difference {abs(x / y - 1):.2e})"
    return f"instance {j}: {x!r} != {y!r}"


# ---------------------------------------------------- 1. Bandit and BatchBandit are one


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("gamma", list(GAMMAS.values()), ids=[f"gamma={g}" for g in GAMMAS])
@pytest.mark.parametrize("name", list(CLASSES))
def test_batch_and_separate_bandits_agree_bit_for_bit_over_10000_rounds(name, gamma, variant):
    """N=3 BatchBandit instances against 3 Bandits with the same draws and the same late,
    out-of-order, partial feedback: the same arm, q and p (exact float equality) at every
    round, and the same statistics and probabilities at the end."""
    competition = CLASSES[name]()
    s = stream(n_contexts(name))
    batch = BatchBandit(N_INSTANCES, N_ARMS, competition, gamma=gamma, seed=0, variant=variant)
    singles = [
        Bandit(N_ARMS, competition, gamma=gamma, seed=0, variant=variant)
        for _ in range(N_INSTANCES)
    ]
    issued: list[tuple[TicketBatch, list[Ticket], np.ndarray]] = []
    idx = np.arange(N_INSTANCES)
    for t in range(ROUNDS):
        tickets = batch.select(contexts=None if s.contexts is None else s.contexts[t], u=s.u[t])
        single = [
            b.select(context=context_of(s, t, i), u=float(s.u[t, i])) for i, b in enumerate(singles)
        ]
        for label, got, want in (
            ("arm", tickets.arms.tolist(), [x.arm for x in single]),
            ("q", tickets.probs.tolist(), [x.prob for x in single]),
            ("p", tickets.weight_shares.tolist(), [x.weight_share for x in single]),
        ):
            assert got == want, f"round {t + 1}: BatchBandit {label} differs, " + (
                first_difference(got, want)
            )
        issued.append((tickets, single, s.losses[t, idx, tickets.arms]))
        apply_due(s, t, issued, batch, singles)
    for i, b in enumerate(singles):
        state = b.to_dict()
        assert (batch.psi[i], batch.n_updates[i], batch.n_rounds[i]) == (
            b.psi,
            b.n_updates,
            b.n_rounds,
        )
        assert (batch.vn[i], batch.d_mant[i], batch.d_exp[i]) == (
            state["vn"],
            state["d_mant"],
            state["d_exp"],
        )
        for c in range(n_contexts(name)):
            ctx = None if s.contexts is None else c
            assert np.array_equal(
                batch.probabilities([i], None if ctx is None else [ctx])[0], b.probabilities(ctx)
            ), f"instance {i}, context {ctx}: final probabilities differ"


# ----------------------------------------------------------- 2. exact under 2**k scaling


def play(
    name: str, transform: Callable[[float], float], variant: str = "paper"
) -> tuple[list, list, list, np.ndarray]:
    """One Bandit on instance 0 of the stream (late, out-of-order feedback) fed
    transform(loss): per round the arm, q and p of its ticket and the full q it drew from."""
    s = stream(n_contexts(name))
    b = Bandit(N_ARMS, CLASSES[name](), seed=0, instance_id="x", variant=variant)
    arms, probs, shares, qs = [], [], [], np.empty((ROUNDS, N_ARMS))
    issued = []
    for t in range(ROUNDS):
        ctx = context_of(s, t, 0)
        qs[t] = b.probabilities(ctx)
        ticket = b.select(context=ctx, u=float(s.u[t, 0]))
        arms.append(ticket.arm)
        probs.append(ticket.prob)
        shares.append(ticket.weight_share)
        issued.append(ticket)
        for source, mask in s.due[t]:
            if mask[0]:
                ticket = issued[source]
                b.update(ticket, transform(float(s.losses[source, 0, ticket.arm])))
    return arms, probs, shares, qs


@functools.cache
def unscaled(name: str, variant: str) -> tuple[list, list, list, np.ndarray]:
    return play(name, float, variant)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("k", [-60, -1, 7, 300], ids=lambda k: f"x2^{k}")
@pytest.mark.parametrize("name", list(CLASSES))
def test_power_of_two_scaling_gives_identical_bits_over_10000_rounds(name, k, variant):
    """Heavy-tailed losses times 2**k choose the same arms with the same q (all arms) and
    the same q and p on the ticket, bit for bit, at every round."""
    scale = 2.0**k
    losses = stream(n_contexts(name)).losses
    # the scaling itself is exact: no loss leaves float64's normal range
    assert np.array_equal(losses * scale / scale, losses)
    assert np.abs(losses * scale).min() > 2.0**-1000 and np.isfinite(losses * scale).all()
    base = unscaled(name, variant)
    scaled = play(name, lambda x: x * scale, variant)
    labels = ("arm", "q of the arm", "p of the arm", "q")
    differ = [np.asarray(got) != np.asarray(want) for got, want in zip(scaled, base, strict=True)]
    differ[3] = differ[3].any(axis=1)
    rounds = [int(np.argmax(d)) if d.any() else ROUNDS for d in differ]
    t = min(rounds)
    if t < ROUNDS:
        j = rounds.index(t)
        pytest.fail(
            f"round {t + 1}: {labels[j]} {np.asarray(scaled[j])[t].tolist()!r} != "
            f"{np.asarray(base[j])[t].tolist()!r} unscaled"
        )


@pytest.mark.parametrize("variant", [v for v in VARIANTS if VARIANTS[v].baseline == "mean"])
@pytest.mark.parametrize("name", list(CLASSES))
def test_mean_baseline_chooses_the_same_arms_under_an_affine_map_over_10000_rounds(name, variant):
    """Under l -> 1000·l + 10^6 (not exact in floating point) the mean baseline keeps every
    selection over 10,000 heavy-tailed rounds, Switching and Markov included, and q to
    1e-6: the rounding of the map does not grow into other decisions."""
    base = unscaled(name, variant)
    mapped = play(name, lambda x: 1000.0 * x + 1e6, variant)
    differ = np.flatnonzero(np.asarray(mapped[0]) != np.asarray(base[0]))
    assert not len(differ), f"{len(differ)} selections differ, the first at round {differ[0] + 1}"
    np.testing.assert_allclose(mapped[3], base[3], rtol=1e-6, atol=0)


# ------------------------------------------------ 3. the paper's transcription, to 1e-9


def switching_kernel(m: int, rate: float | None) -> Callable[[int], np.ndarray]:
    def kernel(k: int) -> np.ndarray:
        a = 1.0 / (k + 1) if rate is None else rate
        return (1 - a) * np.eye(m) + a / (m - 1) * (1 - np.eye(m))

    return kernel


@dataclass(frozen=True)
class PaperCase:
    competition: Any
    n_arms: int
    n_contexts: int
    arm_of: Callable[[int, int], int]
    kernel: Callable[[int], np.ndarray]
    initial: np.ndarray


def paper_case(name: str) -> PaperCase:
    """The competition class and its explicit enumeration for the transcription."""
    if name.startswith("fixed"):
        m = 4
        return PaperCase(Fixed(), m, 1, lambda lam, c: lam, lambda _: np.eye(m), np.full(m, 1 / m))
    if name.startswith("contextual"):  # 3 contexts × 3 arms: 27 maps context -> arm
        m, n_ctx = 3, 3
        k = m**n_ctx
        return PaperCase(
            Contextual(n_ctx),
            m,
            n_ctx,
            lambda lam, c: (lam // m**c) % m,
            lambda _: np.eye(k),
            np.full(k, 1 / k),
        )
    if name.startswith(("switching", "decaying")):
        m, rate = {
            "switching": (4, 0.02),
            "switching-2-arms-rate=0.7": (2, 0.7),  # 1 - α - α/(M-1) < 0: the other branch
            "switching-rate=1": (3, 1.0),
            "decaying": (4, None),
            "decaying-2-arms": (2, None),
        }[name.split("-gamma")[0]]
        return PaperCase(
            Switching(rate=rate),
            m,
            1,
            lambda lam, c: lam,
            switching_kernel(m, rate),
            np.full(m, 1 / m),
        )
    if name.startswith("markov-dense"):
        return PaperCase(
            Markov(DENSE_CHAIN, DENSE_ARM_OF),
            4,
            1,
            lambda lam, c: DENSE_ARM_OF[lam],
            lambda _: DENSE_CHAIN,
            np.full(4, 1 / 4),
        )
    t, arm_of, initial = sparse_chain()
    return PaperCase(
        Markov(t, arm_of, initial), 4, 1, lambda lam, c: int(arm_of[lam]), lambda _: t, initial
    )


PAPER_CASES = [
    ("fixed-gamma=0.1", 0.1),
    ("fixed-gamma=10", 10.0),
    ("contextual-3-contexts", None),
    ("contextual-3-contexts-gamma=10", 10.0),
    ("switching-gamma=1", 1.0),
    ("switching-2-arms-rate=0.7", None),
    ("switching-rate=1", None),
    ("decaying", None),
    ("decaying-gamma=10", 10.0),
    ("decaying-2-arms", None),
    ("markov-dense", None),
    ("markov-dense-gamma=0.1", 0.1),
    ("markov-sparse", None),
    ("markov-sparse-gamma=10", 10.0),
]


@pytest.mark.parametrize(("name", "gamma"), PAPER_CASES, ids=[c[0] for c in PAPER_CASES])
def test_probabilities_match_paper_transcription_with_late_feedback(name, gamma):
    """200 rounds of well-scaled losses (a quarter of them ties on a 0.25 grid), feedback
    0-5 rounds late and out of order: q of every context agrees with the transcription to
    1e-9 before every selection, and the ticket records the transcription's q and p."""
    case = paper_case(name)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    bandit = Bandit(case.n_arms, case.competition, gamma=gamma, seed=0, variant="paper")
    reference = PaperReference(case.n_arms, case.arm_of, case.kernel, case.initial, bandit.gamma)
    means = rng.normal(size=(case.n_contexts, case.n_arms)) * 2
    waiting: list[tuple[int, Ticket, float]] = []
    for t in range(200):
        for c in range(case.n_contexts):
            ctx = c if case.n_contexts > 1 else None
            np.testing.assert_allclose(
                bandit.probabilities(ctx),
                reference.policy(c)[0],
                rtol=1e-9,
                atol=0,
                err_msg=f"round {t + 1}, context {ctx}",
            )
        c = int(rng.integers(case.n_contexts))
        ctx = c if case.n_contexts > 1 else None
        q_ref, p_ref = reference.policy(c)
        ticket = bandit.select(context=ctx, u=float(rng.random()))
        assert ticket.prob == pytest.approx(q_ref[ticket.arm], rel=1e-9)
        assert ticket.weight_share == pytest.approx(p_ref[ticket.arm], rel=1e-9, abs=0)
        loss = means[c, ticket.arm] + rng.normal()
        loss = round(loss * 4) / 4 if rng.random() < 0.25 else float(loss)
        waiting.append((t + int(rng.choice([0, 0, 1, 2, 5])), ticket, loss))
        due = [w for w in waiting if w[0] <= t]
        waiting = [w for w in waiting if w[0] > t]
        for j in rng.permutation(len(due)):
            _, late, loss = due[j]
            c = 0 if late.context is None else late.context
            reference.update(late.arm, loss, late.prob, late.weight_share, c)
            bandit.update(late, loss)
    assert bandit.psi == reference.psi
    assert pytest.approx(reference.D, rel=1e-15) == bandit.D
    assert pytest.approx(reference.V, rel=1e-12) == bandit.V


# ------------------------------------------------- 4. refusals change nothing at all


def state_of(b: Bandit) -> str:
    return json.dumps(b.to_dict(), sort_keys=True)


@dataclass
class Scene:
    """A bandit part-way through a run, with tickets in every condition."""

    bandit: Any
    context: Any  # a valid context (or contexts) for the next selection
    pending: Any  # still open
    settled: Any  # updated
    discarded: Any  # discarded (Bandit) or partly settled (BatchBandit)
    foreign: Any  # open on another instance of the same configuration


def scripted(name: str, batch: bool, rounds: int) -> Callable[[Any, int, list], None]:
    """A deterministic script for twin instances: ``step(b, t, held)`` plays round t's
    selection (the instance's own draws every third round), appends its ticket(s) to
    ``held`` and applies the feedback due then (late, out of order, in parts)."""
    s = stream(n_contexts(name), rounds=rounds)

    def step(b: Any, t: int, held: list) -> None:
        own = t % 3 == 0  # the instance's own generator: a refused call must not draw from it
        if batch:
            tickets = b.select(
                contexts=None if s.contexts is None else s.contexts[t],
                u=None if own else s.u[t],
            )
            held.append(tickets)
        else:
            held.append(b.select(context=context_of(s, t, 0), u=None if own else float(s.u[t, 0])))
        for source, mask in s.due[t]:
            tickets = held[source]
            if tickets is None:
                continue
            if batch:
                b.update(tickets, s.losses[source, np.arange(len(mask)), tickets.arms], mask)
            elif mask[0]:
                b.update(tickets, float(s.losses[source, 0, tickets.arm]))
                held[source] = None

    return step


def bandit_scene(name: str) -> tuple[Scene, Callable[[], None]]:
    """Twin Bandits after 40 rounds; returns the scene of the first and a function that
    plays both 40 more rounds and checks they stay identical."""
    comp = CLASSES[name]()
    twins = [Bandit(N_ARMS, comp, seed=4, instance_id="twin") for _ in range(2)]
    step = scripted(name, batch=False, rounds=80)
    helds: list[list] = [[], []]
    for t in range(40):
        for b, held in zip(twins, helds, strict=True):
            step(b, t, held)
    ctx = 1 if name == "contextual" else None
    extra = []
    for b in twins:  # one ticket settled, one discarded, one left open
        done, dropped, open_ = (b.select(context=ctx, u=x) for x in (0.1, 0.5, 0.9))
        b.update(done, -3.0e7)
        b.discard(dropped)
        extra.append((done, dropped, open_))
    other = Bandit(N_ARMS, comp, seed=4, instance_id="other")
    foreign = other.select(context=ctx, u=0.5)
    scene = Scene(twins[0], ctx, extra[0][2], extra[0][0], extra[0][1], foreign)

    def continue_both() -> None:
        for t in range(40, 80):
            for b, held in zip(twins, helds, strict=True):
                step(b, t, held)
            assert helds[0][-1] == helds[1][-1], f"round {t + 1}: the twins' selections differ"
        for b, (_, _, open_) in zip(twins, extra, strict=True):
            b.update(open_, 1.5e6)
        assert state_of(twins[0]) == state_of(twins[1])

    return scene, continue_both


NAN, INF = float("nan"), float("inf")

# (id, call on a Scene, pattern the ValueError's message must contain)
BANDIT_REFUSALS: list[tuple[str, Callable[[Scene], Any], str]] = [
    ("loss=np.nan", lambda s: s.bandit.update(s.pending, np.float64(NAN)), "nan"),
    ("loss=np.inf", lambda s: s.bandit.update(s.pending, np.float64(INF)), "inf"),
    ("loss=-inf", lambda s: s.bandit.update(s.pending, -INF), "-inf"),
    ("loss=np.True_", lambda s: s.bandit.update(s.pending, np.True_), "True"),
    ("loss=False", lambda s: s.bandit.update(s.pending, False), "False"),
    ("loss='2.5'", lambda s: s.bandit.update(s.pending, "2.5"), "'2.5'"),
    ("loss=None", lambda s: s.bandit.update(s.pending, None), "None"),
    ("loss=[1.0]", lambda s: s.bandit.update(s.pending, [1.0]), r"\[1\.0\]"),
    ("loss=1+0j", lambda s: s.bandit.update(s.pending, 1 + 0j), r"\(1\+0j\)"),
    ("u=1.0", lambda s: s.bandit.select(s.context, u=1.0), r"1\.0"),
    ("u=np.float64(1.0)", lambda s: s.bandit.select(s.context, u=np.float64(1.0)), r"1\.0"),
    ("u=-1e-300", lambda s: s.bandit.select(s.context, u=-1e-300), r"-1e-300"),
    ("u=nan", lambda s: s.bandit.select(s.context, u=NAN), "nan"),
    ("u=inf", lambda s: s.bandit.select(s.context, u=INF), "inf"),
    ("u=True", lambda s: s.bandit.select(s.context, u=True), "True"),
    ("u='0.5'", lambda s: s.bandit.select(s.context, u="0.5"), "'0.5'"),
    ("update-settled-ticket", lambda s: s.bandit.update(s.settled, 1.0), "round"),
    ("update-discarded-ticket", lambda s: s.bandit.update(s.discarded, 1.0), "round"),
    ("discard-settled-ticket", lambda s: s.bandit.discard(s.settled), "round"),
    ("update-foreign-ticket", lambda s: s.bandit.update(s.foreign, 1.0), "'other'"),
    ("discard-foreign-ticket", lambda s: s.bandit.discard(s.foreign), "'other'"),
    (
        "update-altered-ticket",
        lambda s: s.bandit.update(s.pending._replace(prob=s.pending.prob / 2), 1.0),
        "altered",
    ),
    (
        "update-ticket-of-a-new-round",
        lambda s: s.bandit.update(s.pending._replace(round=10**6), 1.0),
        "1000000",
    ),
    ("update-a-dict", lambda s: s.bandit.update(s.pending.to_dict(), 1.0), "Ticket"),
]
UNCONTEXTUAL_REFUSALS = [
    ("select-context=0", lambda s: s.bandit.select(0, u=0.5), r"context given \(0\)"),
    ("probabilities-context=1", lambda s: s.bandit.probabilities(1), r"context given \(1\)"),
]
CONTEXTUAL_REFUSALS = [
    ("select-no-context", lambda s: s.bandit.select(None), "context is required"),
    ("select-context=3", lambda s: s.bandit.select(3, u=0.5), "got 3"),
    ("select-context=-1", lambda s: s.bandit.select(-1), "got -1"),
    ("select-context=True", lambda s: s.bandit.select(True, u=0.5), "got True"),
    ("select-context=1.0", lambda s: s.bandit.select(1.0), r"got 1\.0"),
    ("select-context='1'", lambda s: s.bandit.select("1"), "got '1'"),
    ("probabilities-context=3", lambda s: s.bandit.probabilities(3), "got 3"),
]


def refusal_params(common: list, plain: list, contextual: list) -> list:
    return [
        pytest.param(name, call, message, id=f"{name}-{label}")
        for name in CLASSES
        for label, call, message in common + (contextual if name == "contextual" else plain)
    ]


@pytest.mark.parametrize(
    ("name", "call", "message"),
    refusal_params(BANDIT_REFUSALS, UNCONTEXTUAL_REFUSALS, CONTEXTUAL_REFUSALS),
)
def test_bandit_refusal_names_the_value_and_changes_nothing(name, call, message):
    """With delayed tickets pending and a live generator: the refused call raises a
    ValueError naming the value, ``to_dict()`` (weights, statistics, counters, pending
    tickets, generator) is unchanged, and the instance then plays 40 rounds exactly like
    its twin that never saw the call."""
    scene, continue_both = bandit_scene(name)
    before = state_of(scene.bandit)
    with pytest.raises(ValueError, match=message):
        call(scene)
    assert state_of(scene.bandit) == before
    continue_both()


def batch_arrays(b: BatchBandit, n_ctx: int) -> dict[str, np.ndarray]:
    """Copies of the per-instance statistics and the probabilities of every context."""
    arrays = {
        "psi": b.psi,
        "vn": b.vn,
        "d_mant": b.d_mant,
        "d_exp": b.d_exp,
        "n_updates": b.n_updates,
        "n_rounds": b.n_rounds,
    }
    for c in range(n_ctx):
        contexts = None if n_ctx == 1 else np.full(b.n_instances, c)
        arrays[f"probabilities(context {c})"] = b.probabilities(contexts=contexts)
    return {k: np.array(v, copy=True) for k, v in arrays.items()}


def batch_scene(name: str) -> tuple[Scene, Callable[[], None]]:
    comp = CLASSES[name]()
    n_ctx = n_contexts(name)
    twins = [BatchBandit(N_INSTANCES, N_ARMS, comp, seed=4) for _ in range(2)]
    step = scripted(name, batch=True, rounds=80)
    helds: list[list] = [[], []]
    for t in range(40):
        for b, held in zip(twins, helds, strict=True):
            step(b, t, held)
    ctx = np.array([1, 0, 2]) if n_ctx > 1 else None
    some = np.array([True, False, True])
    extra = []
    for b in twins:  # one batch settled, one settled in part, one left open
        done, part, open_ = (b.select(contexts=ctx, u=np.full(3, x)) for x in (0.1, 0.5, 0.9))
        b.update(done, np.array([-3.0e7, 2.0e6, 5.0]))
        b.update(part, np.array([1.0e6, 0.0, -2.0e6]), where=some)
        extra.append((done, part, open_))
    foreign = BatchBandit(N_INSTANCES, N_ARMS, comp, seed=4).select(contexts=ctx)
    scene = Scene(twins[0], ctx, extra[0][2], extra[0][0], extra[0][1], foreign)

    def continue_both() -> None:
        for t in range(40, 80):
            for b, held in zip(twins, helds, strict=True):
                step(b, t, held)
            a, c = helds[0][-1], helds[1][-1]
            for field in ("arms", "probs", "weight_shares"):
                assert np.array_equal(getattr(a, field), getattr(c, field)), (
                    f"round {t + 1}: the twins' {field} differ"
                )
        for b, (_, part, open_) in zip(twins, extra, strict=True):
            b.update(open_, np.array([1.5e6, -1.0, 0.25]))
            b.update(part, np.array([0.0, 7.0e5, 0.0]), where=~some)
        first, second = batch_arrays(twins[0], n_ctx), batch_arrays(twins[1], n_ctx)
        for label, x in first.items():
            assert np.array_equal(x, second[label]), f"the twins' {label} differ at the end"

    return scene, continue_both


def _losses(*values: Any) -> Callable[[Scene], Any]:
    return lambda s: s.bandit.update(s.pending, np.array(values))


BATCH_REFUSALS: list[tuple[str, Callable[[Scene], Any], str]] = [
    ("losses[1]=nan", _losses(1.0, NAN, 2.0), r"losses\[1\] = nan"),
    ("losses[2]=inf", _losses(1.0, 2.0, INF), r"losses\[2\] = inf"),
    ("losses[0]=-inf", _losses(-INF, 2.0, 3.0), r"losses\[0\] = -inf"),
    ("losses-bool", _losses(True, False, True), "losses must be 3 real numbers"),
    ("losses-strings", _losses("1.5", "x", "2"), "'x'"),
    # numpy turns None into nan: either name is the value
    ("losses-None", lambda s: s.bandit.update(s.pending, [1.0, None, 2.0]), r"None|\[1\] = nan"),
    ("losses-2-of-3", _losses(1.0, 2.0), "losses must be 3 real numbers"),
    ("losses-3x1", lambda s: s.bandit.update(s.pending, np.ones((3, 1))), "losses must be 3"),
    (
        "losses[1]=nan-where-taken",
        lambda s: s.bandit.update(s.pending, [1.0, NAN, 2.0], where=np.array([0, 1, 0]) > 0),
        r"losses\[1\] = nan",
    ),
    (
        "where-integers",
        lambda s: s.bandit.update(s.pending, [1.0, 2.0, 3.0], where=[1, 0, 1]),
        "where must be 3 booleans",
    ),
    (
        "where-2-of-3",
        lambda s: s.bandit.update(s.pending, [1.0, 2.0, 3.0], where=np.array([True, False])),
        "where must be 3 booleans",
    ),
    ("u[1]=1.0", lambda s: s.bandit.select(contexts=s.context, u=[0.1, 1.0, 0.2]), r"1\.0"),
    ("u[0]=nan", lambda s: s.bandit.select(contexts=s.context, u=[NAN, 0.1, 0.2]), "nan"),
    ("u[2]=-0.5", lambda s: s.bandit.select(contexts=s.context, u=[0.1, 0.2, -0.5]), r"-0\.5"),
    ("u[1]=inf", lambda s: s.bandit.select(contexts=s.context, u=[0.1, INF, 0.2]), "inf"),
    ("u-bool", lambda s: s.bandit.select(contexts=s.context, u=[True, False, True]), "u must"),
    ("u-strings", lambda s: s.bandit.select(contexts=s.context, u=["a", "b", "c"]), "u must"),
    ("u-2-of-3", lambda s: s.bandit.select(contexts=s.context, u=[0.1, 0.2]), "u must"),
    (
        "instances-repeat",
        lambda s: s.bandit.select([1, 1], None if s.context is None else s.context[:2]),
        "must not repeat",
    ),
    (
        "instances[1]=3",
        lambda s: s.bandit.select([0, 3], None if s.context is None else s.context[:2]),
        r"instances\[1\] = 3",
    ),
    (
        "instances[0]=-1",
        lambda s: s.bandit.select([-1], None if s.context is None else s.context[:1]),
        r"instances\[0\] = -1",
    ),
    (
        "instances-floats",
        lambda s: s.bandit.select([0.0, 1.0], None if s.context is None else s.context[:2]),
        "instances must be integers",
    ),
    (
        "probabilities-instances[0]=5",
        lambda s: s.bandit.probabilities([5], None if s.context is None else s.context[:1]),
        r"instances\[0\] = 5",
    ),
    ("update-settled-batch", lambda s: s.bandit.update(s.settled, [1.0] * 3), "already settled"),
    ("discard-settled-batch", lambda s: s.bandit.discard(s.settled), "already settled"),
    (
        "update-settled-entry",
        lambda s: s.bandit.update(s.discarded, [1.0] * 3),
        "entry 0 .* already settled",
    ),
    (
        "discard-settled-entry",
        lambda s: s.bandit.discard(s.discarded, where=np.array([False, True, True])),
        "entry 2 .* already settled",
    ),
    ("update-foreign-batch", lambda s: s.bandit.update(s.foreign, [1.0] * 3), "another"),
    ("discard-foreign-batch", lambda s: s.bandit.discard(s.foreign), "another"),
    ("update-a-list", lambda s: s.bandit.update(list(s.pending.arms), [1.0] * 3), "TicketBatch"),
]
BATCH_UNCONTEXTUAL_REFUSALS = [
    ("select-contexts", lambda s: s.bandit.select(contexts=[0, 0, 0]), "has no contexts"),
    ("probabilities-contexts", lambda s: s.bandit.probabilities(contexts=[0] * 3), "no contexts"),
]
BATCH_CONTEXTUAL_REFUSALS = [
    ("select-no-contexts", lambda s: s.bandit.select(), "contexts are required"),
    ("select-contexts[1]=3", lambda s: s.bandit.select(contexts=[0, 3, 1]), r"contexts\[1\] = 3"),
    ("select-contexts[2]=-1", lambda s: s.bandit.select(contexts=[0, 1, -1]), r"\[2\] = -1"),
    ("select-contexts-floats", lambda s: s.bandit.select(contexts=[0.0, 1.0, 2.0]), "integers"),
    ("select-contexts-2-of-3", lambda s: s.bandit.select(contexts=[0, 1]), "3 integers"),
    ("probabilities-contexts[0]=3", lambda s: s.bandit.probabilities(None, [3, 0, 0]), "= 3"),
]


@pytest.mark.parametrize(
    ("name", "call", "message"),
    refusal_params(BATCH_REFUSALS, BATCH_UNCONTEXTUAL_REFUSALS, BATCH_CONTEXTUAL_REFUSALS),
)
def test_batch_refusal_names_the_value_and_changes_nothing(name, call, message):
    """With ticket batches open, partly settled and settled, and a live generator: the
    refused call raises a ValueError naming the value; psi, vn, D, n_updates, n_rounds and
    the probabilities of every context are unchanged, and the instances then play 40
    rounds (own draws included) exactly like their twins that never saw the call."""
    scene, continue_both = batch_scene(name)
    n_ctx = n_contexts(name)
    before = batch_arrays(scene.bandit, n_ctx)
    with pytest.raises(ValueError, match=message):
        call(scene)
    after = batch_arrays(scene.bandit, n_ctx)
    for label, old in before.items():
        assert np.array_equal(old, after[label]), f"{label} changed"
    continue_both()
