"""The command-line options of declared settings (``flows.service.runtime.options.Option``).

``with_options(*options)`` gives a command one option per setting, its flag, help,
variable and default taken from the declaration. The command does not get the values: it
gets ``env``, the environment with each flag given on the command line in its variable's
place, and reads it as the declarations read any environment (``Settings.from_env``): a
flag and its variable given the same text are the same setting.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from typing import Any

import typer
from rich.markup import escape

from flows.service.runtime.options import Option

Command = Callable[..., Any]
_TYPES = {"value": str | None, "switch": bool | None, "list": list[str] | None}


def with_options(*options: Option) -> Callable[[Command], Command]:
    """Add ``options`` to a command, whose ``env`` parameter receives the environment with
    the options given on its command line (they win over the variables)."""

    def decorate(command: Command) -> Command:
        own = inspect.signature(command, eval_str=True)
        kept = [p for p in own.parameters.values() if p.name != "env"]
        by_name = {_param_name(option): option for option in options}
        added = [
            inspect.Parameter(
                key,
                inspect.Parameter.KEYWORD_ONLY,
                default=_typer_option(option),
                annotation=_TYPES[option.kind],
            )
            for key, option in by_name.items()
        ]

        @functools.wraps(command)
        def run(**kwargs: Any) -> Any:
            values = {option.var: kwargs.pop(key) for key, option in by_name.items()}
            given = {var: _as_text(v) for var, v in values.items() if v not in (None, [])}
            return command(**kwargs, env={**os.environ, **given})

        params = added + [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in kept]
        run.__signature__ = own.replace(parameters=params)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in params}
        return run

    return decorate


def _param_name(option: Option) -> str:
    """The command's parameter for ``option``: its flag, as a Python name."""
    return option.flag.split("/")[0].removeprefix("--").replace("-", "_")


def _typer_option(option: Option) -> Any:
    """The option on the command line: unset (None) unless given; help, variable and
    default shown as the declaration has them."""
    about = f"{option.help} [env var: {option.var}] [default: {option.default_text}]"
    return typer.Option(None, option.flag, help=escape(about.replace("`", "")), show_default=False)


def _as_text(value: str | bool | list[str]) -> str:
    """A flag's value as its variable's text: a switch is ``1`` or ``0``, a repeated
    flag's values are comma-separated."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, list):
        return ",".join(value)
    return value
