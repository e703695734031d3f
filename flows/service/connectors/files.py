"""JSON-lines files: a source (one message per line, its line number as the offset), a
sink (one output per line, each epoch's lines flushed and synced to disk before Bytewax
commits the epoch), the file wiring of the dataflow, and ``read_lines``, the one reader of
JSON-lines logs."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import bytewax.operators as op
from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition

from flows.service.connectors.epoch_sink import EpochAcknowledgedPartition, EpochAcknowledgedSink
from flows.service.dataflow import Inputs, Message, Outputs, Wiring
from flows.service.wire.events import Origin


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


class _LinesOut(EpochAcknowledgedPartition[tuple[str, bytes], int]):
    """One file's writes: buffered as they come, flushed and synced by the epoch's close.
    Its resume state is the file's length then: a resumed flow cuts off what the epochs
    Bytewax did not commit wrote (their outputs are written again)."""

    def __init__(self, path: Path, resume_state: int | None) -> None:
        super().__init__(batched=True)
        self._path = path
        self._file = path.open("ab")
        self._file.truncate(resume_state or 0)
        self._file.seek(resume_state or 0)

    def send(self, items: list[tuple[str, bytes]]) -> None:
        self._file.writelines(value + b"\n" for _, value in items)

    def acknowledge(self, sent: int) -> int:
        """Flush and fsync what the epoch wrote; RuntimeError naming the file and the
        lines not written if the system refuses."""
        if sent:
            try:
                self._file.flush()
                os.fsync(self._file.fileno())
            except OSError as exc:
                msg = f"{self._path}: {sent} lines of the epoch not written to disk: {exc}"
                raise RuntimeError(msg) from exc
        return self._file.tell()

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._file.close()


class JsonLinesSink(EpochAcknowledgedSink[int]):
    """Write batches of (key, JSON bytes) to a file, one value a line (the key is not
    written); each epoch's lines are on disk before Bytewax commits the epoch. One
    partition, the file: one worker writes it."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        super().__init__(str(self.path))

    def build_part(self, step_id: str, for_part: str, resume_state: int | None) -> _LinesOut:
        return _LinesOut(self.path, resume_state)


def file_wiring(
    requests: str | Path, feedback: str | Path, selections: str | Path, dead_letters: str | Path
) -> Wiring:
    """Read JSON-lines files; write one JSON object per line (the key is in the object)."""
    return Wiring(
        Inputs(
            {
                kind: (
                    lambda flow, step, path=path: (
                        op.input(step, flow, JsonLinesSource(path)),
                        None,
                    )
                )
                for kind, path in (("requests", requests), ("feedback", feedback))
            }
        ),
        Outputs(JsonLinesSink(selections).output, JsonLinesSink(dead_letters).output),
    )


def outputs_to(directory: str | Path) -> Outputs:
    """Selections and dead letters as JSON lines in ``directory`` (``selections.jsonl``,
    ``dead_letters.jsonl``), each epoch's lines on disk before it is committed: what
    ``tsi run --outputs files:DIR`` writes instead of the two Kafka topics.

    >>> import tempfile
    >>> outputs = outputs_to(Path(tempfile.mkdtemp()) / "out")
    >>> callable(outputs.selections) and callable(outputs.dead_letters)
    True
    """
    where = Path(directory)
    where.mkdir(parents=True, exist_ok=True)
    return Outputs(
        JsonLinesSink(where / "selections.jsonl").output,
        JsonLinesSink(where / "dead_letters.jsonl").output,
    )
