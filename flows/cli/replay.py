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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import orjson
import typer

from flows.cli.base import app, fail, progress_bar
from flows.cli.options import with_options
from flows.service.instances.registry import Registry, RegistryError
from flows.service.runtime.settings import (
    CLIENT_OPTIONS,
    GROUP_OPTION,
    TOPIC_OPTIONS,
    ConfigError,
    consumer_from_env,
    topics_from_env,
)
from flows.service.wire.events import Feedback
from flows.tools.context_label import context_label

if TYPE_CHECKING:
    from flows.tools.replay import Replayed
    from flows.tools.replay_input import TopicLog

#: The service's settings a replay from Kafka reads, declared once with ``tsi run``'s: the
#: brokers, the client settings, and which topic is which in the service's setup (the
#: internal topic's default is named from the group id).
REPLAY_OPTIONS = (
    *CLIENT_OPTIONS,
    GROUP_OPTION,
    *(TOPIC_OPTIONS[k] for k in ("requests", "feedback", "internal")),
)


@app.command()
@with_options(*REPLAY_OPTIONS)
def replay(
    env: Mapping[str, str],
    registry: Path = typer.Option(..., help="Experiments registry (TOML)."),
    events: Path | None = typer.Option(None, help="Combined log (field 'type'), in order."),
    requests: Path | None = typer.Option(None, help="Requests log (merged by 'ts')."),
    feedback: Path | None = typer.Option(None, help="Feedback log (merged by 'ts')."),
    topic: list[str] = typer.Option(
        [],
        help="Kafka topic to replay: the combined one, or repeated for the two input topics "
        "(merged by time), or the service's internal topic (its copies); read from --brokers "
        "with --kafka-config, each named by tsi run's --requests-topic, --feedback-topic and "
        "--internal-topic.",
    ),
    from_offset: int | None = typer.Option(None, min=0, help="First offset (each partition)."),
    to_offset: int | None = typer.Option(None, min=0, help="Stop before this offset."),
    seed: int | None = typer.Option(None, min=0, help="Replace every experiment's seed."),
    out: Path = typer.Option(Path("tsi-replay"), help="Directory for outputs and the report."),
    report: bool = typer.Option(True, help="Write REPORT.md (holds the outputs in memory)."),
) -> None:
    """A logged stream through the same dataflow, deterministically, and a report.

    The same log and seed give the same selections, byte for byte, in the order of the
    log. A message read from Kafka is handled at its Kafka timestamp, as the service
    handled it; a file's line at its 'ts', or without one the previous event's time; 'ts'
    outside 1970 to ~5100 is a dead letter (ts_out_of_range). The service's two-topic
    setup replays as '--topic tsi.requests --topic tsi.feedback' or '--topic
    tsi.events.internal' (the order it served in); the topic names are tsi run's
    (TSI_TOPIC_*).
    """
    _check_sources(events, requests, feedback, topic)
    kafka = _topic_source(topic, env, from_offset, to_offset) if topic else None
    reg, messages, kinds = _open(registry, events, requests, feedback, kafka, out)
    _write_inputs(out, registry, events, requests, feedback, kafka)
    kept = _Kept() if report else None
    result = _run(messages, kinds, reg, seed, out, kept)
    summary = _summary(result, events or ", ".join(topic) or f"{requests} and {feedback}")
    if kept is not None:
        summary += f"; report: {_report(kept, out, summary, reg, _context(events, seed))}"
    typer.echo(summary)
    if result.events and not result.served and not result.applied_feedback:
        fail("replay", _all_dead(result, out) + _read_as_combined(kafka))


@dataclass(frozen=True)
class _TopicSource:
    """The topics ``--topic`` names, read from ``brokers`` with the consumer's client
    settings, from offset ``start`` to ``end``."""

    log: TopicLog
    brokers: str
    consumer: dict[str, Any]
    start: int | None
    end: int | None

    def read(self) -> Iterator[Any]:
        return self.log.read(self.brokers, self.start, self.end, self.consumer)


def _check_sources(
    events: Path | None, requests: Path | None, feedback: Path | None, topic: list[str]
) -> None:
    """One source: ``--events``, ``--requests`` with ``--feedback`` (two files), or
    ``--topic``; else a one-line error."""
    sources = [events is not None, requests is not None or feedback is not None, bool(topic)]
    if sum(sources) != 1 or (sources[1] and (requests is None or feedback is None)):
        fail("replay", "give --events, or --requests with --feedback, or --topic")
    if requests is not None and feedback is not None and requests.resolve() == feedback.resolve():
        fail("replay", "--requests and --feedback must be two different files")


def _topic_source(
    topic: list[str], env: Mapping[str, str], start: int | None, end: int | None
) -> _TopicSource:
    """The topics to replay, each read as what it is in the service's setup that ``env``
    describes (``REPLAY_OPTIONS``); a one-line error for a bad setting or combination."""
    from flows.tools.replay_input import ReplayError, TopicLog

    try:
        named = topics_from_env(env)
        log = TopicLog(tuple(topic), named.requests, named.feedback, named.internal)
        brokers, consumer = consumer_from_env(env)
    except (ConfigError, ReplayError) as exc:
        fail("replay", str(exc))
    return _TopicSource(log, brokers, consumer, start, end)


def _open(
    registry: Path,
    events: Path | None,
    requests: Path | None,
    feedback: Path | None,
    kafka: _TopicSource | None,
    out: Path,
) -> tuple[Registry, Iterator[Any], dict[str, str]]:
    """The registry, the log's messages and their kinds (``_open_log``), and ``out`` made;
    a one-line error if any of them fails."""
    from flows.tools.replay_input import ReplayError

    try:
        reg = Registry.load(registry)
        messages, kinds = _open_log(events, requests, feedback, kafka)
        out.mkdir(parents=True, exist_ok=True)
    except (RegistryError, ReplayError) as exc:
        fail("replay", str(exc))
    except OSError as exc:
        fail("replay", f"cannot write to {out}: {exc.strerror}")
    return reg, messages, kinds


def _summary(result: Replayed, source: object) -> str:
    """The line a replay ends with: what it read from ``source`` and what came of it."""
    return (
        f"{result.events:,} lines from {source}: {result.served:,} selections, "
        f"{result.applied_feedback:,} feedback applied, {sum(result.reasons.values()):,} dead "
        f"letters, {sum(result.at_end_reasons.values()):,} pending at the end"
    )


def _read_as_combined(kafka: _TopicSource | None) -> str:
    """When every line was a dead letter: which topics were read as combined events, and
    how to name the service's own topics instead ('' when none was)."""
    if kafka is None or not kafka.log.combined:
        return ""
    return (
        f" ({', '.join(kafka.log.combined)} read as combined events: name the service's "
        "topics with --requests-topic, --feedback-topic, --internal-topic, as for tsi run)"
    )


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


def _write_inputs(
    out: Path,
    registry: Path,
    events: Path | None,
    requests: Path | None,
    feedback: Path | None,
    kafka: _TopicSource | None,
) -> None:
    """``inputs.json``: what was replayed (absolute paths), for ``tsi evaluate OUT``."""
    given = {"registry": registry, "events": events, "requests": requests, "feedback": feedback}
    manifest: dict[str, Any] = {
        name: None if value is None else str(value.resolve()) for name, value in given.items()
    }
    manifest["topics"] = None if kafka is None else list(kafka.log.topics)
    manifest["brokers"] = None if kafka is None else kafka.brokers
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
    kafka: _TopicSource | None,
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
    if kafka is not None:
        return _started(kafka.read()), kafka.log.kinds
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
    contexts: dict[tuple[str, str | None, str], int | str] = field(default_factory=dict)

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
                self.contexts.setdefault(key, context_label(event.context))


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
