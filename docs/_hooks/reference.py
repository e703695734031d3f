"""The reference pages, generated at build time from the project's declarations.

``mkdocs.yml`` names this file under ``hooks:``; ``on_files`` adds the pages
``reference/cli.md`` (every command's options, and ``tsi run``'s settings table),
``reference/registry.md`` (the registry's keys), ``reference/http-api.md`` (the gateway's
OpenAPI document) and ``reference/metrics.md`` (every metric the service exports), and
``ALGORITHM.md``, ``VARIANTS.md``, ``ARCHITECTURE.md`` and ``CHANGELOG.md`` copied from
the repository root, so nothing here is written twice or drifts.

>>> "/v1/decide" in http_page()
True
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

ROOT = Path(__file__).resolve().parents[2]
#: Files of the repository root that are pages of the site as they are.
ROOT_PAGES = ("ALGORITHM.md", "VARIANTS.md", "ARCHITECTURE.md", "CHANGELOG.md")
_GENERATED = "<!-- generated at build time by docs/_hooks/reference.py: edit the declarations -->\n"


def _cell(text: Any) -> str:
    """``text`` as one cell of a Markdown table: one line, pipes escaped, Rich's escapes
    undone.

    >>> _cell("a | b\\n c \\\\[x]")
    'a \\\\| b c [x]'
    """
    flat = " ".join(str(text).split()).replace("\\[", "[")
    return flat.replace("|", "\\|")


def _option_rows(command: Any) -> list[str]:
    rows = ["| option | variable | meaning |", "|---|---|---|"]
    for param in command.params:
        if param.param_type_name != "option" or param.hidden:
            continue
        flags = " / ".join(f"`{each}`" for each in [*param.opts, *param.secondary_opts])
        var = param.envvar if isinstance(param.envvar, str) else ""
        rows.append(f"| {flags} | {f'`{var}`' if var else ''} | {_cell(param.help or '')} |")
    return rows


def _commands(group: Any, prefix: str) -> list[tuple[str, Any]]:
    """(``tsi topics create``, its command) of every command under ``group``: Typer's
    own click, so groups are told by their ``commands``."""
    found = []
    for name, command in sorted(group.commands.items()):
        if hasattr(command, "commands"):
            found += _commands(command, f"{prefix} {name}")
        else:
            found.append((f"{prefix} {name}", command))
    return found


def cli_page() -> str:
    """Every ``tsi`` command with its options, and ``tsi run``'s settings table."""
    from flows.cli import app
    from flows.service.runtime.settings import settings_table

    parts = [
        "# Command-line options\n",
        _GENERATED,
        "Each command's options, read from the command line itself (`tsi COMMAND --help`",
        "says the same). An overview of what each command does: [Commands](commands.md).\n",
        "## The settings of `tsi run`\n",
        "Each `tsi run` setting is an option and an environment variable (an option given",
        "wins over its variable; a switch is `1` or `0` in its variable; an empty variable",
        "is its default):\n",
        settings_table(),
    ]
    for name, command in _commands(typer.main.get_command(app), "tsi"):
        summary = _cell((command.help or "").split("\n\n")[0])
        parts += [f"## `{name}`\n", f"{summary}\n", "\n".join(_option_rows(command)) + "\n"]
    return "\n".join(parts)


def registry_page() -> str:
    """Every key an experiment's table of the registry may hold (``registry_keys.KEYS``)."""
    from flows.service.instances.registry_keys import KEYS

    rows = ["| key | meaning | example |", "|---|---|---|"]
    rows += [f"| `{k.name}` | {_cell(k.means)} | `{_cell(k.example)}` |" for k in KEYS]
    return "\n".join(
        [
            "# Registry keys\n",
            _GENERATED,
            "An experiment is a table `[experiments.NAME]` of the registry (TOML); these",
            "are the keys it may hold, any other is refused, naming it. What each serving",
            "setting does: [Floors, holdouts, burn-in and forcing](../guides/serving-settings.md);",
            "contexts: [Contexts and eligibility](../guides/contexts.md).\n",
            "\n".join(rows) + "\n",
        ]
    )


def _schema_rows(schema: dict[str, Any]) -> list[str]:
    required = set(schema.get("required", ()))
    rows = ["| field | required | schema |", "|---|---|---|"]
    for name, spec in schema.get("properties", {}).items():
        shown = _cell(json.dumps(spec, ensure_ascii=False))
        rows.append(f"| `{name}` | {'yes' if name in required else ''} | `{shown}` |")
    return rows


def _operation(path: str, method: str, spec: dict[str, Any]) -> list[str]:
    lines = [f"## `{method.upper()} {path}`\n"]
    if "summary" in spec:
        lines.append(f"{spec['summary']}.\n")
    body = spec.get("requestBody", {}).get("content", {}).get("application/json", {})
    if body:
        lines += ["Body (JSON):\n", "\n".join(_schema_rows(body["schema"])) + "\n"]
    rows = ["| status | meaning |", "|---|---|"]
    rows += [f"| {code} | {_cell(r['description'])} |" for code, r in spec["responses"].items()]
    return [*lines, "Responses:\n", "\n".join(rows) + "\n"]


def http_page() -> str:
    """The gateway's HTTP API (``tsi serve``), from its OpenAPI document."""
    from flows.gateway.openapi import openapi

    document = openapi()
    parts = [
        "# HTTP API\n",
        _GENERATED,
        f"What `tsi serve` answers ({document['info']['title']}, OpenAPI",
        f"{document['openapi']}; the document itself is served at `GET /openapi.json`).\n",
    ]
    for path, methods in document["paths"].items():
        for method, spec in methods.items():
            parts += _operation(path, method, spec)
    return "\n".join(parts)


def metric_names() -> list[tuple[str, str, str]]:
    """(name as exported, type, help) of every ``tsi_`` metric the service registers.

    >>> ("tsi_ready", "gauge") in [(name, kind) for name, kind, _ in metric_names()]
    True
    """
    from prometheus_client import REGISTRY

    # every module that registers metrics: the service's, the experiments topic's follower
    # (tsi run --experiments-topic) and the guardrails' controller (tsi serve's /metrics)
    import flows.experiments.follow
    import flows.guardrails.control
    import flows.service.observe.metrics  # noqa: F401

    found = {}
    for family in REGISTRY.collect():
        if family.name.startswith("tsi_"):
            name = family.name + ("_total" if family.type == "counter" else "")
            found[name] = (name, family.type, family.documentation)
    return sorted(found.values())


def metrics_page() -> str:
    """Every metric of ``/metrics``, with its type and help text."""
    rows = ["| metric | type | meaning |", "|---|---|---|"]
    rows += [f"| `{name}` | {kind} | {_cell(text)} |" for name, kind, text in metric_names()]
    return "\n".join(
        [
            "# Metrics\n",
            _GENERATED,
            "What `tsi run --metrics-port PORT` exports at `/metrics` (Prometheus), and",
            "`tsi_guardrail_breaches_total` at `tsi serve`'s `GET /metrics`, read from the",
            "metrics they register; their labels and how to read them:",
            "`flows/service/observe/metrics.py`.\n",
            "\n".join(rows) + "\n",
        ]
    )


#: The generated pages, by their path under ``docs/``.
PAGES: dict[str, Callable[[], str]] = {
    "reference/cli.md": cli_page,
    "reference/registry.md": registry_page,
    "reference/http-api.md": http_page,
    "reference/metrics.md": metrics_page,
}


def on_files(files: Any, config: Any) -> Any:
    """MkDocs' hook: the generated pages and the root's pages added to the site."""
    from mkdocs.structure.files import File

    for path, render in PAGES.items():
        files.append(File.generated(config, path, content=render()))
    for name in ROOT_PAGES:
        files.append(File.generated(config, name, content=(ROOT / name).read_text()))
    return files
