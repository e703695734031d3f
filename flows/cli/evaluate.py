"""``tsi evaluate``: counterfactual evaluation of a registry configuration on logs."""

from __future__ import annotations

from pathlib import Path

import orjson
import typer

from flows.cli.base import app, fail
from flows.service.registry import Registry, RegistryError


@app.command()
def evaluate(
    log: Path = typer.Argument(..., help="JSONL log: full-information or bandit with 'prob'."),
    registry: Path = typer.Option(..., help="The configuration to evaluate (registry TOML)."),
    experiment: str | None = typer.Option(None, help="Only this experiment of the log."),
    switches: int | None = typer.Option(None, min=0, help="Switches of the competitor."),
    level: float = typer.Option(0.95, min=0.5, max=0.999, help="Confidence level."),
    seed: int = typer.Option(0, min=0, help="Evaluation seed (the policy's draws)."),
    out: Path | None = typer.Option(None, help="Also write REPORT.md, a plot and JSON here."),
) -> None:
    """Counterfactual evaluation of a registry configuration on logged data."""
    from flows.tools.evaluation import EvaluationError, load_log
    from flows.tools.evaluation import evaluate as run_evaluation

    try:
        reg = Registry.load(registry)
        result = run_evaluation(load_log(log), reg, experiment, switches, level, seed)
    except (RegistryError, EvaluationError) as exc:
        fail("evaluate", str(exc))
    text = result.to_markdown()
    typer.echo(text)
    if out is not None:
        from flows.tools.report import plot_evaluation

        try:
            out.mkdir(parents=True, exist_ok=True)
            plot = plot_evaluation(result, out / "evaluation.png")
            (out / "REPORT.md").write_text(text + f"\n![evaluation]({plot.name})\n")
            (out / "evaluation.json").write_bytes(
                orjson.dumps(result.to_dict(), option=orjson.OPT_INDENT_2)
            )
        except OSError as exc:
            fail("evaluate", f"cannot write to {out}: {exc.strerror}")
