"""The pause of file mode: ``force_arm = ARM`` written into the experiment's table of the
registry file, atomically (a new file renamed over the old one), with the reason as a
comment. The rest of the file is kept as written. The service applies it when it reloads
the registry (``tsi run`` reloads on SIGHUP); the gateway rereads it on its own.

>>> import pathlib, tempfile
>>> path = pathlib.Path(tempfile.mkdtemp()) / "registry.toml"
>>> _ = path.write_text('[experiments.shop]\\narms = ["a", "b"]\\nforce_arm = "b"\\n')
>>> ForceArmInFile(path)("shop", "a", "latency breached")
>>> print(path.read_text(), end="")
[experiments.shop]
arms = ["a", "b"]
force_arm = "a"  # paused by a guardrail: latency breached
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

from flows.service.instances.registry import Registry

__all__ = ["ForceArmInFile"]

_TABLE = re.compile(r"\s*\[\s*([^\]]*?)\s*\]\s*(#.*)?")
_FORCE = re.compile(r"\s*force_arm\s*=")


def _table_name(line: str) -> str | None:
    """The name of the ``[experiments.NAME]`` table a header line opens, "" for another
    table, None for a line that opens none."""
    found = _TABLE.fullmatch(line)
    if found is None or line.lstrip().startswith("[["):
        return None
    head, dot, name = found.group(1).partition(".")
    if head.strip() != "experiments" or not dot:
        return ""
    name = name.strip()
    return json.loads(name) if name.startswith('"') else name


def forced(text: str, experiment: str, arm: str, reason: str) -> str:
    """``text`` with ``force_arm = arm`` in ``experiment``'s table (``ValueError`` when the
    file has no ``[experiments.NAME]`` table for it)."""
    lines = text.splitlines()
    comment = " ".join(reason.split())
    setting = f"force_arm = {json.dumps(arm)}  # paused by a guardrail: {comment}"
    start = next((i for i, line in enumerate(lines) if _table_name(line) == experiment), None)
    if start is None:
        raise ValueError(f"the registry has no [experiments.{experiment}] table to pause")
    end = next(
        (i for i in range(start + 1, len(lines)) if _table_name(lines[i]) is not None),
        len(lines),
    )
    for i in range(start + 1, end):
        if _FORCE.match(lines[i]):
            lines[i] = setting
            break
    else:
        lines.insert(start + 1, setting)
    return "\n".join(lines) + "\n"


class ForceArmInFile:
    """``Pause`` writing ``force_arm`` into the registry file at ``path``; the result is
    checked as a registry first: a file it cannot pause is a ``ValueError``, unchanged."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __call__(self, experiment: str, arm: str, reason: str) -> None:
        text = forced(self.path.read_text(encoding="utf-8"), experiment, arm, reason)
        paused = Registry.from_toml(text).get(experiment)
        if paused is None or paused.force_arm != arm:
            raise ValueError(f"the registry's [experiments.{experiment}] could not be paused")
        fd, name = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text)
            os.chmod(name, self.path.stat().st_mode & 0o7777)
            os.replace(name, self.path)
        except BaseException:
            Path(name).unlink(missing_ok=True)
            raise
