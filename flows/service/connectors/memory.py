"""In-memory sources and sinks (tests, the demo): lists in, lists out."""

from __future__ import annotations

import bytewax.operators as op
from bytewax.testing import TestingSink, TestingSource

from flows.service.dataflow import Message, Wiring


def memory_wiring(
    requests: list[Message],
    feedback: list[Message],
    selections: list,
    dead_letters: list,
    events: list[Message] | None = None,
) -> Wiring:
    """Read from lists of (bytes, Origin) (or one combined ``events`` list); append
    (key, JSON bytes) outputs to lists."""
    inputs = {"requests": requests, "feedback": feedback} if events is None else {"events": events}
    return Wiring(
        inputs={
            kind: (
                lambda flow, step, items=items: (op.input(step, flow, TestingSource(items)), None)
            )
            for kind, items in inputs.items()
        },
        selections=lambda step, up: op.output(step, up, TestingSink(selections)),
        dead_letters=lambda step, up: op.output(step, up, TestingSink(dead_letters)),
    )
