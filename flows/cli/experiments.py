"""``tsi experiments``: list, show, apply, pause, resume, stop, archive and the history of
the experiments on the application's topic (``flows.experiments.store``)."""

from __future__ import annotations

import functools
import getpass
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import orjson
import typer

from flows.cli.base import app, fail
from flows.cli.options import with_options
from flows.service.runtime.kafka_options import (
    CLIENT_OPTIONS,
    CONNECT_TIMEOUT,
    GROUP_OPTION,
    application_id,
    client_config,
)
from flows.service.runtime.options import ConfigError

experiments_app = typer.Typer(
    no_args_is_help=True, help="Create, change, pause, stop and archive experiments."
)
app.add_typer(experiments_app, name="experiments")

#: What each command is told: the brokers, client settings and application (the group id,
#: which names the experiments topic).
STORE_OPTIONS = (*CLIENT_OPTIONS, GROUP_OPTION, CONNECT_TIMEOUT)
_WHO = typer.Option(None, "--who", help="Who makes the change (default: the OS user).")
_NAME = typer.Argument(..., help="The experiment's name.")


def _run(env: Mapping[str, str], action: Callable[[Any], None]) -> None:
    """``action`` on the store ``env`` names; its errors one line, exit status 2."""
    from flows.experiments.model import ExperimentError
    from flows.experiments.store import ExperimentStore, StoreError
    from flows.service.instances.registry import RegistryError

    try:
        consumer, _ = client_config(CLIENT_OPTIONS[1].read(env))
        store = ExperimentStore(
            CLIENT_OPTIONS[0].read(env), application_id(env), consumer, CONNECT_TIMEOUT.read(env)
        )
        store.ensure_topics()
        action(store)
    except (ConfigError, ExperimentError, StoreError, RegistryError) as exc:
        fail("experiments", str(exc))


def _said(name: str, resource: Any, audit: Any) -> None:
    """Print what a change did: its diff and new version, or "unchanged"."""
    if audit is None:
        typer.echo(f"{name}: unchanged (version {resource.version})")
        return
    typer.echo(f"{name}: {audit.action}, version {resource.version}")
    for key, (old, new) in audit.diff.items():
        typer.echo(f"  {key}: {_json(old)} -> {_json(new)}")


def _json(value: Any) -> str:
    return "(none)" if value is None else orjson.dumps(value).decode()


def _change(env: Mapping[str, str], name: str, operation: Callable[..., Any]) -> None:
    _run(env, lambda store: _said(name, *store.change(name, operation)))


@experiments_app.command("list")
@with_options(*STORE_OPTIONS)
def list_experiments(env: Mapping[str, str]) -> None:
    """Every experiment: name, status, version, the arm forced (if any)."""

    def show(store: Any) -> None:
        for name, r in sorted(store.current().items()):
            typer.echo(f"{name}\t{r.status}\tversion {r.version}\t{r.arm or ''}".rstrip())

    _run(env, show)


@experiments_app.command("show")
@with_options(*STORE_OPTIONS)
def show_experiment(env: Mapping[str, str], name: str = _NAME) -> None:
    """One experiment's resource, as JSON."""
    _run(env, lambda store: typer.echo(orjson.dumps(store.get(name).to_json()).decode()))


@experiments_app.command("apply")
@with_options(*STORE_OPTIONS)
def apply_file(
    env: Mapping[str, str],
    file: Path = typer.Option(..., "-f", "--file", help="TOML of [experiments.NAME] tables."),
    who: str | None = _WHO,
) -> None:
    """Create or change each experiment of a TOML file, printing each diff and version.

    The whole file is checked first: a bad one changes nothing. An experiment whose spec
    is the same is "unchanged"."""
    from flows.experiments.model import ExperimentError, apply, check_name
    from flows.service.instances.registry import Registry, RegistryError

    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
        Registry.from_dict(data)
        for name in data["experiments"]:
            check_name(name)
    except (OSError, tomllib.TOMLDecodeError, RegistryError, ExperimentError) as exc:
        fail("experiments", f"{file}: {exc}")
    for name, spec in data["experiments"].items():
        step = functools.partial(apply, name=name, spec=spec, who=who or getpass.getuser())
        _change(env, name, step)


@experiments_app.command("pause")
@with_options(*STORE_OPTIONS)
def pause_experiment(
    env: Mapping[str, str],
    name: str = _NAME,
    arm: str | None = typer.Option(None, help="The control arm served (default: the first)."),
    who: str | None = _WHO,
) -> None:
    """Serve the control arm to everyone and learn nothing, until resumed."""
    from flows.experiments.model import pause

    _change(env, name, functools.partial(pause, who=who or getpass.getuser(), arm=arm))


@experiments_app.command("resume")
@with_options(*STORE_OPTIONS)
def resume_experiment(env: Mapping[str, str], name: str = _NAME, who: str | None = _WHO) -> None:
    """Serve and learn again (a paused or stopped experiment)."""
    from flows.experiments.model import resume

    _change(env, name, functools.partial(resume, who=who or getpass.getuser()))


@experiments_app.command("stop")
@with_options(*STORE_OPTIONS)
def stop_experiment(
    env: Mapping[str, str],
    name: str = _NAME,
    arm: str = typer.Option(..., help="The arm served to everyone from now on."),
    who: str | None = _WHO,
) -> None:
    """End the experiment: ARM served to everyone."""
    from flows.experiments.model import stop

    _change(env, name, functools.partial(stop, arm=arm, who=who or getpass.getuser()))


@experiments_app.command("archive")
@with_options(*STORE_OPTIONS)
def archive_experiment(env: Mapping[str, str], name: str = _NAME, who: str | None = _WHO) -> None:
    """Stop serving it (its calls are refused); its record and history stay."""
    from flows.experiments.model import archive

    _change(env, name, functools.partial(archive, who=who or getpass.getuser()))


@experiments_app.command("history")
@with_options(*STORE_OPTIONS)
def experiment_history(env: Mapping[str, str], name: str = _NAME) -> None:
    """Every change of the experiment, oldest first: one JSON object a line."""
    _run(
        env,
        lambda store: [typer.echo(orjson.dumps(a.to_json()).decode()) for a in store.history(name)],
    )
