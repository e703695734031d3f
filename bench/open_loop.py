"""Open-loop latency: requests scheduled at intended times, latency counted from them.

A closed-loop load generator times each request from the moment it actually sent it: when
the generator stalls (its host busy, a GC, a full queue), the requests it should have sent
during the stall go out late and are timed from then, so the stall hides, and so does the
service's share of it (coordinated omission). Here request k of a run at ``rate`` per
second is due at ``start + k / rate``; a sender that falls behind sends the late requests
at once, never skips one, and each request's latency is its answer's arrival minus its
intended time. A request never answered counts as infinitely slow, so it weighs on the
percentiles instead of leaving them. Percentiles are nearest-rank: the value below which
at least q% of the requests lie, without interpolation.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from typing import Any


def schedule(
    rate: float,
    seconds: float,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[tuple[int, float]]:
    """``(k, intended time)`` for k = 0 .. rate x seconds - 1, each yielded no earlier than
    its intended time ``start + k / rate`` (``start``: the clock at the first call); late
    ones are yielded at once, none skipped.

    >>> now = [0.0]
    >>> [(k, t) for k, t in schedule(4, 1, clock=lambda: now[0], sleep=lambda d: None)]
    [(0, 0.0), (1, 0.25), (2, 0.5), (3, 0.75)]
    """
    n = round(rate * seconds)
    start = clock()
    for k in range(n):
        due = start + k / rate
        delay = due - clock()
        if delay > 0:
            sleep(delay)
        yield k, due


def nearest_rank(values: list[float], q: float) -> float:
    """The q-th percentile (0 < q <= 100) of ``values`` by nearest rank (sorted or not;
    ``inf`` allowed).

    >>> nearest_rank([5.0, 1.0, 3.0, 2.0, 4.0], 50)
    3.0
    >>> nearest_rank([1.0, 2.0, float("inf")], 99)
    inf
    """
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


PERCENTILES = (50, 90, 99, 99.9)


def figures(
    measured: list[str],
    intended: dict[str, float],
    sent: dict[str, float],
    received: dict[str, float],
    slow_ms: float = 50.0,
) -> dict[str, Any]:
    """The latency figures of the ``measured`` requests (ids), in ms.

    ``intended``, ``sent``, ``received``: by request id, its intended send time, its actual
    send time and its answer's arrival (seconds, one clock). Open loop: ``p50_ms`` ..
    ``max_ms`` from the intended times, an unanswered request ``inf``. For comparison,
    ``closed_loop_p50_ms`` / ``closed_loop_p99_ms``: the answered ones from their actual
    send (what a closed-loop generator would report), and the sender's lag behind its
    schedule (``sender_max_lag_ms``, ``sender_late_share``: sent over 1 ms late).
    """
    if not measured:
        raise ValueError("no measured request")
    open_ms = [
        (received[rid] - intended[rid]) * 1e3 if rid in received else math.inf for rid in measured
    ]
    answered = [rid for rid in measured if rid in received]
    closed_ms = [(received[rid] - sent[rid]) * 1e3 for rid in answered]
    lag_ms = [(sent[rid] - intended[rid]) * 1e3 for rid in measured]
    out: dict[str, Any] = {
        f"p{q:g}_ms".replace(".", "_"): nearest_rank(open_ms, q) for q in PERCENTILES
    }
    finite = [x for x in open_ms if math.isfinite(x)]
    out.update(
        {
            "max_ms": max(open_ms),
            "mean_ms": sum(finite) / len(finite) if finite else math.inf,
            "sent": len(measured),
            "answered": len(answered),
            "share_over_slow": sum(x > slow_ms for x in open_ms) / len(open_ms),
            "closed_loop_p50_ms": nearest_rank(closed_ms, 50) if closed_ms else math.inf,
            "closed_loop_p99_ms": nearest_rank(closed_ms, 99) if closed_ms else math.inf,
            "sender_max_lag_ms": max(lag_ms),
            "sender_late_share": sum(x > 1.0 for x in lag_ms) / len(lag_ms),
        }
    )
    return out


def timeline(
    measured: list[str], intended: dict[str, float], received: dict[str, float], t0: float
) -> list[list[float]]:
    """Per second since ``t0`` (by intended time): [second, requests, answered, p50 ms of
    the answered, slowest ms (inf when one is unanswered)]."""
    by_second: dict[int, list[float]] = {}
    for rid in measured:
        ms = (received[rid] - intended[rid]) * 1e3 if rid in received else math.inf
        by_second.setdefault(int(intended[rid] - t0), []).append(ms)
    rows = []
    for second in sorted(by_second):
        values = by_second[second]
        finite = [x for x in values if math.isfinite(x)]
        p50 = nearest_rank(finite, 50) if finite else math.inf
        rows.append([second, len(values), len(finite), p50, max(values)])
    return rows
