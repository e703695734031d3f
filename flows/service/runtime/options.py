"""One setting of the service, as it is declared once: its environment variable, its
``tsi run`` flag, its help, its default and its parser; and the parsers settings share.

A value is text, a variable's or a flag's alike, until its setting's parser reads it; a
bad one is a ``ConfigError`` naming the flag, the variable and the value. An empty value
is the default (``empty=True``: it is a value, which the parser reads, usually as none).

>>> port = Option("TSI_METRICS_PORT", "--metrics-port", "Metrics port.", optional(port_number))
>>> port.read({"TSI_METRICS_PORT": "9100"}), port.read({})
(9100, None)
>>> try:
...     port.read({"TSI_METRICS_PORT": "x"})
... except ConfigError as exc:
...     print(exc)
--metrics-port / TSI_METRICS_PORT must be a port number, got 'x'
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

T = TypeVar("T")
Parser = Callable[[str], Any]


class ConfigError(ValueError):
    """A setting of the service is missing or invalid."""


@dataclass(frozen=True)
class Option:
    """One setting as a person gives it: ``var`` in the environment or ``flag`` on the
    command line (``--x/--no-x`` for a switch), read by ``parse``.

    ``default``: the text an unset variable stands for (``None``: the setting is required);
    ``shown``: the default as a person reads it, when not that text; ``kind``: ``value``
    (a flag with a value), ``switch`` (a flag alone: ``1``, its ``--no-`` form ``0``) or
    ``list`` (a flag repeated; comma-separated in the variable).
    """

    var: str
    flag: str
    help: str
    parse: Parser
    default: str | None = ""
    shown: str = ""
    kind: Literal["value", "switch", "list"] = "value"
    empty: bool = False

    @property
    def names(self) -> str:
        """The flag and the variable, as messages name the setting."""
        return f"{self.flag.split('/')[0]} / {self.var}"

    @property
    def default_text(self) -> str:
        """The default as the help and the docs show it."""
        if self.default is None:
            return "required"
        return self.shown or (f"`{self.default}`" if self.default else "none")

    def given(self, env: Mapping[str, str]) -> bool:
        """Whether ``env`` gives the setting a value (not empty), by flag or variable."""
        return bool(env.get(self.var, "").strip())

    def read(self, env: Mapping[str, str]) -> Any:
        """The setting's value in ``env`` (its default when unset)."""
        text = env.get(self.var, "").strip()
        if not text and not (self.empty and self.var in env):
            if self.default is None:
                raise ConfigError(f"set {self.names}: {self.help}")
            text = self.default
        try:
            return self.parse(text)
        except ValueError as exc:
            raise ConfigError(f"{self.names} {exc}") from None


def optional(parse: Callable[[str], T]) -> Callable[[str], T | None]:
    """``parse``, with the empty text read as none."""

    def read(text: str) -> T | None:
        return parse(text) if text else None

    return read


def name(text: str) -> str:
    """A name that is not empty (a topic, a host)."""
    if not text:
        raise ValueError("must not be empty")
    return text


def comma_list(text: str) -> list[str]:
    """Comma- (or space-) separated items: ``a,b c`` is ``['a', 'b', 'c']``."""
    items = [item for item in re.split(r"[,\s]+", text) if item]
    if not items:
        raise ValueError(f"must name at least one item, got {text!r}")
    return items


def switch(text: str) -> bool:
    """``1`` (on) or ``0`` (off)."""
    if text not in ("1", "0"):
        raise ValueError(f"must be 1 or 0, got {text!r}")
    return text == "1"


def path(text: str) -> Path:
    return Path(text)


def port_number(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"must be a port number, got {text!r}")
    return int(text)


def seconds(least: float = 0.0, above: bool = False) -> Callable[[str], float]:
    """A number of seconds, ``least`` or more (more than ``least`` with ``above``)."""

    def read(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"must be a number, got {text!r}") from None
        bound = f"more than {least:g}" if above else f"{least:g} or more"
        if math.isnan(value) or value < least or (above and value == least):
            raise ValueError(f"must be {bound} seconds, got {value}")
        return value

    return read


def count(least: int) -> Callable[[str], int]:
    """A whole number, ``least`` or more."""

    def read(text: str) -> int:
        if not re.fullmatch(r"\+?[0-9]+", text) or int(text) < least:
            raise ValueError(f"must be a whole number, {least} or more, got {text!r}")
        return int(text)

    return read
