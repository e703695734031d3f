"""Public API of Bandit: tickets, bad input (clear errors, no state change), snapshots."""

import gc
import json
import math
import pickle
import weakref

import numpy as np
import pytest

from tests.core.packed_layout import layout_of
from tsi_core import VARIANTS, Bandit, Contextual, Fixed, Markov, Switching, Ticket, TicketError


def state_of(b: Bandit) -> str:
    return json.dumps(b.to_dict(), sort_keys=True)


def played(competition=None, n_arms=4, rounds=30, seed=3) -> Bandit:
    b = Bandit(n_arms, competition, seed=seed)
    ctx = 1 if isinstance(competition, Contextual) else None
    for i in range(rounds):
        t = b.select(context=ctx)
        b.update(t, loss=float((t.arm * 7 + i) % 5))
    return b


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda b: b.update(b.select(), float("nan")), "nan"),
        (lambda b: b.update(b.select(), float("inf")), "inf"),
        (lambda b: b.update(b.select(), -math.inf), "-inf"),
        (lambda b: b.update(b.select(), "3.0"), "'3.0'"),
        (lambda b: b.update(b.select(), True), "True"),
        (lambda b: b.update(b.select(), None), "None"),
        (lambda b: b.select(u=1.0), "1.0"),
        (lambda b: b.select(u=-0.1), "-0.1"),
        (lambda b: b.select(u=float("nan")), "nan"),
        (lambda b: b.select(context=0), "context given (0)"),
        (lambda b: b.probabilities(context=2), "context given (2)"),
    ],
)
def test_bad_input_raises_naming_the_value_and_changes_nothing(call, message):
    b = played()
    before = state_of(b)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call(b)
    # a select inside the call may have issued a ticket before the bad update: drop it
    for ticket in b.pending:
        b.discard(ticket)
    after = b.to_dict()
    after["n_rounds"] = json.loads(before)["n_rounds"]
    after["rng"] = json.loads(before)["rng"]
    assert json.dumps(after, sort_keys=True) == before


def test_failed_update_leaves_ticket_pending_and_state_identical():
    b = played()
    t = b.select()
    before = state_of(b)
    with pytest.raises(ValueError, match="nan"):
        b.update(t, float("nan"))
    assert state_of(b) == before
    b.update(t, 1.0)  # the ticket is still good
    assert b.pending == ()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Bandit(0), "n_arms must be >= 1, got 0"),
        (lambda: Bandit(2.5), "n_arms must be an integer, got 2.5"),
        (lambda: Bandit(3, gamma=-1.0), "gamma must be in"),
        (lambda: Bandit(3, gamma=0.0), "gamma must be finite and > 0, got 0.0"),
        (lambda: Bandit(3, gamma=float("nan")), "gamma"),
        (lambda: Bandit(3, seed=-4), "seed must be >= 0, got -4"),
        (lambda: Bandit(3, competition="fixed"), "competition must be a competition class"),
        (lambda: Switching(rate=-0.1), "rate must be in .*-0.1"),
        (lambda: Switching(rate=1.5), "rate must be in .*1.5"),
        (lambda: Contextual(0), "n_contexts must be >= 1, got 0"),
        (lambda: Markov([[0.5, 0.4], [0.0, 1.0]], [0, 1]), "row 0 sums to 0.9"),
        (lambda: Markov([[0.5, 0.5, 0.0]], [0]), "square"),
        (lambda: Markov([[1.0, -0.5], [0.0, 1.0]], [0, 1]), "non-negative"),
        (lambda: Markov(np.eye(2), [0, -1]), "negative arm: -1"),
        (lambda: Markov(np.eye(2), [0, 1], initial=[0.5, 0.6]), "sum to 1"),
        (lambda: Bandit(2, Markov(np.eye(3), [0, 1, 2])), "names arm 2"),
    ],
)
def test_invalid_configuration_is_refused_with_the_bad_value(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_contextual_requires_a_context_in_range():
    b = Bandit(3, Contextual(2), seed=1)
    with pytest.raises(ValueError, match="context is required"):
        b.select()
    with pytest.raises(ValueError, match="context must be in \\[0, 1\\], got 2"):
        b.select(context=2)
    assert b.n_rounds == 0


def test_tickets_settle_once_in_any_order_and_only_on_their_instance():
    b = Bandit(3, seed=1)
    other = Bandit(3, seed=1)
    tickets = [b.select() for _ in range(5)]
    for t in reversed(tickets[1:]):  # delayed, out of order
        b.update(t, float(t.arm))
    before = state_of(b)
    with pytest.raises(TicketError, match="not pending"):
        b.update(tickets[2], 1.0)  # twice
    with pytest.raises(TicketError, match="given to instance"):
        other.update(tickets[0], 1.0)
    forged = Ticket(**{**tickets[0].to_dict(), "prob": 0.99})
    with pytest.raises(TicketError, match="altered"):
        b.update(forged, 1.0)
    with pytest.raises(TicketError, match="expected a Ticket"):
        b.update({"round": 1}, 1.0)
    assert state_of(b) == before
    b.discard(tickets[0])
    with pytest.raises(TicketError):
        b.update(tickets[0], 1.0)
    assert b.pending == () and b.n_updates == 4


def test_update_uses_the_ticket_values_not_the_current_policy():
    a, b = Bandit(3, seed=2, instance_id="i"), Bandit(3, seed=2, instance_id="i")
    late = a.select(u=0.9)
    assert b.select(u=0.9) == late
    for _ in range(20):  # a learns meanwhile, so its current q of that arm differs
        t = a.select()
        a.update(t, float(t.arm))
    assert a.probabilities()[late.arm] != late.prob
    a.update(late, 5.0)
    reference = Bandit(3, seed=2, instance_id="i")
    reference.select(u=0.9)
    reference.update(late, 5.0)
    assert a.psi == min(reference.psi, a.psi)


@pytest.mark.parametrize(
    "competition",
    [
        None,
        Switching(rate=0.01),
        Switching(),
        Contextual(3),
        Markov([[0.9, 0.1, 0], [0, 0.9, 0.1], [0.1, 0, 0.9]], [0, 1, 3], [0.2, 0.3, 0.5]),
    ],
)
def test_snapshot_round_trip_through_json_continues_identically(competition):
    b = played(competition)
    pending = b.select(context=1 if isinstance(competition, Contextual) else None)
    copy = Bandit.from_dict(json.loads(json.dumps(b.to_dict())))
    assert state_of(copy) == state_of(b)
    copy.update(pending, 2.0)
    b.update(pending, 2.0)
    ctx = 1 if isinstance(competition, Contextual) else None
    for _ in range(20):  # same seeded draws afterwards
        t1, t2 = b.select(context=ctx), copy.select(context=ctx)
        assert t1 == t2
        b.update(t1, float(t1.arm))
        copy.update(t2, float(t2.arm))
    assert np.array_equal(b.probabilities(ctx), copy.probabilities(ctx))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(format="other"), "not a tsi.bandit snapshot"),
        (lambda d: d.update(version=99), "unsupported snapshot version 99"),
        (lambda d: d.update(weights=[0.0]), "weights must be 4 numbers"),
        (lambda d: d.pop("vn"), "malformed"),
        (lambda d: d.update(vn=-1.0), "vn must be in"),
        (lambda d: d.update(competition={"kind": "nope"}), "unknown competition class"),
        (lambda d: d.update(psi=float("nan")), "loss must be a finite"),
    ],
)
def test_malformed_snapshot_is_refused(mutate, message):
    data = played().to_dict()
    mutate(data)
    with pytest.raises(ValueError, match=message):
        Bandit.from_dict(data)


def test_single_arm_always_selects_arm_zero():
    b = Bandit(1, seed=0)
    for loss in (5.0, -1e300, 1e300, 0.0):
        t = b.select()
        assert (t.arm, t.prob) == (0, 1.0)
        b.update(t, loss)
    assert b.probabilities().tolist() == [1.0]


def test_gamma_defaults_to_sqrt_of_class_complexity():
    assert Bandit(10, variant="paper").gamma == pytest.approx(math.sqrt(math.log(10)))
    assert Bandit(10, Contextual(4), variant="paper").gamma == pytest.approx(
        math.sqrt(4 * math.log(10))
    )
    robust = VARIANTS["robust"]
    assert Bandit(10, variant=robust).gamma == pytest.approx(
        robust.gamma_scale * math.sqrt(math.log(10))
    )
    assert Bandit(10, gamma=3.0).gamma == 3.0
    assert Bandit(4, Fixed()).competition.complexity(4) == pytest.approx(math.log(4))


def test_learns_the_best_arm_whatever_the_units():
    for scale, shift in [(1.0, 0.0), (1e-200, 1e-195), (1e200, -1e205), (1e300, -1e300)]:
        b = Bandit(4, seed=11)
        for _ in range(3000):
            t = b.select()
            b.update(t, shift + scale * (0.0 if t.arm == 2 else 1.0))
        assert int(np.argmax(b.probabilities())) == 2
        assert b.probabilities()[2] > 0.9


def test_pending_tickets_settle_in_any_order_through_one_and_many():
    b = Bandit(3, seed=1, instance_id="x")
    first = b.select()
    assert b.pending == (first,)
    second, third = b.select(), b.select()
    assert set(b.pending) == {first, second, third}
    b.update(second, 1.0)
    b.discard(first)
    assert b.pending == (third,)
    with pytest.raises(TicketError, match="round 1"):
        b.update(first, 1.0)
    b.update(third, 2.0)
    assert b.pending == () and b.n_updates == 2


def test_pending_tickets_are_matched_by_value_not_identity_and_altered_ones_refused():
    # the table of two or more pending tickets finds the handed-out object by identity
    # first; an equal copy (a pickled or restored ticket) still settles, an altered one not
    b = Bandit(3, seed=1, instance_id="x")
    tickets = [b.select() for _ in range(4)]
    copy = pickle.loads(pickle.dumps(tickets[2]))
    assert copy == tickets[2] and copy is not tickets[2]
    altered = tickets[1]._replace(prob=tickets[1].prob / 2)
    before = b.to_dict()
    with pytest.raises(TicketError, match="round 2 is not pending"):
        b.update(altered, 1.0)
    assert b.to_dict() == before
    b.update(copy, 1.0)
    b.update(tickets[0], 0.5)
    assert b.pending == (tickets[1], tickets[3])
    b.discard(tickets[3])
    assert b.pending == (tickets[1],) and type(b._pending) is type(tickets[1])
    with pytest.raises(TicketError, match=r"expected a Ticket, got \(0, 1\)"):
        b._hold((0, 1))
    assert b.pending == (tickets[1],)


@pytest.mark.parametrize("competition", [Fixed(), Switching(rate=0.01), Contextual(2)])
def test_pack_then_unpack_continues_exactly_like_the_original(competition):
    ctx = 1 if isinstance(competition, Contextual) else None
    original = Bandit(4, competition, instance_id="x")
    for i in range(25):
        t = original.select(context=ctx, u=(i * 0.61) % 1.0)
        original.update(t, float((t.arm * 7 + i) % 5))
    packed = original.pack()
    copy = Bandit.unpack(packed, Bandit(4, competition), original.instance_id)
    assert packed == layout_of(original)  # the documented layout, nothing more
    for i in range(20):
        u = (i * 0.137) % 1.0
        a, b = original.select(context=ctx, u=u), copy.select(context=ctx, u=u)
        assert a == b
        original.update(a, 3.0 * i % 7)
        copy.update(b, 3.0 * i % 7)
    assert original.to_dict() == copy.to_dict()


def test_pack_refuses_while_a_ticket_is_pending_or_a_generator_is_owned():
    b = Bandit(3, instance_id="x")
    t = b.select(u=0.2)
    assert b.pack() is None
    b.update(t, 1.0)
    assert b.pack() is not None
    b.select()  # draws from its own generator
    b.discard(b.pending[0])
    assert b.pack() is None


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda blob: blob[:-8], "end early"),
        (lambda blob: blob[:40], "bytes of a known layout"),
        (lambda blob: bytearray(blob), "bytes"),
        (lambda blob: blob[:8] + np.array([np.nan]).tobytes() + blob[16:], "vn=nan"),
        (lambda blob: blob[:-8] + np.array([np.nan]).tobytes(), "weights"),
    ],
)
def test_unpack_refuses_a_damaged_blob(mutate, message):
    b = Bandit(4, instance_id="x")
    for i in range(5):
        b.update(b.select(u=i / 5), float(i))
    with pytest.raises(ValueError, match=message):
        Bandit.unpack(mutate(b.pack()), Bandit(4), "x")


def _played_switching(rate=0.05):
    b = Bandit(4, Switching(rate=rate), instance_id="s")
    rng = np.random.default_rng(3)
    for _ in range(200):
        t = b.select(u=rng.random())
        b.update(t, float(t.arm) + rng.normal())
    return b


def test_a_version_1_switching_snapshot_with_log_weights_is_read_as_weights():
    b = _played_switching()
    old = b.to_dict()
    old["version"] = 1  # version 1 kept Switching's normalised log-weights
    old["weights"] = np.log(np.asarray(old["weights"])).tolist()
    again = Bandit.from_dict(old)
    np.testing.assert_allclose(again.probabilities(), b.probabilities(), rtol=1e-12)
    t1, t2 = b.select(u=0.3), again.select(u=0.3)
    assert t1.arm == t2.arm


@pytest.mark.parametrize(
    "weights", [[0.5, -0.1, 0.3, 0.3], [0.0, 0.0, 0.0, 0.0], [0.5, float("inf"), 0.1, 0.1]]
)
def test_impossible_switching_weights_are_refused_in_snapshots_and_packed_bytes(weights):
    b = _played_switching()
    data = b.to_dict()
    data["weights"] = weights
    with pytest.raises(ValueError, match="switching weights must be finite"):
        Bandit.from_dict(data)
    blob = bytearray(b.pack())
    blob[-32:] = np.asarray(weights, dtype="<f8").tobytes()
    with pytest.raises(ValueError, match="switching weights must be finite"):
        Bandit.unpack(bytes(blob), b, "s")


def test_a_table_of_pending_tickets_is_out_of_the_gc_unless_a_ticket_could_form_a_cycle():
    b = Bandit(3, seed=1, instance_id="x")
    tickets = [b.select() for _ in range(3)]
    assert type(b._pending) is dict and not gc.is_tracked(b._pending)

    class Named(str):  # an instance id that can refer back to its bandit: a cycle
        pass

    odd = Named("y")
    held = Bandit(3, seed=1, instance_id="y")
    odd.owner = held
    for round_ in (1, 2):
        held._hold(Ticket(odd, round_, 0, 0.5, 0.5))
    assert gc.is_tracked(held._pending)  # walked: the cycle is found and collected
    gone = weakref.ref(odd)
    del odd, held
    gc.collect()
    assert gone() is None
    b.update(tickets[1], 1.0)
    assert not gc.is_tracked(b._pending) and len(b.pending) == 2
