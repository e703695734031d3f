"""Every repository path a README or a page of the docs site quotes (in backticks or a
code block) exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
READMES = [
    "README.md",
    *sorted(
        path.relative_to(ROOT).as_posix()
        for top in ROOT.iterdir()
        if top.is_dir() and not top.name.startswith(".")
        for path in top.rglob("README.md")
    ),
    *sorted(path.relative_to(ROOT).as_posix() for path in (ROOT / "docs").rglob("*.md")),
]
#: Inline code (`...`) and fenced blocks (```...```).
_CODE = re.compile(r"```[^\n]*\n(.*?)```|(?<!`)`([^`\n]+)`(?!`)", re.S)
_TRAILING = ",;:.)]}'\""
_LEADING = "([{'\""


def quoted_paths(text: str, tops: set[str]) -> list[str]:
    """The words of the quoted code in ``text`` that name a path of this repository: they
    start with one of its top-level entries (``flows/``, ``deploy/``, ``tests/``, ...)."""
    found = []
    for block, inline in _CODE.findall(text):
        for word in (block or inline).split():
            word = word.lstrip(_LEADING).rstrip(_TRAILING)
            first = word.split("/", 1)[0]
            if "/" in word and first in tops:
                found.append(word.rstrip("/"))
    return found


def missing(readme: str, paths: list[str]) -> list[str]:
    """The ``paths`` (globs allowed) that match nothing, from the root or the README's folder."""
    here = (ROOT / readme).parent
    return [p for p in paths if not any(next(base.glob(p), None) for base in {ROOT, here})]


def top_entries() -> set[str]:
    return {p.name for p in ROOT.iterdir() if p.name not in {".git", ".venv"}}


@pytest.mark.parametrize("readme", READMES)
def test_every_repository_path_a_readme_quotes_exists(readme):
    paths = quoted_paths((ROOT / readme).read_text(), top_entries())
    assert missing(readme, paths) == []


def test_the_readmes_are_all_checked():
    assert {"README.md", "deploy/k8s/README.md", "deploy/compose/README.md"} <= set(READMES)


def test_the_check_finds_a_wrong_path_and_ignores_what_is_not_one():
    text = (
        "See `tests/test_deploy.py` and `flows/metrics.py`, `flows/service/observe/metrics.py`,\n"
        "`flows/service/*/_*.pyx`, `deploy/k8s/` (the manifests), `kafka-consumer-groups.sh`,\n"
        "`/var/lib/tsi`, `experiment/unit`, `DIR/shards/`.\n\n"
        "```sh\ndeploy/kafka/start.sh /tmp/kafka-data   # deploy/kafka/nothing.sh\n```\n"
    )
    paths = quoted_paths(text, top_entries())
    assert missing("README.md", paths) == [
        "tests/test_deploy.py",
        "flows/metrics.py",
        "deploy/kafka/nothing.sh",
    ]
    assert "experiment/unit" not in paths and "/var/lib/tsi" not in paths
