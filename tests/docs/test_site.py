"""The documentation site builds strictly (no broken internal link, no page missing from
the nav), and its generated reference pages name everything the code declares: every
option of every command, every registry key, every HTTP path and every metric."""

from __future__ import annotations

import html
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from flows.cli import app
from flows.gateway.openapi import openapi
from flows.service.instances.registry import KNOWN_SETTINGS
from flows.service.runtime.settings import options, settings_table

ROOT = Path(__file__).resolve().parents[2]


def _hook():
    spec = importlib.util.spec_from_file_location("docs_hook", ROOT / "docs/_hooks/reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HOOK = _hook()


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"NO_MKDOCS_2_WARNING": "1", **__import__("os").environ},
    )
    assert built.returncode == 0, built.stdout + built.stderr
    return out


def page(site: Path, name: str) -> str:
    return html.unescape((site / name / "index.html").read_text())


def test_every_option_of_every_command_is_in_the_cli_reference(site):
    text = page(site, "reference/cli")
    commands = HOOK._commands(typer.main.get_command(app), "tsi")
    assert {"tsi run", "tsi serve", "tsi topics create", "tsi state export"} <= {
        name for name, _ in commands
    }
    for name, command in commands:
        assert f"tsi {name.split(' ', 1)[1]}" in text
        for param in command.params:
            if not getattr(param, "hidden", True):
                assert all(flag in text for flag in param.opts), (name, param.opts)


def test_the_cli_reference_holds_the_settings_table(site):
    assert settings_table() in HOOK.cli_page()
    text = page(site, "reference/cli")
    for option in options():
        assert option.var in text and option.flag.split("/")[0] in text


def test_every_registry_key_is_in_the_registry_reference(site):
    text = page(site, "reference/registry")
    assert all(key in text for key in KNOWN_SETTINGS)


def test_every_openapi_path_is_in_the_http_reference(site):
    text = page(site, "reference/http-api")
    for path, methods in openapi()["paths"].items():
        for method in methods:
            assert f"{method.upper()} {path}" in text


def test_every_metric_is_in_the_metrics_reference(site):
    text = page(site, "reference/metrics")
    names = [name for name, _, _ in HOOK.metric_names()]
    assert {"tsi_decisions_total", "tsi_ready", "tsi_arm_share"} <= set(names)
    assert all(name in text for name in names)


def test_the_root_documents_are_pages(site):
    for name in HOOK.ROOT_PAGES:
        assert (site / name.removesuffix(".md") / "index.html").exists()


def test_a_broken_link_fails_the_strict_build(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n[gone](nowhere.md)\n")
    (tmp_path / "mkdocs.yml").write_text("site_name: t\nstrict: true\n")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "s")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert built.returncode != 0 and "nowhere.md" in built.stdout + built.stderr
