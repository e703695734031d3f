"""``tsi state export`` and ``tsi state import``: the service's state, moved between stores."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import typer

from flows.cli.base import app, fail

state_app = typer.Typer(
    no_args_is_help=True,
    help="Move the bandits' state and input positions to new recovery directories "
    "(another number of processes or workers).",
)
app.add_typer(state_app, name="state")

_DIRS = typer.Option(
    ..., "--recovery-dir", help="A recovery directory (give one per process of a cluster)."
)


@state_app.command("export")
def export_command(
    file: Path = typer.Argument(..., help="The state file to write."),
    recovery_dir: list[Path] = _DIRS,
) -> None:
    """Write the committed state of a stopped service to FILE."""
    from flows.tools.state import export_state

    missing = [str(d) for d in recovery_dir if not d.is_dir()]
    if missing:
        fail("state export", f"recovery directory {missing[0]} does not exist")
    try:
        moved = export_state(recovery_dir, file)
    except (OSError, ValueError, sqlite3.Error) as exc:
        fail("state export", str(exc))
    typer.echo(
        f"exported {moved.instances:,} instances and {moved.input_partitions} input "
        f"positions to {file}"
    )


@state_app.command("import")
def import_command(
    file: Path = typer.Argument(..., help="A file `tsi state export` wrote."),
    recovery_dir: list[Path] = _DIRS,
) -> None:
    """Seed new, empty recovery directories with FILE; `tsi run` then starts from it."""
    from flows.tools.state import StateFileError, import_state

    try:
        moved = import_state(file, recovery_dir)
    except (StateFileError, OSError) as exc:
        fail("state import", str(exc))
    typer.echo(
        f"imported {moved.instances:,} instances and {moved.input_partitions} input positions "
        f"into {len(recovery_dir)} recovery director{'y' if len(recovery_dir) == 1 else 'ies'}"
    )
