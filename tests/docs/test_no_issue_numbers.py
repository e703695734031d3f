"""Nothing a user reads cites an issue number: the README, the docs site's pages, the
root documents and every command's help text."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer

from flows.cli import app

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted(
    [
        *(ROOT / name for name in ("README.md", "ARCHITECTURE.md", "CHANGELOG.md")),
        *(ROOT / name for name in ("ALGORITHM.md", "VARIANTS.md")),
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / "deploy").rglob("README.md"),
    ]
)
#: "issue 41", "issues #39", "(issue 43)", and a bare "#39" (not "&#39;", not a colour).
ISSUE = re.compile(r"\bissues?\s*#?\s*\d+|(?<![\w&/#])#\d+\b", re.I)


def issue_numbers(text: str) -> list[str]:
    """The issue citations in ``text``.

    >>> issue_numbers("fixed (issue 43), see issue #39 and #41; colour #1f77b4, &#39;")
    ['issue 43', 'issue #39', '#41']
    """
    return ISSUE.findall(text)


def help_texts() -> list[tuple[str, str]]:
    """(command, help) of every command and option of ``tsi``."""
    found, todo = [], [("tsi", typer.main.get_command(app))]
    while todo:
        name, command = todo.pop()
        found.append((name, command.help or ""))
        found += [
            (f"{name} {param.name}", getattr(param, "help", "") or "") for param in command.params
        ]
        todo += [(f"{name} {sub}", each) for sub, each in getattr(command, "commands", {}).items()]
    return found


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_document_cites_an_issue(path):
    assert issue_numbers(path.read_text()) == []


def test_no_help_text_cites_an_issue():
    texts = help_texts()
    assert len(texts) > 50 and any(name == "tsi run registry" for name, _ in texts)
    assert [(name, issue_numbers(text)) for name, text in texts if issue_numbers(text)] == []
