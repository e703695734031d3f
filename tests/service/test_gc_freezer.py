"""The collector's freezer (flows.service.runtime.gc_freezer): what is alive at a tick is frozen,
every ``thaw_every`` a tick hands it back, and a cycle frozen by mistake is collected
after the thaw. Ticks are called directly: nothing here depends on timing."""

import gc
import weakref

from flows.service.runtime.gc_freezer import Freezer, start_freezing


class Node:
    """An object in a cycle with itself, watched by a weak reference."""

    def __init__(self) -> None:
        self.other = self


def test_a_tick_freezes_what_is_alive_and_every_thaw_every_a_tick_thaws():
    gc.unfreeze()
    freezer = Freezer(interval=1.0, thaw_every=3.0)
    try:
        cycle = Node()
        watch = weakref.ref(cycle)
        freezer.tick()
        assert gc.get_freeze_count() > 0
        del cycle
        gc.collect()
        assert watch() is not None  # frozen: the cyclic collector does not walk it
        freezer.tick()
        gc.collect()
        assert watch() is not None and gc.get_freeze_count() > 0
        freezer.tick()  # the third: a thaw
        assert gc.get_freeze_count() == 0
        gc.collect()
        assert watch() is None  # collected once thawed
    finally:
        gc.unfreeze()


def test_frozen_objects_are_still_freed_by_reference_counting():
    gc.unfreeze()
    try:
        plain = Node()
        plain.other = None  # no cycle
        watch = weakref.ref(plain)
        Freezer(interval=1.0, thaw_every=60.0).tick()
        assert gc.get_freeze_count() > 0
        del plain
        assert watch() is None
    finally:
        gc.unfreeze()


def test_the_thread_ticks_and_a_second_start_stops_the_first():
    first = start_freezing(0.01, thaw_every=3600)
    try:
        assert not first.stopped.wait(0.5) and first.ticks > 0
        second = start_freezing(0.01, thaw_every=3600)
        assert first.stopped.is_set() and not second.stopped.is_set()
        second.stop()
    finally:
        first.stop()
        gc.unfreeze()
