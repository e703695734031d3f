"""In-memory sources and sinks (tests, the demo): lists in, lists out."""

from __future__ import annotations

import bytewax.operators as op
from bytewax.dataflow import Dataflow, Stream
from bytewax.inputs import Source
from bytewax.outputs import Sink
from bytewax.testing import TestingSink, TestingSource

from flows.service.dataflow import Inputs, Message, Outputs, Wiring


def memory_wiring(
    requests: list[Message],
    feedback: list[Message],
    selections: list,
    dead_letters: list,
    events: list[Message] | None = None,
) -> Wiring:
    """Read from lists of (bytes, Origin) (or one combined ``events`` list), each message a
    batch of its own (the two inputs interleave as their items would); append (key, JSON
    bytes) outputs to lists."""
    inputs = {"requests": requests, "feedback": feedback} if events is None else {"events": events}
    return Wiring(
        Inputs(
            {
                kind: (
                    lambda flow, step, items=items: (
                        one_per_batch(flow, step, TestingSource(items)),
                        None,
                    )
                )
                for kind, items in inputs.items()
            }
        ),
        Outputs(
            selections=lambda step, up: unbatched(step, up, TestingSink(selections)),
            dead_letters=lambda step, up: unbatched(step, up, TestingSink(dead_letters)),
        ),
    )


def one_per_batch(flow: Dataflow, step: str, source: Source) -> Stream[list]:
    """A source of single items as the dataflow's input: each item a batch of its own."""
    return op.map(f"{step}_batches", op.input(step, flow, source), lambda item: [item])


def unbatched(step: str, up: Stream[list], sink: Sink) -> None:
    """The dataflow's batches of outputs, written item by item to ``sink``."""
    op.output(step, op.flat_map(f"{step}_items", up, lambda batch: batch), sink)
