"""What a message's fields must be (``flows.service.wire.fields``, compiled): one body that the
parser and its compiled lane both call."""

import doctest
import math

import orjson
from hypothesis import given
from hypothesis import strategies as st

from flows.service.dataflow import route
from flows.service.instances.registry import Registry
from flows.service.wire import _parse, fields
from flows.service.wire.events import DeadLetter, Origin, parse_feedback

REGISTRY = Registry.from_toml('[experiments.e]\narms = ["a", "b"]')
JSON_VALUES = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=300)
)


@given(JSON_VALUES, JSON_VALUES, JSON_VALUES)
def test_the_parser_and_its_compiled_lane_accept_the_same_fields(request_id, loss, arm):
    """A feedback message is accepted by ``parse_feedback`` exactly when the compiled lane
    (or the parser it hands off to) accepts it, and both agree with the rules."""
    message = {"experiment": "e", "request_id": request_id, "loss": loss}
    if arm is not None:
        message["arm"] = arm
    try:
        raw = orjson.dumps(message)
    except orjson.JSONEncodeError:
        return
    batch = [(raw, Origin("t", 0, 0))]
    routed, dead = _parse.parse_and_route(parse_feedback, route, math.inf, REGISTRY, batch)
    parsed = parse_feedback(raw, Origin("t", 0, 0))
    accepted = not isinstance(parsed, DeadLetter)
    assert accepted == bool(routed) == (not dead)
    rules = (
        fields.identifier_ok(request_id)
        and fields.number_ok(loss)
        and fields.loss_ok(float(loss) if fields.number_ok(loss) else math.nan)
        and fields.arm_ok(arm)
    )
    assert accepted == rules


def test_the_modules_examples_hold():
    """pytest's --doctest-modules does not read compiled modules: run the examples here."""
    result = doctest.testmod(fields)
    assert result.attempted > 0 and result.failed == 0
