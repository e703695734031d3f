"""Sources and sinks for the one dataflow: in memory (tests), JSON-lines files, Kafka."""

from __future__ import annotations

from pathlib import Path

import bytewax.operators as op
from bytewax.connectors.files import FileSink
from bytewax.dataflow import Stream
from bytewax.testing import TestingSink, TestingSource

from flows.dataflow import Message, Wiring
from flows.files import JsonLinesSource


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


def file_wiring(
    requests: str | Path, feedback: str | Path, selections: str | Path, dead_letters: str | Path
) -> Wiring:
    """Read JSON-lines files; write one JSON object per line (the key is in the object)."""

    def lines(step: str, up: Stream, path: str | Path) -> None:
        text = op.map(f"{step}_text", up, lambda kv: (kv[0], kv[1].decode("utf-8")))
        op.output(step, text, FileSink(Path(path)))

    return Wiring(
        inputs={
            kind: (
                lambda flow, step, path=path: (op.input(step, flow, JsonLinesSource(path)), None)
            )
            for kind, path in (("requests", requests), ("feedback", feedback))
        },
        selections=lambda step, up: lines(step, up, selections),
        dead_letters=lambda step, up: lines(step, up, dead_letters),
    )
