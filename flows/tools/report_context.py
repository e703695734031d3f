"""What a report needs beyond the served log, kept beside it so that a replay can write the
same report: the title and notes, the faults injected, and each request's true expected
loss per arm (synthetic traffic only).

``tsi demo`` writes ``report_context.json`` next to its ``events.jsonl``; ``tsi replay
--events`` of that file reads it (unless ``--seed`` changes the draws, when only the truth
and the faults still hold), so the replay of a demo gives the demo's report byte for byte.

>>> import tempfile
>>> from pathlib import Path
>>> context = ReportContext("t", ["a note"], Injected((Fault("broken", 2, ("bad_value",)),)))
>>> with tempfile.TemporaryDirectory() as d:
...     save_context(Path(d) / CONTEXT_FILE, context)
...     load_context(Path(d) / CONTEXT_FILE) == context
True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from flows.tools.report_data import Fault, Injected

CONTEXT_FILE = "report_context.json"


@dataclass(frozen=True)
class ReportContext:
    title: str
    notes: list[str]
    injected: Injected | None = None
    truth: dict[str, np.ndarray] | None = field(default=None, compare=False)


def save_context(path: Path, context: ReportContext) -> None:
    """Write ``context`` as JSON (numbers exactly: orjson writes the shortest repr)."""
    injected = context.injected
    data: dict[str, Any] = {
        "title": context.title,
        "notes": context.notes,
        "faults": None
        if injected is None
        else [[f.what, f.count, list(f.reasons)] for f in injected.faults],
        "feedback": None if injected is None else injected.feedback,
        "truth": None
        if context.truth is None
        else {rid: list(map(float, means)) for rid, means in context.truth.items()},
    }
    path.write_bytes(orjson.dumps(data))


def load_context(path: Path) -> ReportContext | None:
    """The context saved at ``path``; None if there is none or it cannot be read (a replay
    then writes its own report)."""
    try:
        data = orjson.loads(path.read_bytes())
        injected = None
        if data["faults"] is not None:
            faults = tuple(
                Fault(what, int(n), tuple(reasons)) for what, n, reasons in data["faults"]
            )
            feedback = {name: tuple(pair) for name, pair in data["feedback"].items()}
            injected = Injected(faults, feedback)
        truth = data["truth"]
        if truth is not None:
            truth = {rid: np.array(means, dtype=float) for rid, means in truth.items()}
        return ReportContext(str(data["title"]), [str(n) for n in data["notes"]], injected, truth)
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        return None
