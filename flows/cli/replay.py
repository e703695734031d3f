"""``tsi replay``: a logged stream through the same dataflow, deterministically."""

from __future__ import annotations

from pathlib import Path

import typer

from flows.cli.base import app, fail, progress_bar, write_jsonl
from flows.service.registry import Registry, RegistryError


@app.command()
def replay(
    registry: Path = typer.Option(..., help="Experiments registry (TOML)."),
    events: Path | None = typer.Option(None, help="Combined log (field 'type'), in order."),
    requests: Path | None = typer.Option(None, help="Requests log (merged by 'ts')."),
    feedback: Path | None = typer.Option(None, help="Feedback log (merged by 'ts')."),
    topic: str | None = typer.Option(None, help="Kafka topic of combined events to replay."),
    brokers: str = typer.Option(
        "127.0.0.1:9092", envvar="KAFKA_BOOTSTRAP_SERVERS", help="Kafka brokers (with --topic)."
    ),
    from_offset: int | None = typer.Option(None, min=0, help="First offset (each partition)."),
    to_offset: int | None = typer.Option(None, min=0, help="Stop before this offset."),
    seed: int | None = typer.Option(None, min=0, help="Replace every experiment's seed."),
    out: Path = typer.Option(Path("tsi-replay"), help="Directory for outputs and the report."),
) -> None:
    """A logged stream through the same dataflow, deterministically, and a report.

    The same log and seed give the same selections, byte for byte.
    """
    from flows.tools.replay import ReplayError
    from flows.tools.replay import replay as run_replay
    from flows.tools.report import ServedLog, log_events, write_report

    sources = [events is not None, requests is not None or feedback is not None, topic is not None]
    if sum(sources) != 1 or (sources[1] and (requests is None or feedback is None)):
        fail("replay", "give --events, or --requests with --feedback, or --topic")
    try:
        reg = Registry.load(registry)
        messages, kinds = _read_log(
            events, requests, feedback, topic, brokers, from_offset, to_offset
        )
        out.mkdir(parents=True, exist_ok=True)
    except (RegistryError, ReplayError) as exc:
        fail("replay", str(exc))
    except OSError as exc:
        fail("replay", f"cannot write to {out}: {exc.strerror}")
    if not messages:
        fail("replay", "the log is empty")
    with progress_bar("replaying") as bar:
        task = bar.add_task("replaying", total=len(messages))
        result = run_replay(messages, reg, kinds, seed, lambda n: bar.advance(task, n))
    (out / "selections.jsonl").write_bytes(
        b"".join(line + b"\n" for line in result.selection_lines)
    )
    write_jsonl(out / "dead_letters.jsonl", result.dead_letters)
    feedback_logs = [source for source, kind in kinds.items() if kind == "feedback"]
    request_ts, feedback_sent = log_events(messages, feedback_logs)
    stream = ServedLog(result.selections, feedback_sent, result.dead_letters, request_ts)
    report = write_report(
        stream,
        out,
        "tsi replay report",
        [f"{len(messages):,} messages replayed from {events or topic or requests}."],
    )
    typer.echo(
        f"{len(result.selections):,} selections, {len(result.dead_letters):,} dead letters "
        f"from {len(messages):,} messages; {out / 'selections.jsonl'}; report: {report}"
    )


def _read_log(
    events: Path | None,
    requests: Path | None,
    feedback: Path | None,
    topic: str | None,
    brokers: str,
    from_offset: int | None,
    to_offset: int | None,
) -> tuple[list, dict[str, str]]:
    """The messages to replay, and the kind of each source file (empty for one log)."""
    from flows.tools.replay import kafka_range, merge_by_time, read_lines

    if events is not None:
        return list(read_lines(events)), {}
    if topic is not None:
        return kafka_range(brokers, topic, from_offset, to_offset), {}
    kinds = {str(requests): "request", str(feedback): "feedback"}
    return merge_by_time(read_lines(requests), read_lines(feedback)), kinds
