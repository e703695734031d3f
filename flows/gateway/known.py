"""What the gateway knows of the experiments: the service's registry file, so that a call
naming an experiment or an arm the registry lacks is refused at once (422), not accepted
and refused later in the dead-letter topic. A request id the service has not answered yet
stays asynchronous: only the service knows it.

The file is read again when it changes (its modification time, looked at most once a
second); a version that does not load is logged and the last good one stays.

>>> import pathlib, tempfile
>>> path = pathlib.Path(tempfile.mkdtemp()) / "registry.toml"
>>> _ = path.write_text('[experiments.shop]\\narms = ["a", "b"]')
>>> known = Known(path)
>>> known.refusal({"experiment": "shop", "arm": "b"}) is None
True
>>> known.refusal({"experiment": "shop", "arm": "z"})
('unknown_arm', "experiment 'shop' has no arm 'z', arms ['a', 'b']")
>>> known.refusal({"experiment": "blog"})[0]
'unknown_experiment'
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from flows.service.instances.registry import Registry, RegistryError

__all__ = ["Known"]

log = logging.getLogger(__name__)

#: Seconds between two looks at the registry file's modification time.
LOOK_EVERY = 1.0


class Known:
    """The registry at ``path`` (``RegistryError`` when it does not load at the start)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.registry = Registry.load(self.path)
        self._stamp = self._modified()
        self._looked = time.monotonic()

    def refusal(self, body: dict[str, Any]) -> tuple[str, str] | None:
        """(reason, detail) when ``body`` names an experiment the registry lacks, or an
        ``arm`` (a name or an index) that experiment lacks; None otherwise."""
        experiment = self.current().get(body["experiment"])
        if experiment is None:
            return "unknown_experiment", f"no experiment {body['experiment']!r} in the registry"
        arm, arms = body.get("arm"), list(experiment.arms)
        if arm is None or arm in arms or (isinstance(arm, int) and 0 <= arm < len(arms)):
            return None
        return "unknown_arm", f"experiment {experiment.name!r} has no arm {arm!r}, arms {arms}"

    def current(self) -> Registry:
        """The registry, read again if the file changed (at most once a second)."""
        now = time.monotonic()
        if now - self._looked >= LOOK_EVERY:
            self._looked = now
            stamp = self._modified()
            if stamp != self._stamp:
                self._stamp = stamp
                try:
                    self.registry = Registry.load(self.path)
                except RegistryError as exc:
                    log.warning("registry %s not reloaded, the last one stays: %s", self.path, exc)
        return self.registry

    def _modified(self) -> float | None:
        try:
            return self.path.stat().st_mtime
        except OSError:
            return None
