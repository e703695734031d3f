"""An instance saved as an entry and revived is the same instance, whatever it holds."""

import marshal

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from flows.service.instances.instance import Instance, Open
from flows.service.instances.registry import Registry
from flows.service.instances.resting import MAX_RESTING_ENTRIES, Resting, entry_of, revive, state_of
from flows.service.wire.events import Origin, parse_feedback, parse_request

REGISTRY = Registry.from_toml(
    '[experiments.e]\narms = ["a", "b", "c"]\nfeedback_ttl = 5\nretry_window = 8\n'
)
RENAMED = Registry.from_toml(
    '[experiments.e]\narms = ["c", "a", "d"]\nfeedback_ttl = 5\nretry_window = 8\n'
)
steps = st.lists(
    st.tuples(
        st.sampled_from(["request", "feedback", "expire", "rest"]),
        st.sampled_from(["r1", "r2", "r3"]),
        st.floats(-10, 10, allow_nan=False),
    ),
    max_size=25,
)


def lived(script) -> Instance:
    """An instance after ``script``: requests, feedback (early too), expiries, rests."""
    instance, now = Instance(REGISTRY["e"], "e"), 0.0
    for offset, (kind, rid, loss) in enumerate(script):
        now += 1.0
        origin = Origin("t", 0, offset, now)
        data = {"experiment": "e", "request_id": rid}
        if kind == "request":
            instance.on_request(parse_request(orjson.dumps(data), origin), now)
        elif kind == "feedback":
            data["loss"] = loss
            instance.on_feedback(parse_feedback(orjson.dumps(data), origin), now)
        elif kind == "expire":
            instance.expire(now + 4.0)
        else:
            instance.rest()
    return instance


@settings(max_examples=200, deadline=None)
@given(steps)
def test_an_entry_revives_the_instance_it_saved(script):
    instance = lived(script)
    state = instance.to_dict()
    entry = entry_of(instance)
    assert entry.kind in {"packed", "packed+", "state"}
    if instance.early:
        assert entry.kind == "state"  # waiting feedback is kept whole
    assert revive(entry, REGISTRY["e"]).to_dict() == state
    assert state_of(entry) == state  # what tsi inspect reads


@settings(max_examples=100, deadline=None)
@given(steps)
def test_an_entry_follows_a_changed_definition_as_the_full_state_does(script):
    instance = lived(script)
    entry = entry_of(instance)
    expected = Instance.from_dict(RENAMED["e"], instance.to_dict()).to_dict()
    assert revive(entry, RENAMED["e"]).to_dict() == expected


def test_tickets_and_answers_are_saved_compact():
    instance = lived([("request", "r1", 0.0), ("feedback", "r1", 2.0), ("request", "r2", 0.0)])
    entry = entry_of(instance)
    assert entry.kind == "packed+" and len(entry.data[-1]) == 2
    assert len(orjson.dumps(entry.data[-1])) < 200  # two plain tuples, no bandit dict


def test_a_shard_holds_instances_of_hundreds_of_definitions_apart():
    """A resting record names its definition by a varint index: past the first 128 (two
    bytes) each instance still comes back under its own arms, whole."""
    toml = "".join(f'[experiments.e{i}]\narms = ["a{i}", "b", "c{i % 7}"]\n' for i in range(300))
    registry, resting, states = Registry.from_toml(toml), Resting(), {}
    for i in range(300):
        instance = Instance(registry[f"e{i}"], f"e{i}:u")
        request = orjson.dumps({"experiment": f"e{i}", "request_id": "r"})
        instance.on_request(parse_request(request, Origin("t", 0, i, 1.0)), 1.0)
        instance.expire(1e9)
        instance.rest()
        states[instance.key] = instance.to_dict()
        entry_of(instance)  # packs it, as a shard does before putting it to rest
        assert resting.put_instance(instance)
    for i in reversed(range(300)):
        entry = resting.pop(f"e{i}:u")
        assert entry.data[0] == registry[f"e{i}"].packing[0]
        assert revive(entry, registry[f"e{i}"]).to_dict() == states[f"e{i}:u"]
    assert len(resting) == 0


@settings(max_examples=200, deadline=None)
@given(steps, st.floats(0, 60, allow_nan=False))
def test_an_instance_of_kept_answers_rests_whole_and_drops_them_as_if_built(script, later):
    """An instance holding answers kept for retries and nothing else (no open ticket, no
    waiting feedback) rests however many it holds, and comes back the same. When its
    earliest answer comes due, the record drops what is due without building it: the
    state is what building it, expiring them and putting it to rest again leaves."""
    instance = lived(script)
    entries = instance.entries().values()
    answers_only = bool(entries) and all(
        type(e).__name__ in {"Settled", "Expired"} for e in entries
    )
    state = instance.to_dict()
    entry_of(instance)  # packs it, as a shard does before putting it to rest
    resting = Resting()
    rested = resting.put_instance(instance)
    if answers_only:
        assert rested
    if not rested:
        return
    now = len(script) + later
    entry = resting.pop("e")
    assert revive(entry, REGISTRY["e"]).to_dict() == state
    dropped = resting.drop_answer(entry, now, REGISTRY["e"].packing)
    built = revive(entry, REGISTRY["e"])
    expired = built.expire(now)
    built.rest()
    if not answers_only:  # an open ticket: built to expire, never dropped in its record
        assert dropped is None
        return
    assert expired == []  # kept answers expire without a word
    if dropped is None:  # nothing due
        assert built.to_dict() == state
        return
    assert state_of(dropped) == built.to_dict()
    assert resting.take(dropped)
    left = [e.deadline for e in built.entries().values()]
    assert [key for _, key in resting.due(min(left, default=now))] == (["e"] if left else [])
    assert state_of(resting.pop("e")) == state_of(dropped)


def test_kept_answers_rest_in_a_few_dozen_bytes_each():
    script = [(kind, f"r{i}", 1.0) for i in range(20) for kind in ("request", "feedback")]
    instance = lived(script)
    assert len(instance.settled) == 20
    entry_of(instance)
    resting = Resting()
    assert resting.put_instance(instance)
    [record] = resting.entries()
    assert record.kind == "packed+" and len(marshal.dumps(record.data[3])) < 20 * 80


answer_steps = st.lists(
    st.tuples(
        st.sampled_from(["request", "feedback", "expire", "rest", "read"]),
        st.sampled_from(["r1", "r2", "r3", "r4", "n1", "n2"]),
        st.floats(0, 12, allow_nan=False),
    ),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 4), answer_steps)
def test_answers_held_as_tuples_behave_as_the_built_entries(n_answers, script):
    """A user who comes back is revived with its kept answers as the tuples they rested
    as (its book of kept answers). Retries, duplicate and late feedback, expiry, resting again
    and every read give what the instance with those answers built as entries gives."""
    rids = [f"r{i}" for i in range(1, n_answers + 1)]
    kept_by = lived([(kind, rid, 1.0) for rid in rids for kind in ("request", "feedback")])
    kept_by.rest()
    entry = entry_of(kept_by)
    assert entry.kind == "packed+" and len(entry.data[3]) == n_answers
    lazy, built = revive(entry, REGISTRY["e"]), revive(entry, REGISTRY["e"])
    assert lazy.holding()["book"] == n_answers and not lazy.entries(Open)  # nothing built yet
    built.build_kept()
    assert built.holding()["book"] == 0 and len(built.settled) == n_answers
    now = float(len(rids) * 2)
    for offset, (kind, rid, dt) in enumerate(script):
        now += dt
        origin = Origin("t", 1, offset, now)
        data = {"experiment": "e", "request_id": rid}
        outs = []
        for instance in (lazy, built):
            if kind == "request":
                outs.append(instance.on_request(parse_request(orjson.dumps(data), origin), now))
            elif kind == "feedback":
                data["loss"] = 2.0
                event = parse_feedback(orjson.dumps(data), origin)
                outs.append(instance.on_feedback(event, now))
            elif kind == "expire":
                outs.append(instance.expire(now))
            elif kind == "rest":
                instance.rest()
                outs.append(instance.compact_entries() is None)
        assert outs[: len(outs) // 2] == outs[len(outs) // 2 :]
        # a wake-up never comes after the earliest deadline (a heap may hold stale ones,
        # which only wake it early)
        earliest = min((e.deadline for e in built.entries().values()), default=None)
        for instance in (lazy, built):
            due = instance.next_deadline()
            assert (due is None) == (earliest is None) and (due is None or due <= earliest)
        if kind == "read":
            assert lazy.to_dict() == built.to_dict()
    assert lazy.to_dict() == built.to_dict()


def test_a_busy_instance_with_many_kept_answers_stays_live():
    """Resting, every request would scan its kept answers and every rest write them all:
    past ``MAX_RESTING_ENTRIES`` an instance stays live, and a record of more (a shared
    instance in a log) is built whole."""
    many = MAX_RESTING_ENTRIES + 1
    for n, rests in ((MAX_RESTING_ENTRIES, True), (many, False)):
        script = [(kind, f"r{i}", 1.0) for i in range(n) for kind in ("request", "feedback")]
        instance = lived(script)
        entry = entry_of(instance)
        assert Resting().put_instance(instance) is rests
        assert Resting().take(entry) is rests
        revived = revive(entry, REGISTRY["e"])
        assert (revived.holding()["book"] > 0) is rests and len(revived.settled) == n
