"""``tsi inspect``: q and counters of instances, read from a recovery directory."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import orjson
import typer

from flows.cli.base import UserError, app, fail
from flows.service.instances.registry import Registry, RegistryError


@app.command("inspect")
def inspect_command(
    recovery_dir: list[Path] = typer.Option(
        ..., help="The service's recovery directory (give one per process of a cluster)."
    ),
    instance: list[str] = typer.Argument(
        None, help="Instances: 'experiment' or 'experiment/unit', shell wildcards allowed."
    ),
    registry: Path | None = typer.Option(None, help="Registry, for arm names."),
    as_json: bool = typer.Option(False, "--json", help="JSON lines instead of a table."),
    limit: int = typer.Option(50, min=1, help="Show at most this many instances."),
    board: bool = typer.Option(
        False,
        "--leaderboard",
        help="Per experiment its arms by share, decisions and feedback (every matching "
        "instance counts; --limit does not apply).",
    ),
) -> None:
    """The current allocation (q) and counters of instances, from a recovery directory
    (a cluster's: every process's, `--recovery-dir vol-0/recovery --recovery-dir
    vol-1/recovery`)."""
    from flows.service.runtime.recovery import NotOneClusterError, read_states
    from flows.tools.inspect import (
        InspectError,
        describe,
        leaderboard,
        render,
        render_leaderboard,
        select_instances,
    )

    try:
        reg = Registry.load(registry) if registry is not None else None
        missing = [d for d in recovery_dir if not d.is_dir()]
        if missing:
            raise UserError(f"recovery directory {missing[0]} does not exist")
        states = read_states(recovery_dir)
        keys = select_instances(states, instance or ["*"])
        views = [describe(k, states[k], reg) for k in (keys if board else keys[:limit])]
        boards = leaderboard(views) if board else []
    except (RegistryError, InspectError, UserError, FileNotFoundError, NotOneClusterError) as exc:
        fail("inspect", str(exc))
    except sqlite3.Error as exc:
        where = ", ".join(map(str, recovery_dir))
        fail("inspect", f"{where} is not a readable recovery directory: {exc}")
    if board:
        if as_json:
            for b in boards:
                typer.echo(orjson.dumps(b.to_dict()).decode())
        else:
            typer.echo(render_leaderboard(boards))
        return
    if as_json:
        for v in views:
            typer.echo(orjson.dumps(v.to_dict()).decode())
    else:
        typer.echo(render(views))
    if len(keys) > limit:
        typer.echo(f"... {len(keys) - limit} more (raise --limit)", err=True)
