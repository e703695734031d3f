"""JSON-lines files: a source (one message per line, its line number as the offset), the
file wiring of the dataflow, and ``read_lines``, the one reader of JSON-lines logs."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import bytewax.operators as op
from bytewax.connectors.files import FileSink
from bytewax.dataflow import Stream
from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition

from flows.service.dataflow import Message, Wiring
from flows.service.events import Origin


def read_lines(path: Path, start: tuple[int, int] = (0, 0)) -> Iterator[tuple[Message, int]]:
    """The non-empty lines of a JSON-lines file, each as (raw bytes, its origin: the file and
    line number), with the byte offset after it; from ``start`` = (byte offset, line number).
    """
    offset, number = start
    with path.open("rb") as f:
        f.seek(offset)
        for line in f:
            offset += len(line)
            number += 1
            body = line.rstrip(b"\r\n")
            if body:
                yield (body, Origin(str(path), None, number)), offset


class _LinesPartition(StatefulSourcePartition[list[Message], tuple[int, int]]):
    def __init__(self, path: Path, batch_size: int, resume: tuple[int, int] | None) -> None:
        self._position = resume if resume is not None else (0, 0)
        self._lines = read_lines(path, self._position)
        self._batch_size = batch_size

    def next_batch(self) -> list[list[Message]]:
        batch: list[Message] = []
        for message, offset in itertools.islice(self._lines, self._batch_size):
            batch.append(message)
            self._position = (offset, message[1].offset)
        if not batch:
            raise StopIteration
        return [batch]

    def snapshot(self) -> tuple[int, int]:
        return self._position

    def close(self) -> None:
        self._lines.close()


class JsonLinesSource(FixedPartitionedSource[list[Message], tuple[int, int]]):
    """Read a JSONL file; every non-empty line is one raw message with its origin, in
    batches of up to ``batch_size`` (one item each)."""

    def __init__(self, path: str | Path, batch_size: int = 1000) -> None:
        self.path = Path(path)
        self.batch_size = batch_size

    def list_parts(self) -> list[str]:
        return [str(self.path)]

    def build_part(
        self, step_id: str, for_part: str, resume_state: tuple[int, int] | None
    ) -> _LinesPartition:
        return _LinesPartition(self.path, self.batch_size, resume_state)


def file_wiring(
    requests: str | Path, feedback: str | Path, selections: str | Path, dead_letters: str | Path
) -> Wiring:
    """Read JSON-lines files; write one JSON object per line (the key is in the object)."""

    def lines(step: str, up: Stream, path: str | Path) -> None:
        text = op.flat_map(
            f"{step}_text", up, lambda batch: [(k, v.decode("utf-8")) for k, v in batch]
        )
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
