"""``tsi keys create``, ``list`` and ``revoke``: the API keys of ``tsi serve --keys``
(``flows.gateway.keys``). A token is printed once, when its key is created; the file keeps
only its hash."""

from __future__ import annotations

from pathlib import Path

import typer

from flows.cli.base import app, fail

keys_app = typer.Typer(
    no_args_is_help=True,
    help="The gateway's API keys (tsi serve --keys FILE): create, list, revoke.",
)
app.add_typer(keys_app, name="keys")

_FILE = typer.Option(..., "--file", envvar="TSI_SERVE_KEYS", help="The keys file (TOML).")


@keys_app.command("create")
def create_command(
    name: str = typer.Argument(..., help="The key's name (the principal the audit log shows)."),
    scope: list[str] = typer.Option(
        ..., "--scope", help="decide, read or admin (admin implies read); repeat for several."
    ),
    file: Path = _FILE,
) -> None:
    """Add key NAME to FILE (made when missing) and print its token, once: only its hash is
    kept, e.g. `tsi keys create shop-web --scope decide --file keys.toml`."""
    from flows.gateway.keys import KeysError, create

    try:
        token = create(file, name, scope)
    except KeysError as exc:
        fail("keys create", str(exc))
    typer.echo(token)
    typer.echo(
        f"key {name!r} ({', '.join(scope)}) added to {file}; its token is shown only now", err=True
    )


@keys_app.command("list")
def list_command(file: Path = _FILE) -> None:
    """Print each key of FILE: its name and scopes."""
    from flows.gateway.keys import SCOPES, KeysError, load

    try:
        keys = load(file)
    except KeysError as exc:
        fail("keys list", str(exc))
    for name, (key, _) in sorted(keys.items()):
        typer.echo(f"{name}\t{','.join(s for s in SCOPES if s in key.scopes)}")


@keys_app.command("revoke")
def revoke_command(
    name: str = typer.Argument(..., help="The key to remove."), file: Path = _FILE
) -> None:
    """Remove key NAME from FILE: a gateway refuses its token once it reads the file again
    (it looks each second, and on SIGHUP)."""
    from flows.gateway.keys import KeysError, revoke

    try:
        revoke(file, name)
    except KeysError as exc:
        fail("keys revoke", str(exc))
    typer.echo(f"key {name!r} revoked in {file}", err=True)
