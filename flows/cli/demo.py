"""``tsi demo``: the embedded default job, generated traffic through the real dataflow."""

from __future__ import annotations

from pathlib import Path

import typer

from flows.cli.base import app, fail, progress_bar, write_jsonl


@app.command()
def demo(
    out: Path = typer.Option(Path("tsi-demo"), help="Directory for the report and the logs."),
    requests: int = typer.Option(20_000, min=100, help="Decision requests to generate."),
    seed: int = typer.Option(0, min=0, help="Seed of the traffic and of the bandits' draws."),
) -> None:
    """Generated traffic through the real dataflow (no Kafka), and a report with plots.

    Three experiments, delayed, lost and duplicated feedback, a change of the best arm,
    a few broken messages.
    """
    from flows.service.events import Origin
    from flows.tools.demo import generate, run_demo
    from flows.tools.report import ServedLog, log_events, write_report
    from flows.tools.traffic import SCENARIOS, registry_toml

    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "registry.toml").write_text(registry_toml(SCENARIOS, seed))
    except OSError as exc:
        fail("demo", f"cannot write to {out}: {exc.strerror}")
    traffic = generate(requests, seed)
    with progress_bar("serving") as bar:
        task = bar.add_task("serving", total=len(traffic.events))
        loop = run_demo(traffic, progress=lambda n: bar.advance(task, n))
    (out / "events.jsonl").write_bytes(b"".join(raw + b"\n" for raw in loop.sent))
    write_jsonl(out / "selections.jsonl", loop.selections)
    write_jsonl(out / "dead_letters.jsonl", loop.dead_letters)
    request_ts, feedback_sent = log_events((raw, Origin("demo")) for raw in loop.sent)
    write_jsonl(out / "feedback.jsonl", feedback_sent)
    stream = ServedLog(
        loop.selections,
        feedback_sent,
        loop.dead_letters,
        request_ts,
        {rid: truth[2] for rid, truth in traffic.truth.items()},
    )
    notes = [
        f"{requests:,} requests over {traffic.span / 3600:g} h of simulated time, seed {seed}; "
        "registry in `registry.toml`; the stream as served in `events.jsonl` (`tsi replay "
        "--events` reproduces the selections from it); outputs in `selections.jsonl`, "
        "`feedback.jsonl`, `dead_letters.jsonl`.",
        "checkout: shared bandit, revenue as reward, best arm changes at 60% of the stream "
        "(competes with switching sequences); homepage: one bandit per user, loss = seconds "
        "to first click; push: contextual (3 parts of the day, a different best arm each).",
        "Regret uses each arm's true expected loss at the time of the request.",
    ]
    report = write_report(stream, out, "tsi demo report", notes)
    typer.echo(
        f"{len(loop.selections):,} selections, {len(feedback_sent):,} feedback events, "
        f"{len(loop.dead_letters):,} dead letters; report: {report}"
    )
