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
    """Write the committed state of a stopped service to FILE.

    Give the recovery directory of every process of the service (a shard's log and its
    marker may lie in two of them), or of every member (each shard is taken from the member
    holding it), e.g.
    `tsi state export state.tsi --recovery-dir vol-0/recovery --recovery-dir vol-1/recovery`.
    """
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
    processes: int | None = typer.Option(
        None,
        min=1,
        help="Processes of the new cluster (default: one per --recovery-dir; with one "
        "directory, the processes that share it).",
    ),
    shards: str | None = typer.Option(
        None,
        help="The new store's shard count: each instance goes to its shard of it "
        "(default: this flow's).",
    ),
    member: int | None = typer.Option(
        None, help="Import only what member K of --members holds, into its one directory."
    ),
    members: int | None = typer.Option(None, help="The new service's member count."),
) -> None:
    """Make new recovery directories from FILE; `tsi run` then starts from them as is.

    One directory per process of the new cluster, e.g.
    `tsi state import state.tsi --recovery-dir vol-0/recovery --recovery-dir vol-1/recovery`;
    start the cluster with the same consumer group (no --fresh). For members, one import
    per member: `tsi state import state.tsi --recovery-dir vol-0/recovery --member 0
    --members 2`, then the same for member 1.
    """
    from flows.service.connectors.members import Members
    from flows.tools.state import import_state

    if (member is None) != (members is None):
        fail("state import", "give --member K and --members N together")
    try:
        layout = None if member is None else Members(members, member)
        moved = import_state(file, recovery_dir, processes, shards, layout)
    except (OSError, ValueError) as exc:
        fail("state import", str(exc))
    typer.echo(
        f"imported {moved.instances:,} instances and {moved.input_partitions} input positions "
        f"into {len(recovery_dir)} recovery director{'y' if len(recovery_dir) == 1 else 'ies'}"
    )
