"""``tsi evaluate``: counterfactual evaluation of registry configurations on logs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import typer

from flows.cli.base import app, fail
from flows.cli.options import with_options
from flows.service.instances.registry import Registry, RegistryError
from flows.service.runtime.settings import (
    CLIENT_OPTIONS,
    TOPIC_OPTIONS,
    ConfigError,
    consumer_from_env,
)
from flows.tools.evaluation.estimators import MIN_ESS

if TYPE_CHECKING:
    from flows.tools.evaluation.compare import Comparison
    from flows.tools.evaluation.inputs import Inputs


_TOPICS = ("selections", "events", "feedback", "requests")
#: ``--selections-topic`` is what turns reading from Kafka on: unset, the files are read,
#: so its help names no default topic (``tsi run``'s flag and variable, its own help).
SELECTIONS = replace(
    TOPIC_OPTIONS["selections"],
    help="Read the service's selections from this Kafka topic, and its requests and "
    "feedback from their topics, instead of files.",
    shown="none: the files given are read",
)
#: The service's settings an evaluation from Kafka reads, declared once with ``tsi run``'s:
#: the brokers, the client settings, and the topics the service wrote and read.
EVALUATE_OPTIONS = (*CLIENT_OPTIONS, SELECTIONS, *(TOPIC_OPTIONS[k] for k in _TOPICS[1:]))


@app.command()
@with_options(*EVALUATE_OPTIONS)
def evaluate(
    env: Mapping[str, str],
    log: Path | None = typer.Argument(
        None,
        help="A JSONL log (full information, or bandit records with 'prob'), or the "
        "directory tsi demo wrote (its selections joined with its events).",
    ),
    selections: Path | None = typer.Option(None, help="Selections the service wrote (JSONL)."),
    events: Path | None = typer.Option(None, help="Requests and feedback (field 'type')."),
    feedback: Path | None = typer.Option(None, help="Feedback sent to the service (JSONL)."),
    requests: Path | None = typer.Option(None, help="Requests (their contexts), with --feedback."),
    registry: list[Path] = typer.Option(
        [], help="A configuration to evaluate (registry TOML); repeat to compare several."
    ),
    served_registry: Path | None = typer.Option(
        None,
        help="The registry the service ran with, whose windows, aggregate and default_loss "
        "turn the feedback into the losses it applied (default: the directory's registry, "
        "else the first --registry).",
    ),
    variant: list[str] = typer.Option(
        [], help="Also evaluate each registry with this variant in every experiment; repeat."
    ),
    experiment: str | None = typer.Option(None, help="Only this experiment of the log."),
    switches: int | None = typer.Option(None, min=0, help="Switches of the competitor."),
    level: float = typer.Option(0.95, min=0.5, max=0.999, help="Confidence level."),
    seed: int = typer.Option(0, min=0, help="Evaluation seed (the policy's draws)."),
    min_ess: float = typer.Option(
        MIN_ESS,
        help="Effective sample size (Kish's, of the importance weights) below which an "
        "estimate is shown as 'insufficient data', not ranked against the served policy.",
    ),
    out: Path | None = typer.Option(None, help="Also write REPORT.md, a plot and JSON here."),
) -> None:
    """Counterfactual evaluation of registry configurations on logged data.

    Reads a log written for evaluation, or what the service, tsi demo or tsi replay wrote
    (selections joined with feedback inside the command, by the served registry's
    feedback_ttl, aggregate and default_loss): files, a demo directory, or the Kafka
    topics (with --selections-topic: the service's topics as tsi run names them, the
    events topic or else the requests and feedback topics). Every off-policy
    estimate shows its effective sample size (ESS); below --min-ess it says
    "insufficient data" instead of a figure.
    """
    from flows.tools.evaluation import EvaluationError
    from flows.tools.evaluation.compare import compare, configurations
    from flows.tools.evaluation.inputs import read_inputs

    given = _inputs(env, log, selections, events, feedback, requests)
    try:
        data, paths = read_inputs(given, registry, served_registry)
        chosen = configurations([(str(p), Registry.load(p)) for p in paths], variant)
        result = compare(data.log, chosen, experiment, switches, level, seed, data.served, min_ess)
    except (RegistryError, EvaluationError) as exc:
        fail("evaluate", str(exc))
    text = result.to_markdown()
    typer.echo(text)
    if out is not None:
        _write(result, out, text)


def _inputs(env: Mapping[str, str], *files: Path | None) -> Inputs:
    """The sources: the files given, or (``--selections-topic`` given, by flag or
    variable) the service's topics as ``env`` names them, read from its brokers with its
    client settings; a one-line error for a bad setting."""
    from flows.tools.evaluation.inputs import Inputs

    if not SELECTIONS.given(env):
        return Inputs(*files)
    try:
        brokers, consumer = consumer_from_env(env)
        selections = SELECTIONS.read(env)
        events, feedback, requests = (TOPIC_OPTIONS[k].read(env) for k in _TOPICS[1:])
    except ConfigError as exc:
        fail("evaluate", str(exc))
    two = events is None  # the service reads the two input topics, or the events topic
    return Inputs(
        *files,
        brokers=brokers,
        selections_topic=selections,
        events_topic=events,
        feedback_topic=feedback if two else None,
        requests_topic=requests if two else None,
        consumer=consumer,
    )


def _write(result: Comparison, out: Path, text: str) -> None:
    from flows.tools.report import plot_evaluation

    try:
        out.mkdir(parents=True, exist_ok=True)
        plot = plot_evaluation(result.evaluations[0][1], out / "evaluation.png")
        (out / "REPORT.md").write_text(text + f"\n![evaluation]({plot.name})\n")
        (out / "evaluation.json").write_bytes(
            orjson.dumps(result.to_dict(), option=orjson.OPT_INDENT_2)
        )
    except OSError as exc:
        fail("evaluate", f"cannot write to {out}: {exc.strerror}")
