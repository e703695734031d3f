"""The cyclic garbage collector kept off the service's long-lived state.

CPython's full collections walk every tracked object, and a service holding many
instances has many that live for hours. ``freeze_long_lived`` freezes what is alive at start
(modules, registry, flow: they live as long as the process) and sets the young
generation's threshold; a daemon thread then freezes what has lived a second, every
second, so a full collection walks only what is younger. Frozen objects are still freed
by reference counting, as every instance, ticket and event of the service is (they hold
no cycles: ``flows.service.wire._records``). A cycle among frozen objects would wait for the
thaw, every ``THAW_EVERY`` seconds, when the next full collection walks everything once.

The freezer cuts the GC's time by a third to a half and most of its full collections
(bench/RESULTS.md, "the GC off long-lived state, the internal topic in C").

>>> freezer = start_freezing(0.01, thaw_every=3600)
>>> frozen = gc.get_freeze_count(); _ = [[] for _ in range(100)]; kept = [[]]
>>> freezer.stopped.wait(0.2) or gc.get_freeze_count() > frozen
True
>>> freezer.stop(); gc.unfreeze()
"""

from __future__ import annotations

import gc
import threading

#: Allocations between two young-generation collections (CPython's default: 700). A batch
#: of 1,000 events makes ~10 objects each, so the default collected the same young
#: batch many times over. A higher threshold buys throughput and lengthens the pauses:
#: 3,000 keeps nearly all of 10,000's throughput with shorter pauses (bench/RESULTS.md,
#: "shards and batches").
YOUNG_COLLECTION_THRESHOLD = 3_000
#: Seconds between two freezes of what is alive, and between two thaws.
FREEZE_EVERY = 1.0
THAW_EVERY = 600.0


class Freezer(threading.Thread):
    """The daemon thread that freezes every ``interval`` seconds and thaws every
    ``thaw_every`` seconds until ``stop()``."""

    def __init__(self, interval: float, thaw_every: float) -> None:
        super().__init__(name="tsi-gc-freeze", daemon=True)
        self.interval = interval
        self.ticks_per_thaw = max(1, round(thaw_every / interval))
        self.ticks = 0
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            self.tick()

    def tick(self) -> None:
        """One interval's work: freeze what is alive, or thaw (every ``thaw_every``)."""
        self.ticks += 1
        if self.ticks % self.ticks_per_thaw:
            gc.freeze()
        else:
            gc.unfreeze()  # the next full collection walks everything once

    def stop(self) -> None:
        self.stopped.set()


_freezer: Freezer | None = None


def start_freezing(interval: float = FREEZE_EVERY, thaw_every: float = THAW_EVERY) -> Freezer:
    """Freeze what is alive every ``interval`` seconds from a daemon thread (see the
    module); a second call stops the first thread."""
    global _freezer
    if _freezer is not None:
        _freezer.stop()
    _freezer = Freezer(interval, thaw_every)
    _freezer.start()
    return _freezer


def freeze_long_lived() -> None:
    """Exempt everything alive now from cyclic GC scans, collect the young generation per
    ``YOUNG_COLLECTION_THRESHOLD`` allocations, and from now on freeze what has lived
    ``FREEZE_EVERY`` seconds (``start_freezing``)."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, older, oldest)
    start_freezing()
