"""What every ``tsi`` command shares: the app, one-line user errors, progress bars and
writing JSON lines (the service commands' options: ``flows.cli.options``).

Each command is a module of this package (``run``, ``topics``, ``demo``, ``replay``,
``evaluate``, ``inspect``, ``simulate``, ``serve``, ``keys``), registered on ``app`` when
the package loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

import orjson
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

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
