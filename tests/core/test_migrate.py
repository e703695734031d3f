"""Bandit.migrate: arms appended, retired, reordered; class or parameters changed.

The exponential-weights learner (``robust``, ``paper``) keeps kept arms' state bit for bit;
the default ``bobw`` (the Tsallis learner for Fixed and Contextual) keeps p per context
(``tsi_core/migrate.py``): each test names the variant whose rules it checks."""

import json
import math
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tsi_core import (
    Bandit,
    Contextual,
    Fixed,
    Markov,
    Migration,
    Switching,
    Ticket,
    TicketError,
    migrate,
    remap_ticket,
)
from tsi_core.bandit import default_gamma


def sticky(k: int, stay: float = 0.9) -> np.ndarray:
    return np.full((k, k), (1 - stay) / (k - 1)) + np.eye(k) * (stay - (1 - stay) / (k - 1))


MARKOV = Markov(sticky(5), [0, 1, 2, 3, 3], [0.1, 0.2, 0.3, 0.15, 0.25])
MARKOV2 = Markov(sticky(6, 0.8), [3, 2, 1, 0, 0, 2])


def contexts_of(b: Bandit) -> list[int | None]:
    n = b.structure.n_contexts
    return [None] if n == 1 else list(range(n))


def played(
    competition=None, n_arms=4, rounds=200, seed=0, instance_id="i", variant="robust"
) -> Bandit:
    """A bandit that has learned something (no generator of its own: it can be packed)."""
    b = Bandit(n_arms, competition, instance_id=instance_id, variant=variant)
    rng = np.random.default_rng(seed)
    ctxs = contexts_of(b)
    for t in range(rounds):
        ctx = ctxs[t % len(ctxs)]
        ticket = b.select(context=ctx, u=rng.random())
        loss = ((ticket.arm + 1) * (1 + (ctx or 0))) % 5 + rng.random()
        b.update(ticket, loss)
    return b


def policy(b: Bandit, context: int | None = None) -> np.ndarray:
    """p = w / Σw, before the ε mixing."""
    return b.weight_shares(context)


def stats(b: Bandit) -> tuple:
    return (b.psi, b._vn, b._d_mant, b._d_exp, b.n_updates, b.n_rounds, b.D, b.V)


# ------------------------------------------------------------- same class, per-arm state
@pytest.mark.parametrize("variant", ["robust", "bobw"])
@pytest.mark.parametrize(
    "competition", [Fixed(), Contextual(3), Switching(rate=0.02), Switching(), MARKOV]
)
def test_identity_map_gives_the_same_bandit(competition, variant):
    b = played(competition, variant=variant)
    b.select(context=contexts_of(b)[-1], u=0.3)  # a pending ticket
    m = migrate(b, list(range(b.n_arms)))
    assert m.bandit.to_dict() == b.to_dict()
    assert m.tickets == {b.n_rounds: b.pending[0]}


@pytest.mark.parametrize("competition", [Fixed(), Contextual(3), Switching(rate=0.02)])
def test_kept_columns_bit_for_bit_retired_removed_new_gets_the_mean(competition):
    b = played(competition)
    before = json.dumps(b.to_dict())
    new = migrate(b, [3, None, 0, 2]).bandit  # arm 1 retired, one new arm
    assert json.dumps(b.to_dict()) == before  # the old bandit is unchanged
    assert stats(new) == stats(b)
    assert new.gamma == b.gamma and new.competition == b.competition
    for j, old in [(0, 3), (2, 0), (3, 2)]:
        assert np.array_equal(new._state[..., j], b._state[..., old])
    kept = b._state[..., [3, 0, 2]]
    if isinstance(competition, Switching):
        # the geometric mean weight; weights are not re-normalised (a common factor is free)
        assert math.log(new._state[1]) == pytest.approx(np.log(kept).mean(), rel=1e-12)
    else:  # the mean cumulative φ in each context
        np.testing.assert_allclose(new._state[:, 1], kept.mean(axis=1), rtol=1e-12)
    for ctx in contexts_of(b):
        old_p, new_p = policy(b, ctx), policy(new, ctx)
        np.testing.assert_allclose(
            new_p[[0, 2, 3]] / new_p[[0, 2, 3]].sum(), old_p[[3, 0, 2]] / old_p[[3, 0, 2]].sum()
        )


@pytest.mark.parametrize("competition", [Fixed(), Contextual(3), Switching(rate=0.02)])
def test_new_arm_share_sets_the_new_arms_p_in_every_context(competition):
    b = played(competition)
    new = migrate(b, [None, 2, 0, None, 1], new_arm_share=0.15).bandit
    for ctx in contexts_of(b):
        p, old_p = policy(new, ctx), policy(b, ctx)
        np.testing.assert_allclose(p[[0, 3]], [0.15, 0.15], rtol=1e-9)
        np.testing.assert_allclose(
            p[[1, 2, 4]], 0.7 * old_p[[2, 0, 1]] / old_p[:3].sum(), rtol=1e-9
        )
    for j, old in [(1, 2), (2, 0), (4, 1)]:
        assert np.array_equal(new._state[..., j], b._state[..., old])


@pytest.mark.parametrize("competition", [Fixed(), Switching(rate=0.01), Contextual(2)])
def test_a_new_arm_is_explored_and_learned_when_it_is_best(competition):
    b = played(competition, n_arms=3, rounds=300, seed=5)
    new = migrate(b, [0, 1, 2, None]).bandit
    rng = np.random.default_rng(6)
    ctxs = contexts_of(new)
    assert all(new.probabilities(ctx)[3] > 0 for ctx in ctxs)
    last = np.zeros(4)
    for t in range(400):
        ticket = new.select(context=ctxs[t % len(ctxs)], u=rng.random())
        new.update(ticket, [1.0, 1.5, 2.0, 0.0][ticket.arm] + 0.1 * rng.random())
        if t >= 300:
            last[ticket.arm] += 1
    assert last.argmax() == 3 and last[3] > 50


@pytest.mark.parametrize("competition", [Fixed(), Contextual(3), Switching(rate=0.02)])
@pytest.mark.parametrize("share", [None, 0.15])
def test_bobw_keeps_kept_arms_relative_p_and_gives_a_new_arm_its_p(competition, share):
    """The default's rule: the statistics (S, D, the mean, counters) as they were; per
    context the kept arms' relative p, a new arm the geometric mean p of the kept ones (or
    ``new_arm_share``)."""
    b = played(competition, variant="bobw")
    before = json.dumps(b.to_dict())
    arm_map = [3, None, 0, 2]
    new = migrate(b, arm_map, new_arm_share=share).bandit
    assert json.dumps(b.to_dict()) == before
    assert stats(new) == stats(b) and new.variant == b.variant and new.gamma == b.gamma
    want = expected_policy(b, arm_map, new.structure.n_contexts, share)
    got = np.array([policy(new, ctx) for ctx in contexts_of(new)])
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=0)


@pytest.mark.parametrize("competition", [Fixed(), Contextual(2)])
def test_a_new_arm_given_a_share_is_explored_by_bobw_but_not_always_learned(competition):
    """bobw has no forced exploration: a new arm enters at the p it is given (the geometric
    mean of the kept arms' p, tiny once play has settled, or ``new_arm_share``) and is
    played at that p. It is not always learned: while the mean baseline stays above the
    played arm's losses (here the old arms' history keeps it there) the played arm's
    estimate falls every round, a rarely played arm's is bounded below, and its p decays
    before enough plays (VARIANTS.md, "bobw", what is guaranteed)."""
    b = played(competition, n_arms=3, rounds=300, seed=5, variant="bobw")
    new = migrate(b, [0, 1, 2, None], new_arm_share=0.1).bandit
    ctxs = contexts_of(new)
    assert all(new.weight_shares(ctx)[3] == pytest.approx(0.1, abs=1e-9) for ctx in ctxs)
    rng = np.random.default_rng(6)
    plays = np.zeros(4)
    for t in range(400):
        ticket = new.select(context=ctxs[t % len(ctxs)], u=rng.random())
        new.update(ticket, [1.0, 1.5, 2.0, 0.0][ticket.arm] + 0.1 * rng.random())
        plays[ticket.arm] += 1
    assert plays[3] >= 1


@given(
    data=st.data(),
    competition=st.sampled_from([Fixed(), Contextual(2), Switching(rate=0.05), Switching()]),
    seed=st.integers(0, 2**32 - 1),
)
@settings(max_examples=int(os.environ.get("TSI_HYPOTHESIS_EXAMPLES", 40)), deadline=None)
def test_same_class_migrations_keep_kept_arms_relative_weights_exactly(data, competition, seed):
    n_old = data.draw(st.integers(1, 6), label="n_old")
    order = data.draw(st.permutations(range(n_old)), label="order")
    kept = order[: data.draw(st.integers(0, n_old), label="n_kept")]
    n_new = data.draw(st.integers(0 if kept else 1, 3), label="n_new")
    arm_map = data.draw(st.permutations([*kept, *[None] * n_new]), label="arm_map")
    share = data.draw(st.none() | st.floats(0.01, 0.9 / max(n_new, 1)), label="share")
    b = played(competition, n_arms=n_old, rounds=60, seed=seed)
    new = migrate(b, arm_map, new_arm_share=share if kept else None).bandit
    assert stats(new) == stats(b) and new.n_arms == len(arm_map)
    c = b.gamma / math.sqrt(b._vn + 1.0)
    old_log_w = b.structure.log_weights_one(b._state, c)
    new_log_w = new.structure.log_weights_one(new._state, c)
    pairs = [(j, old) for j, old in enumerate(arm_map) if old is not None]
    for j, old in pairs:
        assert np.array_equal(new._state[..., j], b._state[..., old])
        assert np.array_equal(new_log_w[:, j], old_log_w[:, old])  # same log-weight differences
    if not pairs:
        assert np.array_equal(new._state, new.structure.initial_state())
        return
    new_j, old_j = [j for j, _ in pairs], [old for _, old in pairs]
    fresh = [j for j, old in enumerate(arm_map) if old is None]
    for ctx in contexts_of(b):
        p, old_p = policy(new, ctx), policy(b, ctx)
        np.testing.assert_allclose(
            p[new_j] / p[new_j].sum(), old_p[old_j] / old_p[old_j].sum(), rtol=1e-12
        )
        if share is not None and fresh and b._d_mant:
            np.testing.assert_allclose(p[fresh], share, rtol=1e-9)


# ------------------------------------------------------------------ a change of class
CLASS_CHANGES = [
    (Fixed(), Switching(rate=0.02)),
    (Switching(rate=0.02), Fixed()),
    (Switching(), Contextual(3)),
    (Contextual(3), Contextual(5)),
    (Contextual(3), Contextual(2)),
    (Contextual(3), Fixed()),
    (Fixed(), MARKOV),
    (MARKOV, Fixed()),
    (MARKOV, Switching()),
    (MARKOV, MARKOV2),
    (Contextual(2), MARKOV),
]


def expected_policy(b: Bandit, arm_map, n_contexts: int, share=None) -> np.ndarray:
    """Old p per new context (by index if both contextual, else the mean over old contexts),
    then mapped: kept arms keep their relative p, a new arm gets the geometric mean (or s)."""
    old = np.array([policy(b, ctx) for ctx in contexts_of(b)])
    both = len(old) > 1 and n_contexts > 1
    rows = [old[r] if both and r < len(old) else old.mean(axis=0) for r in range(n_contexts)]
    out = []
    for row in rows:
        kept = np.array([row[o] for o in arm_map if o is not None])
        if share is None:
            fresh = math.exp(np.log(kept).mean())
            p = np.array([fresh if o is None else row[o] for o in arm_map])
            out.append(p / p.sum())
        else:
            n_new = arm_map.count(None)
            scale = (1 - n_new * share) / kept.sum()
            out.append(np.array([share if o is None else row[o] * scale for o in arm_map]))
    return np.array(out)


@pytest.mark.parametrize("variant", ["robust", "bobw"])
@pytest.mark.parametrize(("old", "new"), CLASS_CHANGES)
@pytest.mark.parametrize(
    ("arm_map", "share"), [([0, 1, 2, 3], None), ([3, None, 0, 1], None), ([3, None, 0, 1], 0.2)]
)
def test_a_change_of_class_keeps_p_in_every_context(old, new, arm_map, share, variant):
    b = played(old, variant=variant)
    before = json.dumps(b.to_dict())
    moved = migrate(b, arm_map, competition=new, new_arm_share=share).bandit
    assert json.dumps(b.to_dict()) == before
    cumulative = (Fixed, Contextual)  # bobw's Tsallis learner; Switching, Markov: robust's
    if variant == "bobw" and isinstance(old, cumulative) != isinstance(new, cumulative):
        # a change of learner: the baseline and the counters stay, V/D² (or S) restarts
        assert (moved.psi, moved.n_updates, moved.n_rounds) == (b.psi, b.n_updates, b.n_rounds)
    else:
        assert stats(moved) == stats(b)
    assert moved.competition is new
    assert moved.gamma == Bandit(4, new, variant=variant).gamma
    want = expected_policy(b, arm_map, moved.structure.n_contexts, share)
    got = np.array([policy(moved, ctx) for ctx in contexts_of(moved)])
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=0)


def test_markov_spreads_each_arms_p_over_its_classes_by_the_initial_prior():
    b = played(Fixed())
    state = migrate(b, [0, 1, 2, 3], competition=MARKOV).bandit._state
    p = policy(b)
    np.testing.assert_allclose(np.exp(state[3:]), p[3] * np.array([0.15, 0.25]) / 0.4, rtol=1e-9)
    np.testing.assert_allclose(np.exp(state[:3]), p[:3], rtol=1e-9)


def test_parameters_with_the_same_layout_keep_the_state_as_it_is():
    s = played(Switching(rate=0.02))
    faster = migrate(s, [0, 1, 2, 3], competition=Switching(rate=0.2)).bandit
    assert np.array_equal(faster._state, s._state)
    assert faster.gamma == default_gamma(Switching(rate=0.2), 4) * s.variant.gamma_scale != s.gamma
    f = played(Fixed())
    hotter = migrate(f, [0, 1, 2, 3], gamma=3 * f.gamma).bandit
    assert np.array_equal(hotter._state, f._state) and hotter.gamma == 3 * f.gamma
    assert not np.allclose(policy(hotter), policy(f))  # documented: Φ is kept, so p changes
    # γ stays the old one when only the arms change
    assert migrate(f, [0, 1, None]).bandit.gamma == f.gamma


def test_before_any_positive_loss_a_cumulative_state_stays_uniform():
    b = Bandit(3, Markov(sticky(3), [0, 1, 2], [0.7, 0.2, 0.1]), instance_id="i")
    assert not np.allclose(policy(b), 1 / 3)  # the prior is not uniform
    fixed = migrate(b, [0, 1, 2, None], competition=Fixed(), new_arm_share=0.5).bandit
    assert np.array_equal(fixed._state, np.zeros((1, 4)))
    switching = migrate(b, [0, 1, 2], competition=Switching()).bandit
    np.testing.assert_allclose(policy(switching), [0.7, 0.2, 0.1], rtol=1e-12)


def test_a_map_without_kept_arms_restarts_the_weights_but_keeps_the_statistics():
    b = played(Switching(rate=0.1))
    new = migrate(b, [None, None, None]).bandit
    assert stats(new) == stats(b)
    assert np.array_equal(new._state, Bandit(3, Switching(rate=0.1))._state)


# ------------------------------------------------------------------------- tickets
def test_pending_tickets_follow_their_arms_and_retired_ones_are_dropped():
    b = Bandit(3, instance_id="i")
    b.update(b.select(u=0.5), 1.0)
    tickets = {t.arm: t for t in (b.select(u=u) for u in (0.1, 0.5, 0.9))}
    assert sorted(tickets) == [0, 1, 2]
    m = migrate(b, [2, None, 0])
    assert isinstance(m, Migration) and m.new_index_of_old == {2: 0, 0: 2}
    assert m.tickets[tickets[1].round] is None
    assert m.tickets[tickets[0].round] == tickets[0]._replace(arm=2)
    assert m.tickets[tickets[2].round] == tickets[2]._replace(arm=0)
    assert sorted(m.bandit.pending) == sorted(t for t in m.tickets.values() if t is not None)
    assert len(b.pending) == 3  # the old bandit still holds all three
    with pytest.raises(TicketError, match="not pending"):
        m.bandit.update(tickets[1]._replace(arm=1), 2.0)
    m.bandit.update(m.tickets[tickets[0].round], 2.0)
    assert m.bandit.n_updates == b.n_updates + 1 and len(m.bandit.pending) == 1
    # settled tickets kept for retries are remapped the same way
    settled = Ticket("i", 1, arm=0, prob=0.5, weight_share=0.4)
    assert m.remap(settled) == settled._replace(arm=2)
    assert remap_ticket(settled, {0: 2}) == remap_ticket(settled, [2, None, 0])
    assert remap_ticket(settled._replace(arm=1), [2, None, 0]) is None
    with pytest.raises(TicketError, match="not a ticket of instance 'i'"):
        m.remap(settled._replace(instance="other"))
    with pytest.raises(ValueError, match="ticket arm 5 is outside a map of 3"):
        remap_ticket(settled._replace(arm=5), [2, None, 0])


def test_tickets_take_the_new_instance_and_a_context_the_new_class_has():
    b = played(Contextual(3))
    waiting = [b.select(context=ctx, u=0.5) for ctx in (0, 2)]
    fewer = migrate(b, [0, 1, 2, 3], competition=Contextual(2), instance_id="j")
    assert fewer.tickets[waiting[0].round] == waiting[0]._replace(instance="j")
    assert fewer.tickets[waiting[1].round] is None  # context 2 does not exist any more
    flat = migrate(b, [0, 1, 2, 3], competition=Fixed())
    moved = flat.tickets[waiting[1].round]
    assert moved == waiting[1]._replace(context=None)
    flat.bandit.update(moved, 1.0)
    assert flat.bandit.n_updates == b.n_updates + 1


# ---------------------------------------------------------------------- invariance
@pytest.mark.parametrize("variant", ["paper", "robust"])
@pytest.mark.parametrize(
    ("old", "new"),
    [
        (Fixed(), None),
        (Contextual(2), None),
        (Fixed(), Switching(0.01)),
        (Contextual(2), Contextual(3)),
    ],
)
def test_migration_keeps_translation_and_scale_invariance(old, new, variant):
    """Bits under 2^k·(l + shift) for the paper (minimum baseline), under 2^k·l for the
    mean baseline (a shift there agrees to rounding: the arms stay the same)."""
    rng = np.random.default_rng(11)
    table = rng.integers(-50, 50, size=(3000, 4)).astype(float)
    table[1000:, 1] -= 20  # after the migration arm 1 is the new arm, and the best
    draws, contexts = rng.random(3000), rng.integers(0, 6, 3000)

    def run(transform):
        b = Bandit(3, old, instance_id="x", variant=variant)
        arms = []
        for t in range(3000):
            if t == 1000:
                b = migrate(b, [2, None, 0, 1], competition=new).bandit
            n_ctx = b.structure.n_contexts
            ctx = int(contexts[t]) % n_ctx if n_ctx > 1 else None
            ticket = b.select(context=ctx, u=draws[t])
            arms.append(ticket.arm)
            b.update(ticket, transform(table[t, ticket.arm]))
        return arms, b

    arms, b = run(float)
    exact_shift = b.variant.baseline == "min"
    for k, shift in [(7, -300), (-20, 12345)]:
        moved = shift if exact_shift else 0
        other_arms, other = run(lambda x, k=k, moved=moved: float(np.ldexp(x + moved, k)))
        assert other_arms == arms
        assert np.array_equal(other._state, b._state)
        assert other._vn == b._vn and other._d_mant == b._d_mant and other._d_exp == b._d_exp + k
        if not exact_shift:
            assert run(lambda x, shift=shift: x + shift)[0] == arms
    assert arms[1000:].count(1) > 500  # and the new arm (index 1) was learned


# --------------------------------------------------------------------- packed form
@pytest.mark.parametrize(
    ("old", "new", "same_shape"),
    [(Fixed(), None, True), (Contextual(3), Contextual(2), False), (Fixed(), MARKOV2, False)],
)
def test_a_migrated_bandit_packs_and_unpacks_with_a_template_of_the_new_configuration(
    old, new, same_shape
):
    b = played(old)
    b.select(context=contexts_of(b)[0], u=0.7)
    moved = migrate(b, [3, None, 0, 1], competition=new).bandit
    blob = moved.pack(keep_pending=True)
    assert blob is not None
    template = Bandit(4, moved.competition, moved.gamma, variant=moved.variant)
    again = Bandit.unpack(blob, template, "i", moved.pending)
    assert again.to_dict() == moved.to_dict()
    if not same_shape:  # a template of the old configuration does not fit
        with pytest.raises(ValueError, match="bytes"):
            Bandit.unpack(blob, Bandit(4, old, b.gamma, variant=b.variant), "i", moved.pending)


# ------------------------------------------------------------------- bad arguments
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"arm_map": []}, "empty"),
        ({"arm_map": [0, 2, 0]}, "repeats old arm 0"),
        ({"arm_map": [0, 4]}, r"arm_map entry must be in \[0, 3\], got 4"),
        ({"arm_map": [-1]}, r"got -1"),
        ({"arm_map": [0, "1"]}, "must be an integer, got '1'"),
        ({"arm_map": [True]}, "got True"),
        ({"arm_map": "012"}, "sequence of old arm indices or None, got '012'"),
        ({"arm_map": {0: 1}}, "sequence"),
        ({"arm_map": 3}, "got 3"),
        ({"arm_map": [0, 1], "n_arms": 3}, "n_arms must equal len\\(arm_map\\) = 2, got 3"),
        ({"arm_map": [0, None], "new_arm_share": 0.0}, r"new_arm_share must be in \(0, 1\), got 0"),
        ({"arm_map": [0, None], "new_arm_share": 1}, r"got 1"),
        ({"arm_map": [0, None], "new_arm_share": 1.5}, "new_arm_share must be in .*1.5"),
        ({"arm_map": [0, None], "new_arm_share": math.nan}, "new_arm_share.*nan"),
        ({"arm_map": [0, None], "new_arm_share": "0.1"}, "got '0.1'"),
        ({"arm_map": [None, None], "new_arm_share": 0.5}, "needs at least one kept arm"),
        ({"arm_map": [0, None, None], "new_arm_share": 0.5}, "times 2 new arms"),
        ({"arm_map": [0, 1], "gamma": -1.0}, "gamma must be in .*-1.0"),
        ({"arm_map": [0, 1], "competition": "fixed"}, "competition must be a competition"),
        ({"arm_map": [0, 1], "competition": MARKOV}, "names arm 3, but the bandit has 2"),
        ({"arm_map": [0, 1], "instance_id": 5}, "instance_id must be a string, got 5"),
    ],
)
def test_invalid_arguments_raise_naming_the_value_and_change_nothing(kwargs, message):
    b = played(Fixed())
    b.select(u=0.2)
    before = json.dumps(b.to_dict())
    with pytest.raises(ValueError, match=message):
        migrate(b, **kwargs)
    assert json.dumps(b.to_dict()) == before
