"""The Makefile's first step names the Python to install when ``PYTHON`` is not one the
dependencies ship for, before it makes anything; its list agrees with requires-python."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[2]


def fake_python(directory: Path, version: str) -> Path:
    """A script that prints ``version`` whatever it is asked, as ``python -c`` would."""
    script = directory / f"python{version}"
    script.write_text(f"#!/bin/sh\necho {version}\n")
    script.chmod(0o755)
    return script


def make(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), *arguments],
        capture_output=True,
        text=True,
        timeout=60,
    )


def supported() -> list[str]:
    text = (ROOT / "Makefile").read_text()
    return re.search(r"^SUPPORTED_PYTHONS := (.+)$", text, re.M).group(1).split()


def test_an_unsupported_python_stops_make_demo_first_with_one_line(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    done = make(f"PYTHON={fake_python(tmp_path, '3.13')}", f"VENV={venv}", "demo")
    assert done.returncode != 0
    told = [line for line in done.stderr.splitlines() if line.startswith("tsi needs")]
    assert len(told) == 1, done.stderr
    assert "is 3.13" in told[0]
    assert f"make PYTHON=python{supported()[-1]} demo" in told[0]
    assert not venv.exists()
    assert done.stdout == ""


def test_a_missing_python_is_named(tmp_path: Path) -> None:
    done = make(f"PYTHON={tmp_path / 'absent'}", "python-version")
    assert done.returncode != 0
    assert "absent is not found" in done.stderr


def test_every_supported_python_passes_the_check(tmp_path: Path) -> None:
    for version in supported():
        done = make(f"PYTHON={fake_python(tmp_path, version)}", "python-version")
        assert done.returncode == 0, (version, done.stderr)


def test_the_makefile_list_is_requires_python() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    allowed = SpecifierSet(pyproject["project"]["requires-python"])
    listed = supported()
    assert all(f"{version}.0" in allowed for version in listed)
    major, lowest = map(int, listed[0].split("."))
    highest = int(listed[-1].split(".")[1])
    assert f"{major}.{lowest - 1}.0" not in allowed
    assert f"{major}.{highest + 1}.0" not in allowed
    assert len(listed) == highest - lowest + 1
