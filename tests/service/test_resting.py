"""An instance saved as an entry and revived is the same instance, whatever it holds."""

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from flows.service.events import Origin, parse_feedback, parse_request
from flows.service.instance import Instance
from flows.service.registry import Registry
from flows.service.resting import Resting, entry_of, revive, state_of

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
