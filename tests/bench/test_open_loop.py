"""Open-loop latency (bench/open_loop.py): a stalled sender is counted, not hidden."""

from __future__ import annotations

import math

from bench.open_loop import figures, nearest_rank, schedule, timeline

RATE = 1000.0  # requests a second
SERVICE_MS = 1.0  # the service answers each request 1 ms after it is actually sent


def stalled_run(stall_at: float, stall_s: float, unanswered: int = 0):
    """10 s at RATE whose sender stops for ``stall_s`` at ``stall_at``: every request due
    in the stall goes out when it ends; the last ``unanswered`` are never answered."""
    ids = [f"r{k}" for k in range(int(RATE * 10))]
    intended = {rid: k / RATE for k, rid in enumerate(ids)}
    sent = {
        rid: (stall_at + stall_s if stall_at <= t < stall_at + stall_s else t)
        for rid, t in intended.items()
    }
    received = {rid: t + SERVICE_MS / 1e3 for rid, t in sent.items()}
    for rid in ids[len(ids) - unanswered :]:
        del received[rid]
    return ids, intended, sent, received


def test_a_stalled_sender_shows_in_the_open_loop_tail_not_in_the_closed_loop_one():
    ids, intended, sent, received = stalled_run(stall_at=5.0, stall_s=0.2)
    f = figures(ids, intended, sent, received)
    # closed loop: every request answered 1 ms after it went out, the stall invisible
    assert math.isclose(f["closed_loop_p99_ms"], SERVICE_MS)
    # open loop: the 200 requests due in the stall waited up to 200 ms (2% of 10,000)
    assert f["p99_ms"] > 100.0
    assert math.isclose(f["max_ms"], 200.0 + SERVICE_MS)
    assert math.isclose(f["p50_ms"], SERVICE_MS)
    assert math.isclose(f["sender_max_lag_ms"], 200.0)
    assert math.isclose(f["sender_late_share"], 0.02, abs_tol=1e-4)  # 199 or 200 over 1 ms
    assert f["answered"] == f["sent"] == len(ids)


def test_an_unanswered_request_counts_as_infinitely_slow():
    ids, intended, sent, received = stalled_run(stall_at=5.0, stall_s=0.0, unanswered=200)
    f = figures(ids, intended, sent, received)
    assert f["answered"] == len(ids) - 200
    assert f["p99_ms"] == math.inf  # 2% unanswered: beyond the 99th percentile
    assert math.isclose(f["p90_ms"], SERVICE_MS)
    assert math.isclose(f["closed_loop_p99_ms"], SERVICE_MS)  # closed loop drops them
    assert f["share_over_slow"] == 0.02
    rows = timeline(ids, intended, received, 0.0)
    assert rows[-1][:3] == [9, 1000, 800] and rows[-1][4] == math.inf


def test_nearest_rank_takes_a_value_of_the_list_at_or_above_the_share():
    values = [float(x) for x in range(1, 101)]  # 1 .. 100
    assert nearest_rank(values, 99) == 99.0
    assert nearest_rank(values, 99.9) == 100.0
    assert nearest_rank(values, 50) == 50.0
    assert nearest_rank([7.0], 99) == 7.0


def test_schedule_sends_late_requests_at_once_and_skips_none():
    now = [0.0]
    slept: list[float] = []

    def sleep(d: float) -> None:
        slept.append(d)
        now[0] += d

    out = []
    for k, due in schedule(10, 1, clock=lambda: now[0], sleep=sleep):
        out.append((k, due, now[0]))
        if k == 2:
            now[0] += 0.35  # the sender stalls after request 2
    assert [k for k, _, _ in out] == list(range(10))
    assert [due for _, due, _ in out] == [k / 10 for k in range(10)]
    # requests 3..5 were due during the stall: sent at once when it ended, at 0.55
    assert [round(at, 6) for _, _, at in out[3:6]] == [0.55, 0.55, 0.55]
    assert all(at >= due for _, due, at in out)
