"""``tsi replay``: a logged stream through the same dataflow, deterministically.

Writes ``selections.jsonl`` and ``dead_letters.jsonl`` in the order of the lines that
caused them, ``pending_at_end.jsonl`` (what the end of the log closed: open tickets,
feedback still waiting for its request), and a report. The log is read as it goes; the
report keeps what it plots in memory (``--no-report`` for logs too big for that). A
replay in which every line became a dead letter exits with status 2 (after writing all
of it), saying how many of each reason and what the first one was.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import orjson
import typer

from flows.cli.base import app, fail, progress_bar
from flows.service.connectors.kafka import Topics
from flows.service.instances.registry import Registry, RegistryError
from flows.service.wire.events import Feedback

if TYPE_CHECKING:
    from flows.tools.replay import Replayed
    from flows.tools.replay_input import TopicLog


@app.command()
def replay(
    registry: Path = typer.Option(..., help="Experiments registry (TOML)."),
    events: Path | None = typer.Option(None, help="Combined log (field 'type'), in order."),
    requests: Path | None = typer.Option(None, help="Requests log (merged by 'ts')."),
    feedback: Path | None = typer.Option(None, help="Feedback log (merged by 'ts')."),
    topic: list[str] = typer.Option(
        [],
        help="Kafka topic to replay: the combined one, or repeated for the two input topics "
        "(merged by time), or the service's internal topic (its copies).",
    ),
    requests_topic: str = typer.Option(
        Topics.requests, envvar="TSI_TOPIC_REQUESTS", help="Which --topic holds requests."
    ),
    feedback_topic: str = typer.Option(
        Topics.feedback, envvar="TSI_TOPIC_FEEDBACK", help="Which --topic holds feedback."
    ),
    internal_topic: str = typer.Option(
        Topics.internal,
        envvar="TSI_TOPIC_INTERNAL",
        help="Which --topic is the service's internal topic (read as its copies).",
    ),
    brokers: str = typer.Option(
        "127.0.0.1:9092", envvar="KAFKA_BOOTSTRAP_SERVERS", help="Kafka brokers (with --topic)."
    ),
    from_offset: int | None = typer.Option(None, min=0, help="First offset (each partition)."),
    to_offset: int | None = typer.Option(None, min=0, help="Stop before this offset."),
    seed: int | None = typer.Option(None, min=0, help="Replace every experiment's seed."),
    out: Path = typer.Option(Path("tsi-replay"), help="Directory for outputs and the report."),
    report: bool = typer.Option(True, help="Write REPORT.md (holds the outputs in memory)."),
) -> None:
    """A logged stream through the same dataflow, deterministically, and a report.

    The same log and seed give the same selections, byte for byte, in the order of the
    log. Lines without 'ts' take the previous event's time; 'ts' outside 1970 to ~5100
    is a dead letter (ts_out_of_range). The service's two-topic setup replays as
    '--topic tsi.requests --topic tsi.feedback' or '--topic tsi.events.internal' (the
    order it served in); the topic names are tsi run's (TSI_TOPIC_*).
    """
    from flows.tools.replay_input import ReplayError, TopicLog

    sources = [events is not None, requests is not None or feedback is not None, bool(topic)]
    if sum(sources) != 1 or (sources[1] and (requests is None or feedback is None)):
        fail("replay", "give --events, or --requests with --feedback, or --topic")
    if requests is not None and feedback is not None and requests.resolve() == feedback.resolve():
        fail("replay", "--requests and --feedback must be two different files")
    try:
        topics = None
        if topic:
            names = (requests_topic, feedback_topic, internal_topic or None)
            topics = TopicLog(tuple(topic), *names)
        reg = Registry.load(registry)
        messages, kinds = _open_log(
            events, requests, feedback, topics, brokers, from_offset, to_offset
        )
        out.mkdir(parents=True, exist_ok=True)
    except (RegistryError, ReplayError) as exc:
        fail("replay", str(exc))
    except OSError as exc:
        fail("replay", f"cannot write to {out}: {exc.strerror}")
    _write_inputs(out, registry, events, requests, feedback, topic or None, brokers)
    kept = _Kept() if report else None
    result = _run(messages, kinds, reg, seed, out, kept)
    source = events or ", ".join(topic) or f"{requests} and {feedback}"
    summary = (
        f"{result.events:,} lines from {source}: {result.served:,} selections, "
        f"{result.applied_feedback:,} feedback applied, {sum(result.reasons.values()):,} dead "
        f"letters, {sum(result.at_end_reasons.values()):,} pending at the end"
    )
    if kept is not None:
        context = _context(events, seed)
        summary += f"; report: {_report(kept, out, summary, reg, context)}"
    typer.echo(summary)
    if result.events and not result.served and not result.applied_feedback:
        said = _all_dead(result, out)
        if topics is not None and topics.combined:
            said += (
                f" ({', '.join(topics.combined)} read as combined events: name the service's "
                "topics with --requests-topic, --feedback-topic, --internal-topic, as for tsi run)"
            )
        fail("replay", said)


def _all_dead(result: Replayed, out: Path) -> str:
    """What to say when every line became a dead letter: how many of each reason, and
    the first letter's reason and detail (from the files written in ``out``).

    >>> from collections import Counter
    >>> from flows.tools.replay import Replayed
    >>> _all_dead(Replayed(events=3, reasons=Counter(missing_field=3)), Path("/nowhere"))
    'every one of the 3 lines became a dead letter (3 missing_field); see /nowhere'
    """
    counts = result.reasons + result.at_end_reasons
    reasons = ", ".join(f"{n:,} {reason}" for reason, n in counts.most_common())
    said = f"every one of the {result.events:,} lines became a dead letter ({reasons})"
    for name in ("dead_letters.jsonl", "pending_at_end.jsonl"):
        try:
            with (out / name).open("rb") as file:
                first = orjson.loads(file.readline())
        except (OSError, orjson.JSONDecodeError):
            continue
        return f"{said}, the first {first['reason']}: {first['detail']}; see {out}"
    return f"{said}; see {out}"


def _write_inputs(out: Path, registry: Path, *sources: Any) -> None:
    """``inputs.json``: what was replayed (absolute paths), for ``tsi evaluate OUT``."""
    names = ("events", "requests", "feedback", "topics", "brokers")
    given = dict(zip(names, sources, strict=True))
    if given["topics"] is None:
        given["brokers"] = None
    manifest = {
        name: str(value.resolve()) if isinstance(value, Path) else value
        for name, value in {"registry": registry, **given}.items()
    }
    try:
        (out / "inputs.json").write_bytes(orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
    except OSError as exc:
        fail("replay", f"cannot write to {out}: {exc.strerror}")


def _run(
    messages: Iterator[Any],
    kinds: dict[str, str],
    registry: Registry,
    seed: int | None,
    out: Path,
    kept: _Kept | None,
) -> Replayed:
    """The replay, into the output files (and ``kept`` for the report); a one-line error
    if the log cannot be read or the outputs written."""
    from flows.tools.replay import Outputs
    from flows.tools.replay import replay as run_replay
    from flows.tools.replay_input import ReplayError

    names = ("selections.jsonl", "dead_letters.jsonl", "pending_at_end.jsonl")
    try:
        with contextlib.ExitStack() as files, progress_bar("replaying") as bar:
            task = bar.add_task("replaying", total=None)
            sel, dead, end = (files.enter_context((out / name).open("wb")) for name in names)
            outputs = Outputs(
                _writer(sel, None if kept is None else kept.selections),
                _writer(dead, None if kept is None else kept.dead_letters),
                _writer(end, None if kept is None else kept.dead_letters),
                None if kept is None else kept.event,
            )
            return run_replay(
                messages, registry, kinds, seed, lambda n: bar.advance(task, n), outputs
            )
    except ReplayError as exc:
        fail("replay", str(exc))
    except OSError as exc:
        fail("replay", f"cannot write to {out}: {exc.strerror}")


def _open_log(
    events: Path | None,
    requests: Path | None,
    feedback: Path | None,
    topics: TopicLog | None,
    brokers: str,
    from_offset: int | None,
    to_offset: int | None,
) -> tuple[Any, dict[str, str]]:
    """The messages to replay, read as they are needed, and the kind of each source file
    or topic (empty for one combined log). Files are checked first: a missing one is an
    error now."""
    from flows.tools.replay_input import ReplayError, merge_by_time, read_lines

    for path in (events, requests, feedback):
        if path is not None:
            try:
                path.open("rb").close()
            except OSError as exc:
                raise ReplayError(f"cannot read {path}: {exc.strerror}") from None
    if events is not None:
        return _started(read_lines(events)), {}
    if topics is not None:
        return _started(topics.read(brokers, from_offset, to_offset)), topics.kinds
    kinds = {str(requests): "request", str(feedback): "feedback"}
    return _started(merge_by_time(read_lines(requests), read_lines(feedback))), kinds


def _started(messages: Iterator[Any]) -> Iterator[Any]:
    """``messages`` with the first one read now: a source that cannot be read (a topic
    that does not exist) fails before any output is written."""
    first = next(messages, _NONE)

    def rest() -> Iterator[Any]:
        if first is not _NONE:
            yield first
            yield from messages

    return rest()


_NONE = object()


def _writer(file: IO[bytes], keep: list | None) -> Any:
    """Lines to ``file``, one a line; parsed into ``keep`` too (for the report)."""

    def write(lines: list[bytes]) -> None:
        file.write(b"".join(line + b"\n" for line in lines))
        if keep is not None:
            keep.extend(orjson.loads(line) for line in lines)

    return write


@dataclass
class _Kept:
    """What the report needs, from the events that reached their instance (their event
    time filled in), so nothing unreadable reaches it."""

    selections: list[dict[str, Any]] = field(default_factory=list)
    dead_letters: list[dict[str, Any]] = field(default_factory=list)
    feedback: list[dict[str, Any]] = field(default_factory=list)
    request_ts: dict[tuple[str, str | None, str], float] = field(default_factory=dict)
    contexts: dict[tuple[str, str | None, str], int] = field(default_factory=dict)

    def event(self, event: Any) -> None:
        if isinstance(event, Feedback):
            self.feedback.append(
                {
                    "experiment": event.experiment,
                    "unit": event.unit,
                    "request_id": event.request_id,
                    "loss": event.loss,
                    "ts": event.ts,
                }
            )
        else:
            key = (event.experiment, event.unit, event.request_id)
            self.request_ts.setdefault(key, event.ts)
            if event.context is not None:
                self.contexts.setdefault(key, event.context)


def _context(events: Path | None, seed: int | None) -> Any:
    """The report context ``tsi demo`` left beside the events replayed (see
    ``flows.tools.report_context``); its title and notes only when the draws are the
    demo's own (no ``--seed``)."""
    from flows.tools.report_context import CONTEXT_FILE, load_context

    context = None if events is None else load_context(events.parent / CONTEXT_FILE)
    if context is not None and seed is not None:
        context = dataclasses.replace(context, title="", notes=[])
    return context


def _report(kept: _Kept, out: Path, summary: str, registry: Registry, context: Any) -> Path:
    """REPORT.md; if the report cannot be drawn, a short one that says why (the replay's
    outputs are written whatever happens to the report). With a demo's ``context``, the
    demo's title, notes, truth and faults: the same report from the same outputs."""
    from flows.tools.report import ServedLog, write_report

    truth = None if context is None else context.truth
    stream = ServedLog(
        kept.selections, kept.feedback, kept.dead_letters, kept.request_ts, truth, kept.contexts
    )
    title = "tsi replay report"
    notes = [f"{summary}.", "What the end of the log closed is in `pending_at_end.jsonl`."]
    if context is not None and context.title:
        title, notes = context.title, context.notes
    injected = None if context is None else context.injected
    try:
        return write_report(stream, out, title, notes, registry=registry, injected=injected)
    except Exception as exc:  # a report's bug must not cost the replay
        problem = f"{type(exc).__name__}: {exc}"
        typer.echo(f"tsi replay: the full report failed ({problem}); wrote a short one", err=True)
        path = out / "REPORT.md"
        reasons: dict[str, int] = {}
        for letter in kept.dead_letters:
            reasons[letter["reason"]] = reasons.get(letter["reason"], 0) + 1
        rows = [f"| {reason} | {n:,} |" for reason, n in sorted(reasons.items())]
        lines = ["# tsi replay report", "", *notes, "", f"The full report failed: {problem}."]
        lines += ["", "| Dead letter reason | Count |", "|---|---:|", *rows]
        path.write_text("\n".join(lines) + "\n")
        return path
