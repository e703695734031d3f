"""Allocation (a floor, a holdout, a burn-in, a forced arm) and eligible arms, in the one
compiled round: checked settings, the probabilities against the rule's oracle
(``allocation_reference``), the plain allocation unchanged, Bandit and BatchBandit one
arithmetic, invariance under affine maps of the losses, and logs that off-policy
evaluation reads without bias."""

from __future__ import annotations

import math
import os
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flows.tools.evaluation.estimators import snips_estimate
from tests.core import allocation_reference as ref
from tests.core.test_long_horizon import (
    CLASSES,
    N_ARMS,
    N_INSTANCES,
    ROUNDS,
    apply_due,
    context_of,
    stream,
)
from tsi_core import VARIANTS, Allocation, Bandit, BatchBandit, Contextual, Fixed, Ticket
from tsi_core._kernel import WHYS

EXAMPLES = int(os.environ.get("TSI_HYPOTHESIS_EXAMPLES", 60))


def state_of(b: Bandit) -> dict:
    return b.to_dict()


# ------------------------------------------------------------------ settings and checks


@pytest.mark.parametrize(
    ("allocation", "n_arms", "named"),
    [
        (Allocation(min_share=-0.1), 3, "-0.1"),
        (Allocation(min_share=1.0), 3, "1.0"),
        (Allocation(min_share=math.nan), 3, "nan"),
        (Allocation(min_share="0.1"), 3, "'0.1'"),  # type: ignore[arg-type]
        (Allocation(min_share=True), 3, "True"),
        (Allocation(min_share=0.5), 2, "min_share 0.5 with 2 arms: M·f must be < 1"),
        (Allocation(min_share=0.25), 4, "min_share 0.25 with 4 arms"),
        (Allocation(holdout_arm=0, holdout_share=1.0), 3, "holdout_share .* 1.0"),
        (Allocation(holdout_arm=0, holdout_share=-0.2), 3, "-0.2"),
        (Allocation(holdout_arm=3, holdout_share=0.1), 3, "holdout_arm 3"),
        (Allocation(holdout_arm=-1, holdout_share=0.1), 3, "holdout_arm -1"),
        (Allocation(holdout_arm="a", holdout_share=0.1), 3, "'a'"),  # type: ignore[arg-type]
        (Allocation(holdout_arm=1), 3, "holdout_arm 1 and holdout_share 0.0"),
        (Allocation(holdout_share=0.1), 3, "holdout_arm None and holdout_share 0.1"),
        (Allocation(burn_in=-1), 3, "-1"),
        (Allocation(burn_in=1.5), 3, "1.5"),  # type: ignore[arg-type]
        (Allocation(burn_in=True), 3, "True"),
        (Allocation(force_arm=5), 3, "force_arm 5"),
        (Allocation(force_arm=-1), 3, "force_arm -1"),
        (Allocation(force_arm=1.0), 3, "1.0"),  # type: ignore[arg-type]
    ],
)
def test_a_bad_setting_is_refused_by_name_and_changes_nothing(allocation, n_arms, named):
    with pytest.raises(ValueError, match=named):
        allocation.check(n_arms)
    with pytest.raises(ValueError, match=named):
        Bandit(n_arms, allocation=allocation)
    with pytest.raises(ValueError, match=named):
        BatchBandit(2, n_arms, allocation=allocation)
    b = Bandit(n_arms, seed=1, allocation=Allocation(min_share=0.01))
    b.update(b.select(), 3.0)
    before = state_of(b)
    with pytest.raises(ValueError, match=named):
        b.allocation = allocation
    assert state_of(b) == before and b.allocation == Allocation(min_share=0.01)


def test_an_allocation_that_is_not_one_is_refused():
    with pytest.raises(ValueError, match="allocation must be an Allocation"):
        Bandit(3, allocation={"min_share": 0.1})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown allocation setting 'floor'"):
        Allocation.from_dict({"floor": 0.1})


settings_of = st.builds(
    Allocation,
    min_share=st.one_of(st.floats(-1, 1.5), st.just(0.0)),
    holdout_arm=st.one_of(st.none(), st.integers(-1, 5)),
    holdout_share=st.one_of(st.floats(-0.5, 1.5), st.just(0.0)),
    burn_in=st.one_of(st.integers(-3, 50), st.just(0)),
    force_arm=st.one_of(st.none(), st.integers(-1, 5)),
)


@settings(max_examples=EXAMPLES * 5, deadline=None)
@given(a=settings_of, n_arms=st.integers(1, 5))
def test_check_accepts_exactly_the_settings_of_the_rule(a, n_arms):
    """Valid: f in [0, 1) with M·f < 1; a holdout arm in range with a share in (0, 1), or
    neither; burn_in >= 0; a forced arm in range or none. Else ValueError."""
    valid = (
        0 <= a.min_share < 1
        and n_arms * a.min_share < 1
        and 0 <= a.holdout_share < 1
        and (a.holdout_arm is None) == (a.holdout_share == 0)
        and (a.holdout_arm is None or 0 <= a.holdout_arm < n_arms)
        and a.burn_in >= 0
        and (a.force_arm is None or 0 <= a.force_arm < n_arms)
    )
    if valid:
        assert a.check(n_arms) is a
        assert Allocation.from_dict(a.to_dict()) == a
    else:
        with pytest.raises(ValueError):
            a.check(n_arms)


@pytest.mark.parametrize(
    ("eligible", "named"),
    [
        ([], r"\[\]"),
        ([3], "eligible arm 3"),
        ([-1], "eligible arm -1"),
        ([0, 0], r"repeat: \[0, 0\]"),
        (["a"], r"\['a'\]"),
        ([0.5], r"\[0.5\]"),
        ([True, False], r"\[True, False\]"),
        ([False, False, False], "no eligible arm"),
        ([[0, 1]], r"\[\[0, 1\]\]"),
        ("01", "'01'"),
        (1, "1"),
    ],
)
def test_bad_eligible_arms_are_refused_by_name_and_change_nothing(eligible, named):
    """No draw is taken, no round counted, nothing pending."""
    b = Bandit(3, seed=5, allocation=Allocation(min_share=0.1, burn_in=2))
    b.update(b.select(), 1.0)
    b.select()
    before = state_of(b)
    with pytest.raises(ValueError, match=named):
        b.select(eligible=eligible)
    with pytest.raises(ValueError, match=named):
        b.probabilities(eligible=eligible)
    assert state_of(b) == before


def test_a_forced_arm_must_be_eligible():
    b = Bandit(3, seed=5, allocation=Allocation(force_arm=2))
    before = state_of(b)
    message = r"force_arm 2 is not among the eligible arms \[0, 1\]"
    with pytest.raises(ValueError, match=message):
        b.select(eligible=[0, 1])
    with pytest.raises(ValueError, match=message):
        b.probabilities(eligible=[True, True, False])
    assert state_of(b) == before
    bb = BatchBandit(2, 3, seed=5, allocation=Allocation(force_arm=2))
    with pytest.raises(ValueError, match=r"force_arm 2 is not among the eligible arms \[0, 1\]"):
        bb.select(eligible=np.array([[True, True, True], [True, True, False]]))
    assert bb.n_rounds.tolist() == [0, 0]


def test_a_batch_row_with_no_eligible_arm_is_refused():
    bb = BatchBandit(3, 3, seed=5)
    mask = np.ones((3, 3), dtype=bool)
    mask[1] = False
    with pytest.raises(ValueError, match="eligible row 1 has no eligible arm"):
        bb.select(eligible=mask)
    with pytest.raises(ValueError, match="eligible must be booleans of shape"):
        bb.select(eligible=np.ones((2, 3), dtype=bool))
    assert bb.n_rounds.tolist() == [0, 0, 0]


# ------------------------------------------------------------- the rule, against its oracle


allocations = st.builds(
    Allocation,
    min_share=st.sampled_from([0.0, 0.01, 0.05, 0.2]),
    holdout_arm=st.just(None),
    burn_in=st.sampled_from([0, 3, 40]),
).flatmap(
    lambda a: st.sampled_from(
        [
            a,
            Allocation(a.min_share, 0, 0.1, a.burn_in),
            Allocation(a.min_share, 2, 0.5, a.burn_in),
            Allocation(a.min_share, 1, 0.3, a.burn_in, force_arm=1),
        ]
    )
)


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    allocation=allocations,
    variant=st.sampled_from(sorted(VARIANTS)),
    seed=st.integers(0, 2**32 - 1),
    contextual=st.booleans(),
)
def test_every_ticket_logs_the_probability_of_the_rule(allocation, variant, seed, contextual):
    """Over 120 rounds with random eligible sets: P (``probabilities``) is a distribution
    over the eligible arms equal to the oracle's to rounding; each ticket's prob is P of its
    arm bit for bit, its arm and why are the oracle's (away from a boundary of the draw),
    its weight share the learner's p; n_rounds counts every selection."""
    rng = np.random.default_rng(seed)
    m = 4
    b = Bandit(m, Contextual(2) if contextual else Fixed(), seed=seed, variant=variant)
    b.allocation = allocation
    for t in range(120):
        ctx = int(rng.integers(2)) if contextual else None
        eligible = rng.random(m) < 0.6
        if not eligible.any() or allocation.force_arm is not None:
            eligible[1] = True
        arms = np.flatnonzero(eligible).tolist()
        given_as = arms if t % 2 else eligible  # indices or a boolean mask
        p = b.probabilities(ctx, given_as)
        expected = ref.serving(b.policy(ctx), allocation, b.n_rounds, eligible)
        assert p.sum() == pytest.approx(1.0, abs=1e-12)
        assert (p[~eligible] == 0).all()
        assert (p[eligible] > 0).all() or allocation.force_arm is not None
        np.testing.assert_allclose(p, expected, rtol=1e-12, atol=1e-15)
        u = float(rng.random())
        arm, why, margin = ref.served(b.policy(ctx), allocation, b.n_rounds, u, eligible)
        shares = b.weight_shares(ctx)
        ticket = b.select(ctx, u=u, eligible=given_as)
        assert ticket.prob == p[ticket.arm] and ticket.weight_share == shares[ticket.arm]
        assert ticket.round == b.n_rounds == t + 1
        if margin > 1e-9:
            assert (ticket.arm, ticket.why) == (arm, why)
        b.update(ticket, float(rng.standard_t(2)) * 1e3 + ticket.arm)


def test_burn_in_serves_uniformly_then_the_learner_and_counts_every_request():
    b = Bandit(4, seed=3, allocation=Allocation(burn_in=10))
    for _ in range(30):
        b.update(b.select(u=0.999), 0.0 if b.n_rounds % 2 else 5.0)
    b = Bandit(4, seed=3, allocation=Allocation(burn_in=10))
    whys = []
    for t in range(12):
        if t < 10:
            assert b.probabilities().tolist() == [0.25] * 4
            assert b.probabilities(eligible=[1, 3]).tolist() == [0, 0.5, 0, 0.5]
        ticket = b.select()
        whys.append(ticket.why)
        b.discard(ticket)
    assert whys == ["burn_in"] * 10 + ["bandit"] * 2 and b.n_rounds == 12


def test_the_plain_allocation_and_every_arm_eligible_change_no_bit():
    """Allocation() and eligible=None are the learner's draw itself (the golden digests of
    test_kernel check its bits); naming every arm, or an allocation whose settings no
    longer apply (a burn-in that is over), draws the same bits through the general path."""
    for variant in VARIANTS:
        plain, named, burnt = (Bandit(5, instance_id="x", variant=variant) for _ in range(3))
        rng = np.random.default_rng(4)
        for t in range(2_000):
            if t == 1:  # the burn-in is over: an allocation whose settings do not apply
                burnt.allocation = Allocation(burn_in=1)
            u = float(rng.random())
            a = plain.select(u=u)
            b = named.select(u=u, eligible=[4, 3, 2, 1, 0] if t % 2 else [True] * 5)
            c = burnt.select(u=u)
            assert a == b == c
            loss = float(rng.standard_t(1.5)) * 1e4 + a.arm
            for bandit, ticket in ((plain, a), (named, b), (burnt, c)):
                bandit.update(ticket, loss)
        assert plain._packed() == named._packed() == burnt._packed()


# ------------------------------------------------------------------------ forced arms


def test_a_forced_arm_is_served_with_probability_one_and_teaches_nothing():
    b = Bandit(3, instance_id="f")
    for t in range(50):
        b.update(b.select(u=(t * 0.37) % 1), float(t % 3))
    learned = Bandit.unpack(b.pack(), Bandit(3), "twin")
    b.allocation = Allocation(force_arm=2, min_share=0.1, holdout_arm=0, holdout_share=0.2)
    assert b.probabilities().tolist() == [0.0, 0.0, 1.0]
    tickets = [b.select(u=u, eligible=[1, 2] if u > 0.5 else None) for u in (0.01, 0.6, 0.99)]
    assert [(t.arm, t.prob, t.why) for t in tickets] == [(2, 1.0, "forced")] * 3
    assert [t.weight_share for t in tickets] == [learned.weight_shares()[2]] * 3
    before = b.pack(keep_pending=True)
    for t in tickets:
        b.update(t, 1e9)
    assert b.pack() == before and b.n_updates == learned.n_updates
    assert b.n_rounds == learned.n_rounds + 3
    b.allocation = None  # removing the forced arm resumes from the learned state
    assert b.policy().tolist() == learned.policy().tolist()
    assert b.probabilities().tolist() == learned.probabilities().tolist()
    assert b.select(u=0.3)[2:] == learned.select(u=0.3)[2:]


def test_a_batch_forced_arm_teaches_nothing():
    bb = BatchBandit(4, 3, seed=2)
    bb.update(bb.select(), np.arange(4.0))
    rows = bb.rows.copy()
    bb.allocation = Allocation(force_arm=1)
    tickets = bb.select()
    assert tickets.arms.tolist() == [1] * 4 and tickets.probs.tolist() == [1.0] * 4
    assert [WHYS[c] for c in tickets.why] == ["forced"] * 4
    bb.update(tickets, np.full(4, 1e9))
    assert np.array_equal(bb.rows[:, 6:], rows[:, 6:]) and bb.n_updates.tolist() == [1] * 4
    with pytest.raises(Exception, match="already settled"):
        bb.update(tickets, np.zeros(4))


# --------------------------------------------------------------- tickets and snapshots


def test_why_travels_with_a_ticket_and_old_forms_read_as_the_bandits():
    t = Ticket("a", 3, 1, 0.25, 0.2, None, "holdout")
    assert Ticket.from_dict(t.to_dict()) == t and pickle.loads(pickle.dumps(t)) == t
    old = {"instance": "a", "round": 3, "arm": 1, "prob": 0.25, "weight_share": 0.2}
    assert Ticket.from_dict(old).why == "bandit"
    assert Ticket("a", 3, 1, 0.25, 0.2).why == "bandit"
    with pytest.raises(ValueError, match=r"why must be one of .* got 'nudge'"):
        Ticket.from_dict({**old, "why": "nudge"})


def test_the_allocation_and_pending_whys_survive_snapshots():
    a = Allocation(min_share=0.05, holdout_arm=1, holdout_share=0.5, burn_in=2)
    b = Bandit(3, instance_id="s", allocation=a)
    pending = [b.select(u=u) for u in (0.1, 0.7, 0.9, 0.3)]
    assert [t.why for t in pending] == ["holdout", "burn_in", "bandit", "holdout"]
    again = Bandit.from_dict(b.to_dict())
    assert again.allocation == a and again.pending == b.pending
    assert again.to_dict() == b.to_dict()
    old = b.to_dict()
    del old["allocation"]
    assert Bandit.from_dict(old).allocation == Allocation()
    template = Bandit(3, allocation=a)
    packed = Bandit.unpack(b.pack(keep_pending=True), template, "s", b.pending)
    assert packed.pending == b.pending and packed.allocation == a
    for t in pending:
        packed.update(t, 1.0)
    assert packed.n_updates == 4


def test_setting_an_allocation_changes_no_learned_state():
    b = Bandit(4, seed=9)
    for _ in range(20):
        b.update(b.select(), float(b.n_rounds % 4))
    packed, q = b.pack(), b.policy()
    b.allocation = Allocation(min_share=0.2, holdout_arm=3, holdout_share=0.3, burn_in=100)
    assert b.pack() == packed and b.policy().tolist() == q.tolist()
    assert b.probabilities().tolist() != q.tolist()


# ------------------------------------------------------- Bandit and BatchBandit are one


def eligible_stream(seed: int, rounds: int, n: int, m: int) -> np.ndarray:
    """Random eligible masks (rounds, n, m): each arm eligible with 0.7, never none."""
    rng = np.random.default_rng(seed)
    mask = rng.random((rounds, n, m)) < 0.7
    none = ~mask.any(axis=2)
    mask[none, rng.integers(0, m, size=int(none.sum()))] = True
    return mask


def allocation_at(t: int) -> Allocation:
    """Live edits during a run: a floor, a holdout, the burn-in over, a forced spell."""
    if t < 3_000:
        return Allocation(min_share=0.05, holdout_arm=0, holdout_share=0.1, burn_in=500)
    if 5_000 <= t < 5_500:
        return Allocation(min_share=0.05, force_arm=0)
    return Allocation(min_share=0.02, holdout_arm=3, holdout_share=0.25)


@pytest.mark.parametrize("variant", ["paper", "bobw"])
@pytest.mark.parametrize("name", ["fixed", "contextual", "switching", "markov-sparse"])
def test_batch_and_separate_bandits_agree_bit_for_bit_with_allocation(name, variant):
    """10,000 rounds of the long-horizon stream (heavy tails, late, out-of-order, partial
    feedback) with random eligible sets and the allocation edited live: the same arm,
    prob, weight share and why at every round, and the same rows at the end."""
    competition = CLASSES[name]()
    s = stream(3 if name == "contextual" else 1)
    eligible = eligible_stream(7, ROUNDS, N_INSTANCES, N_ARMS)
    eligible[5_000:5_500, :, 0] = True  # the forced arm is eligible while forced
    batch = BatchBandit(N_INSTANCES, N_ARMS, competition, seed=0, variant=variant)
    singles = [Bandit(N_ARMS, competition, seed=0, variant=variant) for _ in range(N_INSTANCES)]
    issued = []
    idx = np.arange(N_INSTANCES)
    for t in range(ROUNDS):
        if t in (0, 3_000, 5_000, 5_500):
            batch.allocation = allocation_at(t)
            for b in singles:
                b.allocation = allocation_at(t)
        tickets = batch.select(
            contexts=None if s.contexts is None else s.contexts[t], u=s.u[t], eligible=eligible[t]
        )
        single = [
            b.select(context_of(s, t, i), u=float(s.u[t, i]), eligible=eligible[t, i])
            for i, b in enumerate(singles)
        ]
        got = list(
            zip(tickets.arms, tickets.probs, tickets.weight_shares, tickets.why, strict=True)
        )
        want = [(x.arm, x.prob, x.weight_share, WHYS.index(x.why)) for x in single]
        assert got == want, f"round {t + 1}: {got} != {want}"
        issued.append((tickets, single, s.losses[t, idx, tickets.arms]))
        apply_due(s, t, issued, batch, singles)
    for i, b in enumerate(singles):
        assert np.array_equal(batch.rows[i], b._row), f"instance {i}: rows differ"
        assert np.array_equal(
            batch.probabilities([i], None if s.contexts is None else [0], eligible[-1, i])[0],
            b.probabilities(None if s.contexts is None else 0, eligible[-1, i]),
        )


# ------------------------------------------------------------------------- invariance


def invariance_run(variant: str, transform, rounds: int = 10_000) -> tuple[list, list]:
    """One bandit with a floor, a holdout, a burn-in and random eligible sets on integer
    heavy-tailed losses, fed transform(loss) 0-4 rounds late: its arms and probs."""
    rng = np.random.default_rng(31)
    m = 5
    losses = np.round(rng.standard_t(1.5, size=(rounds, m)) * 1e3) + np.arange(m) * 300
    u = rng.random(rounds)
    eligible = eligible_stream(8, rounds, 1, m)[:, 0]
    delay = rng.integers(0, 5, size=rounds)
    b = Bandit(m, seed=0, instance_id="x", variant=variant)
    b.allocation = Allocation(min_share=0.03, holdout_arm=2, holdout_share=0.15, burn_in=300)
    arms, probs, due = [], [], {}
    for t in range(rounds):
        ticket = b.select(u=float(u[t]), eligible=eligible[t])
        arms.append(ticket.arm)
        probs.append(ticket.prob)
        due.setdefault(t + int(delay[t]), []).append(ticket)
        for late in due.pop(t, []):
            b.update(late, transform(float(losses[late.round - 1, late.arm])))
    return arms, probs


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_selections_do_not_change_under_affine_maps_of_the_losses(variant):
    """l -> a·l + b over 10,000 rounds: the same arms with the same probs bit for bit for
    maps exact in floating point (2^k scales, integer shifts of the integer losses with the
    running minimum); with the mean baseline, other maps too (the same arms)."""
    base = invariance_run(variant, float)
    exact = [lambda x: x * 2.0**-7, lambda x: x * 2.0**40]
    if VARIANTS[variant].baseline == "min":
        exact += [lambda x: x + 12345.0, lambda x: (x - 1e6) * 8.0]
    for f in exact:
        assert invariance_run(variant, f) == base
    if VARIANTS[variant].baseline == "mean":
        for f in (lambda x: 1000.0 * x + 1e6, lambda x: 0.37 * x - 5.0):
            arms, probs = invariance_run(variant, f)
            assert arms == base[0]
            np.testing.assert_allclose(probs, base[1], rtol=1e-6)


# --------------------------------------------------------------- the logs are unbiased


def test_the_holdout_share_and_the_logged_probs_agree_with_sampling_over_100000_requests():
    """With a floor, a holdout and random eligible sets: the share of why = holdout is s
    over the requests where the holdout arm is eligible (within 4 sigma), and for each arm
    k the mean of 1{a_t = k}/prob_t over the requests where k is eligible is 1 (within 4
    sigma of its terms): the logged prob is the probability the arm was served with."""
    rounds, m, s = 100_000, 4, 0.1
    rng = np.random.default_rng(2024)
    means = np.array([0.3, 0.5, 0.2, 0.6])
    eligible = eligible_stream(9, rounds, 1, m)[:, 0]
    b = Bandit(m, seed=1, allocation=Allocation(min_share=0.02, holdout_arm=0, holdout_share=s))
    arms, probs, holdout = np.empty(rounds, int), np.empty(rounds), np.empty(rounds, bool)
    for t in range(rounds):
        ticket = b.select(eligible=eligible[t])
        arms[t], probs[t], holdout[t] = ticket.arm, ticket.prob, ticket.why == "holdout"
        b.update(ticket, float(rng.random() < means[ticket.arm]))
    n_h = int(eligible[:, 0].sum())
    assert abs(holdout.sum() - s * n_h) <= 4 * math.sqrt(n_h * s * (1 - s))
    assert not holdout[~eligible[:, 0]].any()
    for k in range(m):
        terms = (arms[eligible[:, k]] == k) / probs[eligible[:, k]]
        assert not (arms[~eligible[:, k]] == k).any()
        sigma = terms.std(ddof=1) / math.sqrt(len(terms))
        assert abs(terms.mean() - 1) <= 4 * sigma, (k, terms.mean(), sigma)


@pytest.mark.parametrize("target", ["best eligible arm", "uniform over eligible"])
def test_snips_on_a_log_with_floors_holdout_and_eligibility_recovers_a_known_value(target):
    """Stationary Bernoulli arms with known means, 10 seeds of 10,000 rounds logged by a
    bandit with a floor, a holdout and random eligible sets: SNIPS of a fixed target policy
    (weights target(a_t)/prob_t) is within 4 of its standard errors of the target's true
    value on each seed, and the mean standardised error over seeds is within 4/sqrt(10)."""
    rounds, m = 10_000, 4
    means = np.array([0.35, 0.5, 0.2, 0.6])
    z = []
    for seed in range(10):
        rng = np.random.default_rng(100 + seed)
        eligible = eligible_stream(200 + seed, rounds, 1, m)[:, 0]
        b = Bandit(
            m,
            seed=seed,
            allocation=Allocation(min_share=0.03, holdout_arm=1, holdout_share=0.2, burn_in=200),
        )
        weights, losses, truth = np.empty(rounds), np.empty(rounds), np.empty(rounds)
        for t in range(rounds):
            e = eligible[t]
            if target == "best eligible arm":
                pi = np.zeros(m)
                pi[np.flatnonzero(e)[np.argmin(means[e])]] = 1.0
            else:
                pi = e / e.sum()
            ticket = b.select(eligible=e)
            loss = float(rng.random() < means[ticket.arm])
            weights[t], losses[t], truth[t] = pi[ticket.arm] / ticket.prob, loss, pi @ means
            b.update(ticket, loss)
        estimate = snips_estimate(weights, losses)
        value = truth.mean()
        z.append((estimate.value - value) / estimate.stderr)
        assert abs(z[-1]) <= 4, (seed, estimate, value)
    assert abs(np.mean(z)) <= 4 / math.sqrt(len(z)), z
