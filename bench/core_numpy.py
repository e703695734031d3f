"""The numpy implementation ``bench_core.py`` compares ``BatchBandit`` against: commit
``BEFORE`` extracted with ``git archive`` and imported as ``tsi_core_numpy``, or the figure
recorded in bench/RESULTS.md when it cannot be."""

from __future__ import annotations

import importlib
import io
import re
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the modules beside this one
from core_plan import BEFORE, RECORDED_NUMPY_BATCH, REPO


def extract_before(workdir: Path) -> Path:
    """``git archive BEFORE tsi_core`` as package ``tsi_core_numpy`` under ``workdir``."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", BEFORE, "tsi_core"],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(workdir, filter="data")
    package = workdir / "tsi_core_numpy"
    (workdir / "tsi_core").rename(package)
    for source in package.glob("*.py"):
        text = re.sub(r"\b(from|import) tsi_core\b", r"\1 tsi_core_numpy", source.read_text())
        source.write_text(text)
    return package


def load_before(workdir: Path) -> tuple[ModuleType | None, str]:
    """The numpy implementation of ``BEFORE`` importable beside ``tsi_core``, and a note."""
    try:
        extract_before(workdir)
    except (OSError, subprocess.CalledProcessError, tarfile.TarError, TypeError) as exc:
        detail = getattr(exc, "stderr", b"") or str(exc).encode()
        return None, f"git archive {BEFORE} failed: {detail.decode(errors='replace').strip()}"
    sys.path.insert(0, str(workdir))
    module = importlib.import_module("tsi_core_numpy")
    return module, f"measured in this run (git archive {BEFORE}, imported as tsi_core_numpy)"


def recorded_reference(repeats: int) -> dict[str, Any]:
    """Stand-in for ``numpy_batch_fixed`` when the old commit cannot be extracted."""
    return {
        "label": f"numpy BatchBandit Fixed() ({BEFORE}, recorded in bench/RESULTS.md)",
        "unit": "instance-rounds/s",
        "recorded": True,
        "rates": [RECORDED_NUMPY_BATCH] * repeats,
        "median": RECORDED_NUMPY_BATCH,
        "min": RECORDED_NUMPY_BATCH,
        "max": RECORDED_NUMPY_BATCH,
    }
