"""What every ``tsi`` command shares: the app, one-line user errors, progress bars, the
options the service commands have in common, and writing JSON lines.

Each command is a module of this package (``run``, ``topics``, ``demo``, ``replay``,
``evaluate``, ``inspect``, ``simulate``), registered on ``app`` when the package loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

import orjson
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from flows.service.connectors.kafka import Topics
from flows.service.settings import DEFAULT_BROKERS

app = typer.Typer(no_args_is_help=True, help="Translation- and scale-invariant bandits.")


@app.callback()
def main() -> None:
    """Translation- and scale-invariant bandits on streams."""


class UserError(Exception):
    """A mistake a person can fix: printed as one line, exit status 2, no traceback."""


def fail(command: str, message: str) -> NoReturn:
    typer.echo(f"tsi {command}: {message}", err=True)
    raise typer.Exit(2)


def progress_bar(description: str) -> Progress:
    """A progress bar on stderr (quiet when stderr is not a terminal)."""
    return Progress(
        TextColumn(description),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )


def write_jsonl(path: Path, items: list[dict]) -> None:
    with path.open("wb") as f:
        for item in items:
            f.write(orjson.dumps(item) + b"\n")


BROKERS = typer.Option(
    DEFAULT_BROKERS,
    envvar="KAFKA_BOOTSTRAP_SERVERS",
    help="Kafka bootstrap servers, comma-separated.",
)
KAFKA_CONFIG = typer.Option(
    None,
    envvar="TSI_KAFKA_CONFIG",
    # rich reads [...] as markup: the table names are escaped to be shown
    help="TOML of librdkafka client settings (SASL, TLS, ...): \\[kafka] for both clients, "
    "\\[kafka.consumer] and \\[kafka.producer] for one; names as in librdkafka, quoted or "
    'not (security.protocol = "SASL_SSL"). Unknown names are refused; secrets are '
    "masked when the effective settings are logged.",
)
REQUESTS_TOPIC = typer.Option(Topics.requests, envvar="TSI_TOPIC_REQUESTS", help="Requests topic.")
FEEDBACK_TOPIC = typer.Option(Topics.feedback, envvar="TSI_TOPIC_FEEDBACK", help="Feedback topic.")
EVENTS_TOPIC = typer.Option(
    None,
    envvar="TSI_TOPIC_EVENTS",
    help="One topic for requests and feedback (field 'type'); replaces the two.",
)
SELECTIONS_TOPIC = typer.Option(
    Topics.selections, envvar="TSI_TOPIC_SELECTIONS", help="Selections topic."
)
INTERNAL_TOPIC = typer.Option(
    "tsi.events.internal",
    envvar="TSI_TOPIC_INTERNAL",
    help="With two input topics: the instance-keyed topic the service copies both into and "
    "serves from, so a restart sees every instance's events in the same order ('' to serve "
    "straight from the two, without that guarantee).",
)
DLQ_TOPIC = typer.Option(Topics.dead_letters, envvar="TSI_TOPIC_DLQ", help="Dead-letter topic.")
