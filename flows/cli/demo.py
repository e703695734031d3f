"""``tsi demo``: the embedded default job, generated traffic through the real dataflow."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from flows.cli.base import app, fail, progress_bar, write_jsonl

if TYPE_CHECKING:  # imported where the command runs: `tsi --help` stays quick
    from flows.tools.demo import Loop
    from flows.tools.report_data import ServedLog


@app.command()
def demo(
    out: Path = typer.Option(Path("tsi-demo"), help="Directory for the report and the logs."),
    requests: int = typer.Option(
        20_000,
        min=100,
        help="Decision requests of the first three experiments; promo and signup add a "
        "quarter as many each.",
    ),
    seed: int = typer.Option(0, min=0, help="Seed of the traffic and of the bandits' draws."),
) -> None:
    """Generated traffic through the real dataflow (no Kafka), and a report with plots.

    Five experiments, delayed, lost and duplicated feedback, a change of the best arm,
    a holdout, conversions as the only feedback, a few broken messages. The report
    (REPORT.md with PNGs, and REPORT.html, one file) says what ran, compares the bandit
    with its holdout and sets the dead letters beside the faults injected.
    """
    from flows.service.instances.registry import Registry
    from flows.tools.demo import generate, injected, run_demo, served_log
    from flows.tools.report import write_report
    from flows.tools.report_context import CONTEXT_FILE, ReportContext, save_context
    from flows.tools.report_data import summarise
    from flows.tools.traffic import SCENARIOS, registry_toml

    toml = registry_toml(SCENARIOS, seed)
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "registry.toml").write_text(toml)
    except OSError as exc:
        fail("demo", f"cannot write to {out}: {exc.strerror}")
    registry = Registry.from_toml(toml)
    traffic = generate(requests, seed)
    with progress_bar("serving") as bar:
        task = bar.add_task("serving", total=len(traffic.events))
        loop = run_demo(traffic, registry, progress=lambda n: bar.advance(task, n))
    stream = served_log(loop)
    _write_logs(out, loop, stream)
    total = sum(summarise(stream, name).requests for name in stream.experiments())
    notes = _notes(total, requests, traffic.span, seed)
    title, faults = "tsi demo report", injected(loop)
    context = ReportContext(title, notes, faults, stream.truth)
    try:
        save_context(out / CONTEXT_FILE, context)
    except OSError as exc:
        fail("demo", f"cannot write to {out}: {exc.strerror}")
    report = write_report(stream, out, title, notes, registry=registry, injected=faults)
    typer.echo(
        f"{len(loop.selections):,} selections, {len(stream.feedback):,} feedback events, "
        f"{len(loop.dead_letters):,} dead letters; report: {report} (and REPORT.html)"
    )


def _write_logs(out: Path, loop: Loop, stream: ServedLog) -> None:
    """The stream as served and what came out of it, as JSON Lines under ``out``."""
    (out / "events.jsonl").write_bytes(b"".join(raw + b"\n" for raw in loop.sent))
    write_jsonl(out / "selections.jsonl", loop.selections)
    write_jsonl(out / "dead_letters.jsonl", loop.dead_letters)
    write_jsonl(out / "feedback.jsonl", stream.feedback)


def _notes(total: int, requests: int, span: float, seed: int) -> list[str]:
    """The report's notes: what ran (``total`` requests in all, ``requests`` of them for
    the three experiments ``--requests`` counts), where its files are, what the traffic is."""
    return [
        f"{total:,} requests over {span / 3600:g} h of simulated time ({requests:,} for "
        f"`checkout`, `homepage` and `push`, `--requests`; the rest for `promo` and "
        f"`signup`), seed {seed}; "
        "registry in `registry.toml`; the stream as served in `events.jsonl` (`tsi replay "
        "--events` reproduces the selections from it); outputs in `selections.jsonl`, "
        "`feedback.jsonl`, `dead_letters.jsonl`. The same page with its plots inline: "
        "`REPORT.html`; what it needs beyond the log (the truth, the faults), for a replay "
        "to write it again: `report_context.json`.",
        "The traffic: `checkout` pays in dollars (revenue as the reward) and its best arm "
        "changes at 60% of the stream; `homepage` measures seconds to the first click, and "
        "each user has a favourite layout; `push` is ignored or not, and each part of the "
        "day (3 contexts) has its own best message; `promo` is a banner clicked or not, "
        "with a tenth of its requests held out on `control` to measure the bandit "
        "against; `signup` hears only of conversions (`default_loss` turns a window "
        "without one into a loss of 1). Regret uses each arm's true expected loss at the "
        "time of the request.",
    ]
