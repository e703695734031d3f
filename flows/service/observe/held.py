"""How many instances this process holds live (built objects, what a user costs while
active) and resting (packed bytes), read when Prometheus scrapes: ``tsi_instances_live``
and ``tsi_instances_resting``. ``tsi_instances`` counts both, by experiment.

Every shard store is counted (``hold``) while it exists:

>>> class Store:
...     def __init__(self, live, resting):
...         self.instances, self.resting = dict.fromkeys(range(live)), [None] * resting
>>> store = Store(3, 5); hold(store)
>>> counts() >= (3, 5)
True
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator, Sized
from typing import Any, Protocol

from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily, Metric


class _Store(Protocol):
    instances: Sized
    resting: Sized


_stores: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.Lock()  # the scrape's thread reads while workers build stores


def hold(store: _Store) -> None:
    """Count ``store``'s instances until it is gone."""
    with _lock:
        _stores.add(store)


def counts() -> tuple[int, int]:
    """The live and the resting instances of every store held."""
    with _lock:
        stores = list(_stores)
    return sum(len(s.instances) for s in stores), sum(len(s.resting) for s in stores)


class _HeldCollector:
    def describe(self) -> list[Metric]:
        return list(self._families(0, 0))

    def collect(self) -> Iterator[Metric]:
        return self._families(*counts())

    @staticmethod
    def _families(live: int, resting: int) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "tsi_instances_live", "Instances this process holds built (active users).", live
        )
        yield GaugeMetricFamily(
            "tsi_instances_resting", "Instances this process holds as packed bytes.", resting
        )


REGISTRY.register(_HeldCollector())
