"""A breach's pause through the experiments topic (``tsi serve --experiments-topic``): the
experiment paused to the holdout's arm like any other change, with its audit record
(who: ``guardrails: <reason>``), which every service that follows the topic applies.

>>> class Store:
...     def __init__(self): self.changed = []
...     def change(self, name, operation): self.changed.append(name)
>>> store = Store()
>>> PauseInStore(store)("checkout", "control", "latency_ms worse")
>>> store.changed
['checkout']
"""

from __future__ import annotations

import functools
from typing import Any

from flows.experiments import model

__all__ = ["PauseInStore", "store_registry"]


class PauseInStore:
    """``pause(experiment, arm, reason)`` as a change of ``store`` (an ``ExperimentStore``)."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def __call__(self, experiment: str, arm: str, reason: str) -> None:
        who = f"guardrails: {reason}"[: model.MAX_WHO]
        self.store.change(experiment, functools.partial(model.pause, who=who, arm=arm))


def store_registry(store: Any) -> Any:
    """The registry ``store`` serves now (the controller's view of the experiments)."""
    return model.registry_of(store.current().values())
