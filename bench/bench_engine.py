"""What the serving engine costs an event, stage by stage, without Kafka or Bytewax.

Run from the repository root (about a minute)::

    .venv/bin/python bench/bench_engine.py            # raw figures in bench/engine_results.json

The service's throughput is the stack's cost per event (Kafka clients, Bytewax, the
connectors; ``bench/bench_flow.py`` measures it with its ``stack_flow``) plus the
engine's. This bench times the engine alone, in this process, on the workload of
``bench_flow.py`` (10 arms, per-unit instances, 10,000 units; the combined ``events`` topic:
each request followed by its feedback; the two topics: all requests, then all feedback;
and ``feedback late``: the events topic with each feedback ``LATE`` requests after its
request, so that it finds its open ticket out of the caches, as a service's users who
answer after a while do), in batches of ``BATCH`` messages as one ``consume`` brings
them, through the same functions the dataflow's steps call:

- ``parse_and_route``: bytes to routed events, one item per key group, by shard
  (``flows.service.dataflow``, compiled lane);
- ``shards``: each key group's ``GroupLogic.on_batch``, each shard's events to it (their
  compiled event loop and
  instances, and the answers written as JSON keyed by instance, dead letters apart; the
  row ``shards, every instance revived`` puts every instance to rest after each shard call,
  as a service with one bandit per user sees most events: the user came back later; and
  ``revived, every answer expiring`` also lets each kept answer expire 0.5 s after
  its feedback, on a clock that runs 50 ms a batch (a unit's next event comes a second
  later on the events topic: its answer expires while it rests), with the shards'
  wake-ups served after each batch).

Two references are measured in the same run: ``orjson.loads`` of every message (decoding
alone), and the kernel's ``Bandit.select`` + ``update`` per request and feedback pair
(the algorithm alone, one bandit per unit). Beside them, what Bytewax's ``stateful_batch``
costs per call of a shard that does nothing (a flow through it against the same flow
through a ``map``, every shard once per activation), shared by the events
a shard call gets in the engine run. CPU time (``time.process_time``) of each
stage summed over the batches after a warm-up fifth; median of ``REPEATS`` interleaved
repeats, each on fresh shards; the cyclic GC set up as in the service's process
(``flows.service.runtime.gc_freezer.freeze_long_lived``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import bytewax.operators as op
import orjson
from bytewax.dataflow import Dataflow
from bytewax.operators import StatefulBatchLogic
from bytewax.testing import TestingSink, TestingSource, run_main

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from flow_plan import registry_toml  # noqa: E402
from flow_workload import feedback_value, loss_of, request_value, workload  # noqa: E402

from flows.service.dataflow import Guards, parse_and_route  # noqa: E402
from flows.service.instances.registry import LiveRegistry, Registry  # noqa: E402
from flows.service.observe.stream_clock import StreamClock  # noqa: E402
from flows.service.runtime.gc_freezer import YOUNG_COLLECTION_THRESHOLD, freeze_long_lived  # noqa: E402
from flows.service.shards.deadlines import WAKE_UP, WakeUpScheduler  # noqa: E402
from flows.service.shards.group_logic import GroupLogic  # noqa: E402
from flows.service.shards.logic import REST_AFTER, FlowContext  # noqa: E402
from flows.service.wire.events import Origin, parse_event, parse_feedback, parse_request  # noqa: E402
from flows.service.wire.keys import DEFAULT_SHARDS, group_of, shard_names  # noqa: E402
from tsi_core import Bandit  # noqa: E402

BATCH = 1000  # what one consume brings at most (the Kafka source's batch_size)
UNITS = 10_000
REPEATS = 5
STAGES = ("parse_and_route", "shards")
AT_REST = "shards, every instance revived (rest_after 0)"
EXPIRING = "shards, revived, every answer expiring (retry_window 0.5 s)"
STREAM_STEP = 0.05  # seconds a batch on the clock, when answers expire
TOPICS = {"events": {"events": "ev"}, "two topics": {"requests": "rq", "feedback": "fb"}}
LATE = 20_000  # requests between a request and its feedback in the mode "feedback late"
MODES = (*TOPICS, "feedback late")


def messages(mode: str, pairs: int) -> list[tuple[bytes, str]]:
    """(bytes, kind) of ``pairs`` requests and their feedback, in the mode's order."""
    if mode == "feedback late":
        return [(raw, "events") for raw in late_feedback(pairs, LATE)]
    kinds = {"ev": "events", "rq": "requests", "fb": "feedback"}
    return [(raw, kinds[topic]) for topic, _, raw in workload(TOPICS[mode], pairs, UNITS)]


def late_feedback(pairs: int, late: int) -> list[bytes]:
    """The combined topic's events with each request's feedback ``late`` requests after
    it: every instance holds ``late / UNITS`` open tickets on average, and its feedback
    finds them out of the caches (a service whose users answer after a while).

    >>> [orjson.loads(raw)["request_id"] for raw in late_feedback(3, 1)]
    ['r0', 'r1', 'r0', 'r2', 'r1', 'r2']
    """
    out = []
    for i in range(pairs + late):
        if i < pairs:
            out.append(request_value(f"u{i % UNITS}", f"r{i}", typed=True))
        if 0 <= i - late < pairs:
            j = i - late
            out.append(feedback_value(f"u{j % UNITS}", f"r{j}", loss_of(j), typed=True))
    return out


def engine_run(
    msgs: list[tuple[bytes, str]],
    rest_after: float = REST_AFTER,
    retry_window: float | None = None,
) -> tuple[dict[str, float], int, int]:
    """CPU seconds per stage over the messages after the first fifth, fresh shards; the
    number of events timed and of shard calls they made. ``rest_after`` 0: every instance
    is put to rest after each shard call, so each event revives its instance (one bandit
    per user whose users come back after a while). ``retry_window``: the kept answers
    expire after that many seconds, on a clock that runs ``STREAM_STEP`` a batch; the
    shards' due wake-ups are served after each batch, in the shards stage."""
    parsers = {"events": parse_event, "requests": parse_request, "feedback": parse_feedback}
    clock = [time.time()]
    context = engine_context(clock, rest_after, retry_window)
    shards: dict[str, GroupLogic] = {}
    guards, now = Guards(), clock[0]
    spent = dict.fromkeys(STAGES, 0.0)
    timed = calls = 0
    warm = len(msgs) // 5 // BATCH * BATCH
    for start in range(0, len(msgs), BATCH):
        chunk = msgs[start : start + BATCH]
        kind = chunk[0][1]
        if retry_window is not None:
            clock[0] = now + start // BATCH * STREAM_STEP
        batch = [(raw, Origin(kind, 0, start + i, now)) for i, (raw, _) in enumerate(chunk)]
        t0 = time.process_time()
        items, dead = parse_and_route(parsers[kind], guards, context.registry, batch)
        t1 = time.process_time()
        serve(shards, context, items, woken=retry_window is not None)
        t2 = time.process_time()
        if dead:
            raise RuntimeError(f"the workload made dead letters: {dead[:3]}")
        if start >= warm:
            for stage, seconds in zip(STAGES, (t1 - t0, t2 - t1), strict=True):
                spent[stage] += seconds
            timed += len(batch)
            calls += len(items)
    return spent, timed, calls


def engine_context(
    clock: list[float], rest_after: float, retry_window: float | None
) -> FlowContext:
    """The shards' context: the workload's registry (with ``retry_window`` when given),
    wake-ups from a scheduler of its own, no snapshots; on stream time, or with a
    ``retry_window`` all on ``clock[0]``, which the run moves."""
    window = "" if retry_window is None else f"retry_window = {retry_window}\n"
    return FlowContext(
        LiveRegistry(Registry.from_toml(registry_toml() + window)),
        clock=lambda: clock[0],
        snapshots=False,
        stream=StreamClock() if retry_window is None else None,
        wake_ups=WakeUpScheduler(),
        rest_after=rest_after,
    )


def serve(groups: dict[str, GroupLogic], context: FlowContext, items: list, woken: bool) -> None:
    """Each key group's ``on_batch`` of its shards' events (groups built on first use),
    then, when ``woken``, a wake-up for every shard whose wake-up is due on the context's
    clock, to its group."""
    for group, parts in items:
        logic = groups.get(group)
        if logic is None:
            logic = groups[group] = GroupLogic(context)
        logic.on_batch([parts])
    if woken:
        for shard in context.wake_ups.queue().due(context.clock()):
            groups[group_of(shard)].on_batch([[(shard, [(shard, None, WAKE_UP)])]])


def json_run(msgs: list[tuple[bytes, str]]) -> float:
    """CPU seconds of ``orjson.loads`` over the same messages after the first fifth."""
    timed = msgs[len(msgs) // 5 :]
    t0 = time.process_time()
    for raw, _ in timed:
        orjson.loads(raw)
    return time.process_time() - t0


def kernel_run(pairs: int) -> float:
    """CPU seconds of select + update for ``pairs`` rounds over ``UNITS`` bandits (10 arms),
    after the first fifth."""
    bandits = [Bandit(10) for _ in range(UNITS)]
    warm = pairs // 5
    t0 = 0.0
    for i in range(pairs):
        if i == warm:
            t0 = time.process_time()
        bandit = bandits[i % UNITS]
        bandit.update(bandit.select(None, (i * 0.618034) % 1.0), (i * 7919 % 1000) / 10.0)
    return time.process_time() - t0


class _Echo(StatefulBatchLogic):
    """A shard that does nothing: what Bytewax's stateful step costs a call by itself."""

    def on_batch(self, values: list) -> tuple[list, bool]:
        return values, StatefulBatchLogic.RETAIN

    def snapshot(self) -> None:
        return None


def bytewax_run(items: int, stateful: bool) -> float:
    """CPU seconds of a flow carrying ``items`` (shard, value) items, every shard once per
    activation, through a do-nothing ``stateful_batch`` (or, the baseline, a ``map``)."""
    flow = Dataflow("key_calls")
    keyed = [(shard_names(DEFAULT_SHARDS)[i % DEFAULT_SHARDS], i) for i in range(items)]
    stream = op.input("in", flow, TestingSource(keyed, batch_size=DEFAULT_SHARDS))
    if stateful:
        stream = op.stateful_batch("shards", stream, lambda _: _Echo())
    else:
        stream = op.map("same", stream, lambda kv: kv)
    op.output("out", stream, TestingSink([]))
    t0 = time.process_time()
    run_main(flow)
    return time.process_time() - t0


def measure(pairs: int, repeats: int) -> dict[str, Any]:
    """Per-event microseconds of every stage and reference, per mode: medians over repeats."""
    timed = 2 * pairs - 2 * pairs // 5
    runs: dict[str, list[float]] = {}

    def note(name: str, seconds: float, n: int) -> None:
        runs.setdefault(name, []).append(seconds / n * 1e6)

    corpus = {mode: messages(mode, pairs) for mode in MODES}
    freeze_long_lived()  # as the service's process does at start (the corpus is not walked)
    for _ in range(repeats):
        for mode, msgs in corpus.items():
            spent, events, calls = engine_run(msgs)
            runs.setdefault(f"{mode}/events per shard call", []).append(events / calls)
            for stage, seconds in spent.items():
                note(f"{mode}/{stage}", seconds, events)
            at_rest, events, _ = engine_run(msgs, rest_after=0.0)
            note(f"{mode}/{AT_REST}", at_rest["shards"], events)
            expiring, events, _ = engine_run(msgs, rest_after=0.0, retry_window=0.5)
            note(f"{mode}/{EXPIRING}", expiring["shards"], events)
            note(f"{mode}/orjson.loads", json_run(msgs), timed)
        note("kernel", kernel_run(pairs), 2 * (pairs - pairs // 5))
        items = 200 * DEFAULT_SHARDS
        empty_calls = bytewax_run(items, stateful=True) - bytewax_run(items, stateful=False)
        note("bytewax per shard call", empty_calls, items)
        print(f"  repeat {len(runs['kernel'])} of {repeats} done", file=sys.stderr)
    return {name: {"median": statistics.median(v), "runs": v} for name, v in runs.items()}


def report(figures: dict[str, Any], pairs: int, repeats: int) -> str:
    us = {name: f["median"] for name, f in figures.items()}
    lines = [
        "## Engine cost per event, offline (`bench/bench_engine.py`)\n",
        f"- {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}; {pairs:,} requests and their feedback per mode, "
        f"{UNITS:,} units, batches of {BATCH}; CPU time, median of {repeats} interleaved "
        f"repeats (warm-up fifth not timed); load average {os.getloadavg()[0]:.2f}\n",
        f"| Stage (us/event) | events topic | two topics | events, feedback {LATE:,} late |",
        "|---|---:|---:|---:|",
    ]
    for stage in (*STAGES, AT_REST, EXPIRING, "orjson.loads"):
        cells = [f"{us[f'{mode}/{stage}']:.2f}" for mode in MODES]
        lines.append(f"| {stage} | " + " | ".join(cells) + " |")
    totals = [sum(us[f"{mode}/{stage}"] for stage in STAGES) for mode in MODES]
    lines.append("| **engine, all stages** | " + " | ".join(f"**{t:.2f}**" for t in totals) + " |")
    lines.append(
        "| kernel: select + update, per event | " + " | ".join([f"{us['kernel']:.2f}"] * 3) + " |"
    )
    floor = [us[f"{mode}/orjson.loads"] + us["kernel"] for mode in MODES]
    ratios = " | ".join(f"{t / f:.1f}" for t, f in zip(totals, floor, strict=True))
    lines.append(f"| engine / (orjson.loads + kernel) | {ratios} |")
    per_call = [us[f"{mode}/events per shard call"] for mode in MODES]
    lines.append("| events per shard call | " + " | ".join(f"{n:.1f}" for n in per_call) + " |")
    empty = us["bytewax per shard call"]
    shares = " | ".join(f"{empty / n:.2f}" for n in per_call)
    lines.append(f"| Bytewax's stateful step alone, per event ({empty:.2f} us a call) | {shares} |")
    return "\n".join(lines) + "\n"


def count_run(mode: str, pairs: int) -> None:
    """One engine run for an instruction counter (``--count``): what it does depends on
    nothing but the messages. No instance is put to rest (under valgrind the clock runs
    many times slower, and instances rest that a real run keeps live), and what lives at
    the start is frozen once, as ``freeze_long_lived`` does, without its timed freezer thread.
    Two runs of different ``pairs`` give the cost of the pairs between them (with a fixed
    ``PYTHONHASHSEED`` two runs of the same build agree closely: bench/RESULTS.md,
    "Figures behind the code")::

        export PYTHONHASHSEED=0
        valgrind --tool=callgrind .venv/bin/python bench/bench_engine.py --count events --pairs 2000
        valgrind --tool=callgrind .venv/bin/python bench/bench_engine.py --count events --pairs 8000
    """
    msgs = messages(mode, pairs)
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, older, oldest)
    engine_run(msgs, rest_after=1e9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=100_000, help="requests per mode")
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "engine_results.json")
    parser.add_argument("--count", choices=MODES, help="one run of MODE for valgrind, no output")
    args = parser.parse_args()
    if args.count:
        count_run(args.count, args.pairs)
        return
    figures = measure(args.pairs, args.repeats)
    print(report(figures, args.pairs, args.repeats))
    args.out.write_text(json.dumps({"pairs": args.pairs, "figures": figures}, indent=2) + "\n")


if __name__ == "__main__":
    main()
