"""The Tsallis learner's mean per context: each context of a ``Contextual`` bobw bandit
takes its gaps from its own mean loss m_c (with the count k of its losses) shrunk towards
the mean ψ of every loss, (k·m_c + P·ψ)/(k + P). Data written before (packed bytes,
snapshots before version 4, migrations from a learner without them) start each context's
mean at its next loss."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core.bobw_reference import BobwReference
from tests.core.packed_layout import columns_of, compact_of
from tsi_core import Bandit, Contextual, migrate
from tsi_core.variant import TSALLIS_SCALE


def played(n_contexts: int, levels: list[float], rounds: int, seed: int = 0) -> Bandit:
    """A bobw bandit fed losses around each context's level (t-distributed noise)."""
    rng = np.random.default_rng(seed)
    b = Bandit(4, Contextual(n_contexts), variant="bobw", instance_id="u")
    for _ in range(rounds):
        ctx = int(rng.integers(n_contexts))
        t = b.select(context=ctx, u=float(rng.random()))
        b.update(t, levels[ctx] + float(rng.standard_t(3.0)) + 0.5 * t.arm)
    return b


def means(b: Bandit) -> list[float]:
    return b._context_means[: b.structure.n_contexts].tolist()


def counts(b: Bandit) -> list[float]:
    return b._context_means[b.structure.n_contexts :].tolist()


@settings(max_examples=30, deadline=None)
@given(
    n_contexts=st.integers(2, 5),
    plays=st.lists(st.tuples(st.integers(0, 4), st.floats(-1e6, 1e6)), max_size=60),
)
def test_each_context_counts_its_losses_and_its_means_are_the_references(n_contexts, plays):
    b = Bandit(3, Contextual(n_contexts), seed=1, variant="bobw")
    ref = BobwReference(3, n_contexts, TSALLIS_SCALE)
    for ctx, loss in plays:
        ctx %= n_contexts
        t = b.select(context=ctx)
        b.update(t, loss)
        ref.update(ctx, t.arm, t.prob, loss)
    assert counts(b) == [float(k) for k in ref.counts]
    assert sum(counts(b)) == b.n_updates
    scale = 1e-9 * max(1.0, b.D)
    np.testing.assert_allclose(means(b), ref.means, rtol=1e-9, atol=scale)
    assert b.psi == pytest.approx(ref.mean, rel=1e-9, abs=scale)  # every loss's, bounded too


def test_contexts_far_apart_each_have_their_own_level():
    b = played(3, [0.0, 1000.0, -50.0], 3000)
    m = means(b)
    assert abs(m[0]) < 5 and abs(m[1] - 1000.0) < 5 and abs(m[2] + 50.0) < 5
    assert 250 < b.psi < 400  # the mean of every loss, about (0 + 1000 - 50)/3
    assert Bandit(4, variant="bobw")._context_means.size == 0  # one context: ψ is the mean
    assert Bandit(4, Contextual(3), variant="robust")._context_means.size == 0


def test_bytes_and_snapshots_from_before_serve_the_same_q_and_restart_each_mean():
    b = played(3, [0.0, 10.0, 20.0], 400)
    blob = b.pack()
    for again in (
        Bandit.unpack(
            columns_of(b._row)[: -8 * (6 + 9)], Bandit(4, Contextual(3), variant="bobw"), "u"
        ),
        Bandit.from_dict({**b.to_dict(), "version": 3}),
    ):
        assert means(again) == [b.psi] * 3 and counts(again) == [0.0] * 3
        for ctx in range(3):
            assert again.probabilities(ctx).tolist() == b.probabilities(ctx).tolist()
        t = again.select(context=1)
        again.update(t, 12.5)
        assert means(again)[1] == 12.5 and counts(again) == [0.0, 1.0, 0.0]
    assert Bandit.unpack(blob, Bandit(4, Contextual(3), variant="bobw"), "u").to_dict() == (
        b.to_dict()
    )


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("context_means", [1.0, float("nan"), 2.0], "context means must be finite, got nan"),
        ("context_means", [1.0, float("inf"), 2.0], "got inf"),
        ("context_counts", [1.0, -1.0, 2.0], "whole numbers >= 0"),
        ("context_counts", [1.0, 0.5, 2.0], "whole numbers >= 0"),
        ("context_counts", [1e9, 0.0, 0.0], "summing to at most n_updates = 400"),
    ],
)
def test_a_bad_mean_or_count_is_refused_in_snapshots_and_in_bytes(field, value, message):
    b = played(3, [0.0, 10.0, 20.0], 400)
    snap = b.to_dict()
    with pytest.raises(ValueError, match=message):
        Bandit.from_dict({**snap, field: value})
    row = np.array(b._row)
    at = 6 + b._table.kernel.n_state + (3 if field == "context_means" else 6)  # after the clocks
    row[at : at + 3] = value
    for blob in (columns_of(row), compact_of(row, 4)):
        with pytest.raises(ValueError, match=message):
            Bandit.unpack(blob, Bandit(4, Contextual(3), variant="bobw"), "u")
    assert b.to_dict() == snap  # the source is untouched


def test_migration_carries_means_by_context_and_starts_the_others_from_psi():
    b = played(3, [0.0, 10.0, 20.0], 400)
    wider = migrate(b, [0, 1, 2, 3], competition=Contextual(4)).bandit
    assert means(wider)[:3] == means(b) and counts(wider)[:3] == counts(b)
    assert means(wider)[3] == b.psi and counts(wider)[3] == 0.0
    assert means(migrate(b, [0, 1, 2, 3]).bandit) == means(b)
    robust = played(3, [0.0, 10.0, 20.0], 50)
    robust = migrate(robust, [0, 1, 2, 3], variant="robust").bandit
    fresh = migrate(robust, [0, 1, 2, 3], variant="bobw").bandit
    assert means(fresh) == [robust.psi] * 3 and counts(fresh) == [0.0] * 3


def test_a_new_contexts_first_loss_is_learned_from_the_mean_of_all():
    """A context with no losses yet takes its gaps from ψ (weight P against none of its
    own): its first loss already teaches, where a mean of its own would have none."""
    b = played(3, [0.0, 0.0, 0.0], 200)
    fresh = Bandit(4, Contextual(4), variant="bobw")
    fresh._row[:] = np.concatenate([b._row[:6], b._state.ravel(), np.zeros(4), b._clocks,
                                    [0.0], means(b), [b.psi], counts(b), [0.0],
                                    b._row[-9:]])  # fmt: skip
    before = fresh.weight_shares(3).tolist()
    assert before == [0.25] * 4
    t = fresh.select(context=3, u=0.5)
    fresh.update(t, b.psi - 5.0 * b.D)  # well below every loss so far
    assert fresh.weight_shares(3)[t.arm] > 0.25
    assert means(fresh)[3] == b.psi - 5.0 * b.D and counts(fresh)[3] == 1.0
