"""What the shards' logs cost: snapshot bytes per epoch, restart time, memory per instance.

Run from the repository root::

    .venv/bin/python bench/bench_shards.py --quick      # 5 x 10^4 instances (~1 min)
    .venv/bin/python bench/bench_shards.py              # 10^6 instances (~10 min)

No Bytewax: ``DEFAULT_SHARDS`` (128) ``ShardLogic`` objects (``flows.service.shards.logic``),
one per shard, are built with ``logic_builder(..., store=DIR)`` and fed directly, events grouped
per shard (at most ``PER_CALL`` per ``on_batch``, then ``notify_at`` as Bytewax calls it),
on a per-unit experiment of 10 arms (feedback_ttl 3600 s, retry_window 0: an answered
instance is idle as soon as the clock moves on and the shard is woken).

1. Snapshot bytes: N units each get a request and its feedback, then every shard
   snapshots (the bases: the whole state). An epoch then touches K random units (K in
   ``EPOCHS``: a request and its feedback each; then K requests left open; then the
   feedback closing them) and every shard snapshots: the bytes appended (sum over the
   shards of the growth of the log's end), per touched instance, against the bases.
2. Restart, in a fresh process per repeat (a restart is one): a new logic per shard with
   its last snapshot as resume state, median of ``--repeats``, with the open tickets and
   all idle; then a request to ``PROBES`` random restored instances (built on demand from
   their entries) and, once those are answered and packed again, a second request to
   the same instances, now live: the cost of the first event after a restart against an
   ordinary one.
3. Memory per instance, each configuration in a fresh process: N idle instances before
   any snapshot (live bandits), N idle instances snapshotted every ``MEMORY_CHUNK``
   units (packed, as epochs do), N instances each with an open ticket (snapshotted the
   same way), N instances each with ``ANSWERS`` answers kept for retries (of an
   experiment that keeps them an hour: a user back that many times; then woken until
   they rest), and the N resting entries of logics restarted from the logs of part 1.
   RSS growth (``/proc/self/statm`` after ``gc.collect()`` and ``malloc_trim(0)``) at N,
   and what tracemalloc counts (objects and numpy buffers, no allocator overhead or
   fragmentation) at most ``TRACED_MAX`` instances.

Markdown on stdout, raw figures in ``bench/shards_results.json``.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from flows.service.instances.registry import Experiment, Registry
from flows.service.shards.logic import Routed, ShardLogic, logic_builder
from flows.service.shards.shard_store import LINGER
from flows.service.wire.events import Origin, parse_feedback, parse_request
from flows.service.wire.keys import DEFAULT_SHARDS, instance_key, shard_of

ARMS = ", ".join(f'"a{i}"' for i in range(10))
REGISTRY = Registry.from_toml(
    f"[experiments.bench]\narms = [{ARMS}]\nper_unit = true\n"
    "feedback_ttl = 3600\nretry_window = 0\n"
    f"[experiments.kept]\narms = [{ARMS}]\nper_unit = true\n"
    "feedback_ttl = 3600\nretry_window = 3600\n"
)
EXPERIMENT = REGISTRY["bench"]
KEPT = REGISTRY["kept"]  # its answers are kept an hour for retries
ANSWERS = 5  # answers kept per user in the memory configuration "answers"
PER_CALL = 1_000  # events per on_batch call
CHUNK = 256_000  # units parsed at once
MEMORY_CHUNK = 50_000  # units per snapshot in the memory processes
TRACED_MAX = 100_000  # instances of the tracemalloc runs
EPOCHS = (2_000, 20_000)
PROBES = 10_000
RESULTS = Path(__file__).with_name("shards_results.json")
MEMORY_KINDS = {
    "live": "idle, before any snapshot (live bandits)",
    "packed": "idle, snapshotted (packed bandits)",
    "open": "one open ticket each, snapshotted",
    "answers": f"{ANSWERS} answers kept for retries each (a user back {ANSWERS} times)",
    "resting": "restarted from the logs (resting entries)",
}
try:
    LIBC: ctypes.CDLL | None = ctypes.CDLL("libc.so.6")  # glibc: malloc_trim
except OSError:
    LIBC = None
Pairs = list[tuple[str, str]]  # (unit, request_id)
Markers = dict[str, dict[str, Any]]  # shard -> its last snapshot


class Clock:
    """The logics' clock: moved by hand."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class Fleet:
    """The shard logics of one flow, over one store directory."""

    def __init__(self, store: Path, clock: Clock, markers: Markers | None = None) -> None:
        self.clock = clock
        self.build = logic_builder(REGISTRY, clock=clock, store=store)
        markers = markers or {}
        self.logics: dict[str, ShardLogic] = {s: self.build(m) for s, m in markers.items()}

    def feed(self, by_shard: dict[str, list[Routed]]) -> float:
        """Hand each shard its events; the seconds spent in ``on_batch`` and ``notify_at``."""
        spent = 0.0
        for shard, routed in by_shard.items():
            logic = self.logics.get(shard) or self.logics.setdefault(shard, self.build(None))
            for at in range(0, len(routed), PER_CALL):
                started = time.perf_counter()
                activate(logic, routed[at : at + PER_CALL])
                logic.notify_at()  # as Bytewax asks after each activation
                spent += time.perf_counter() - started
        return spent

    def settle(self) -> None:
        """A second passes: kept answers (retry window 0) go, answered instances are idle."""
        self.clock.now += 1.0
        for logic in self.logics.values():
            logic.on_notify()
            logic.notify_at()

    def snapshot(self) -> Markers:
        return {shard: logic.snapshot() for shard, logic in self.logics.items()}

    def held(self) -> tuple[int, int]:
        """(instances built, resting entries) over all shards."""
        logics = self.logics.values()
        return sum(len(x.store.instances) for x in logics), sum(
            len(x.store.resting) for x in logics
        )


def activate(logic: ShardLogic, events: list[Routed]) -> None:
    """One Bytewax activation of a shard. Logics with ``handle`` take Bytewax's batches
    (a list of lists) in ``on_batch``; older ones the events themselves."""
    logic.on_batch([events] if hasattr(logic, "handle") else events)


def unit_of(i: int) -> str:
    return f"u{i}"


def routed(pairs: Pairs, kind: str, experiment: Experiment = EXPERIMENT) -> dict[str, list[Routed]]:
    """Requests (or feedback) of ``pairs``, parsed and grouped by shard."""
    parse = parse_request if kind == "request" else parse_feedback
    name = experiment.name
    by_shard: dict[str, list[Routed]] = {}
    for seq, (unit, rid) in enumerate(pairs):
        body: dict[str, Any] = {"experiment": name, "unit": unit, "request_id": rid}
        if kind == "feedback":
            body["loss"] = float(seq % 5)
        key = instance_key(name, unit)
        raw = bytes(memoryview(orjson.dumps(body)))  # exact size: orjson's buffer is larger
        event = parse(raw, Origin("bench", 0, seq))
        by_shard.setdefault(shard_of(key), []).append((key, experiment, event))
    return by_shard


def serve(fleet: Fleet, pairs: Pairs, feedback: bool, experiment: Experiment = EXPERIMENT) -> float:
    """Requests (and their feedback) of ``pairs`` in chunks; the seconds in the logics."""
    spent = 0.0
    for at in range(0, len(pairs), CHUNK):
        chunk = pairs[at : at + CHUNK]
        spent += fleet.feed(routed(chunk, "request", experiment))
        if feedback:
            spent += fleet.feed(routed(chunk, "feedback", experiment))
    if feedback:
        fleet.settle()
    return spent


# --------------------------------------------------------- 1. snapshot bytes
def ends(markers: Markers) -> dict[str, tuple[int, int]]:
    return {s: (m["store"]["gen"], m["store"]["end"]) for s, m in markers.items() if m}


def timed_snapshot(fleet: Fleet) -> tuple[Markers, float]:
    started = time.perf_counter()
    markers = fleet.snapshot()
    return markers, time.perf_counter() - started


def epoch(fleet: Fleet, before: Markers, pairs: Pairs, feedback: bool) -> tuple[Markers, dict]:
    """One epoch touching ``pairs``' units; the new markers and what the epoch appended."""
    spent = serve(fleet, pairs, feedback)
    markers, snap = timed_snapshot(fleet)
    old, new = ends(before), ends(markers)
    assert all(new[s][0] == old[s][0] for s in new), "a log compacted during the epoch"
    grown = [new[s][1] - old[s][1] for s in new if new[s] != old[s]]
    figures = {
        "touched": len(pairs),
        "feedback": feedback,
        "appended_bytes": sum(grown),
        "bytes_per_instance": sum(grown) / len(pairs),
        "shards_written": len(grown),
        "events_s": len(pairs) * (2 if feedback else 1) / spent,
        "snapshot_s": snap,
    }
    return markers, figures


def build_state(fleet: Fleet, n: int) -> tuple[Markers, dict]:
    """N units served once, answered and idle, then the bases."""
    spent = serve(fleet, [(unit_of(i), "r0") for i in range(n)], feedback=True)
    markers, snap = timed_snapshot(fleet)
    total = sum(end for _, end in ends(markers).values())
    figures = {"instances": n, "events_s": 2 * n / spent, "snapshot_s": snap}
    return markers, figures | {"base_bytes": total, "base_bytes_per_instance": total / n}


def snapshot_part(fleet: Fleet, n: int, rng: random.Random) -> tuple[Markers, dict, Pairs]:
    """The bases, then epochs with feedback and epochs leaving tickets open; the markers,
    the figures and the open tickets."""
    markers, base = build_state(fleet, n)
    rows = []
    for number, k in enumerate(EPOCHS):
        units = rng.sample(range(n), min(k, n))
        markers, row = epoch(fleet, markers, [(unit_of(i), f"e{number}") for i in units], True)
        rows.append(row)
    opened = rng.sample(range(n), min(sum(EPOCHS), n))
    tickets: Pairs = []
    for number, k in enumerate(EPOCHS):
        pairs = [(unit_of(i), f"o{number}") for i in opened[len(tickets) : len(tickets) + k]]
        markers, row = epoch(fleet, markers, pairs, False)
        rows.append(row)
        tickets += pairs
    return markers, {"base": base, "epochs": rows}, tickets


# ----------------------------------------------------------------- 2. restart
def restart_child(state: str, n: int, store: Path, seed: int) -> dict:
    """In a fresh process: the seconds to rebuild every shard from the markers of
    ``state``; all idle, the probes too."""
    markers = json.loads((store / f"markers-{state}.json").read_text())
    gc.collect()
    started = time.perf_counter()
    fleet = Fleet(store, Clock(), markers)
    seconds = time.perf_counter() - started
    built, resting = fleet.held()
    out = {"seconds": seconds, "instances_built": built, "resting_entries": resting}
    return out | (probe(fleet, n, seed) if state == "idle" else {})


def probe(fleet: Fleet, n: int, seed: int) -> dict:
    """A request to random restored instances, then (answered, packed by a snapshot that
    the next restart cuts off) another to the same ones, now live."""
    units = random.Random(seed).sample(range(n), min(PROBES, n))
    first = timed_feed(fleet, routed([(unit_of(i), "probe") for i in units], "request"))
    fleet.feed(routed([(unit_of(i), "probe") for i in units], "feedback"))
    fleet.settle()
    fleet.snapshot()
    again = timed_feed(fleet, routed([(unit_of(i), "again") for i in units], "request"))
    return {"probes": len(units), "probe_restored_s": first, "probe_live_s": again}


def timed_feed(fleet: Fleet, events: dict[str, list[Routed]]) -> float:
    """``Fleet.feed`` from a clean slate: no garbage collection owed by what came before."""
    gc.collect()
    return fleet.feed(events)


def run_child(*args: str) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), *args]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def restarts(store: Path, state: str, markers: Markers, n: int, repeats: int) -> dict:
    """``repeats`` restarts from ``markers``, each in a fresh process; their medians."""
    (store / f"markers-{state}.json").write_text(json.dumps(markers))
    common = ["--instances", str(n), "--store", str(store)]
    runs = [
        run_child("--child", f"restart-{state}", *common, "--seed", str(r)) for r in range(repeats)
    ]
    median = statistics.median(r["seconds"] for r in runs)
    figures = {"runs": runs, "median_s": median, "instances_built": runs[0]["instances_built"]}
    figures["resting_entries"] = runs[0]["resting_entries"]
    figures["log_bytes"] = sum(end for _, end in ends(markers).values())
    figures["instances_s"] = (figures["instances_built"] + figures["resting_entries"]) / median
    if state == "idle":
        for key in ("probe_restored_s", "probe_live_s"):
            figures[key] = statistics.median(r[key] for r in runs)
        figures["probes"] = runs[0]["probes"]
    print(f"  restart {state}: {median:.2f} s", file=sys.stderr)
    return figures


# ------------------------------------------------------------------ 3. memory
def rss() -> int:
    """Resident bytes, once the garbage is collected and malloc gave back what it can."""
    gc.collect()
    if LIBC is not None:
        LIBC.malloc_trim(0)
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def memory_child(kind: str, n: int, store: Path, traced: bool) -> dict:
    """In a fresh process: the growth per instance of one configuration, of the RSS or
    (``traced``) of what tracemalloc counts."""
    routed([(unit_of(i), "warm") for i in range(MEMORY_CHUNK)], "request")  # warm allocator
    if traced:
        tracemalloc.start()
    measure = (lambda: tracemalloc.get_traced_memory()[0]) if traced else rss
    with tempfile.TemporaryDirectory() as scratch:
        gc.collect()
        base = measure()
        if kind == "resting":
            markers = json.loads((store / "markers-idle.json").read_text())
            fleet = Fleet(store, Clock(), markers)
        else:
            fleet = Fleet(Path(scratch), Clock())
            fill(fleet, n, kind)
        gc.collect()
        grown = measure() - base
        held = sum(fleet.held())
    return {"kind": kind, "traced": traced, "instances": held, "bytes": grown} | {
        "bytes_per_instance": grown / held
    }


def fill(fleet: Fleet, n: int, kind: str) -> None:
    """N instances of ``kind``: idle live bandits, idle packed, one open ticket each, or
    ``ANSWERS`` kept answers each (then every shard woken until what it saved rests)."""
    for at in range(0, n, MEMORY_CHUNK):
        units = [unit_of(i) for i in range(at, min(n, at + MEMORY_CHUNK))]
        if kind == "answers":
            for k in range(ANSWERS):
                serve(fleet, [(unit, f"r{k}") for unit in units], feedback=True, experiment=KEPT)
                fleet.snapshot()
            continue
        serve(fleet, [(unit, "r0") for unit in units], feedback=kind != "open")
        if kind != "live":
            fleet.snapshot()  # packs what the chunk touched, as an epoch's close does
    if kind == "answers":
        fleet.clock.now += LINGER  # users gone longer than LINGER rest
        for logic in fleet.logics.values():
            for _ in range(100_000):
                if not (logic.store.generations.saved or len(logic.store.lingering)):
                    break
                logic.on_notify()


def memory_part(n: int, store: Path) -> list[dict]:
    """Each configuration twice, in fresh processes: RSS at n, tracemalloc at most
    ``TRACED_MAX`` (it doubles the time; resting entries: all of the store)."""
    rows = []
    for kind in MEMORY_KINDS:
        for traced in (False, True):
            size = min(n, TRACED_MAX) if traced else n
            args = ["--child", kind, "--instances", str(size), "--store", str(store)]
            rows.append(run_child(*args, *(["--traced"] if traced else [])))
            what = f"{kind}{' traced' if traced else ''}"
            print(f"  memory {what}: {rows[-1]['bytes_per_instance']:.0f} B", file=sys.stderr)
    return rows


# ----------------------------------------------------------------- machine
def machine() -> dict:
    model = "unknown"
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "load_start": os.getloadavg(),
    }


# ------------------------------------------------------------------ report
def table(head: Iterable[str], rows: Iterable[Iterable[Any]]) -> str:
    head = list(head)
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def report_machine(m: dict, n: int, repeats: int) -> str:
    load = " / ".join(f"{x:.2f}" for x in m["load_start"])
    end = " / ".join(f"{x:.2f}" for x in m["load_end"])
    return (
        "## Shards: snapshot bytes, restart time, memory "
        f"({n:,} instances, {DEFAULT_SHARDS} shards)\n\n"
        f"- {m['date']}; CPU {m['cpu']} ({m['cores']} logical, {m['usable_cores']} usable)\n"
        f"- {m['platform']}; Python {m['python']}\n"
        f"- load average (1, 5, 15 min) {load} at the start, {end} at the end\n"
        f"- at most {PER_CALL:,} events per on_batch; restarts: median of {repeats} "
        f"fresh processes; total {m['total_s']:.0f} s\n"
        f"- command: `.venv/bin/python {m['argv']}`\n"
    )


def snapshot_row(label: str, row: dict) -> list[str]:
    return [
        label,
        f"{row['touched']:,}",
        f"{row['appended_bytes']:,}",
        f"{row['bytes_per_instance']:.1f}",
        str(row["shards_written"]),
        f"{row['snapshot_s']:.3f}",
        f"{row['events_s']:,.0f}",
    ]


def report_snapshots(part: dict) -> str:
    base = part["base"]
    first = {
        "touched": base["instances"],
        "appended_bytes": base["base_bytes"],
        "bytes_per_instance": base["base_bytes_per_instance"],
        "shards_written": DEFAULT_SHARDS,
    }
    rows = [snapshot_row("bases (the whole state)", base | first)]
    for row in part["epochs"]:
        what = "request + feedback" if row["feedback"] else "request, ticket left open"
        rows.append(snapshot_row("feedback closing them" if row.get("closing") else what, row))
    head = ["epoch", "instances touched", "bytes appended", "bytes / instance"]
    head += ["shards written", f"snapshot s ({DEFAULT_SHARDS} shards)", "events/s (on_batch)"]
    share = ", ".join(f"{r['appended_bytes'] / base['base_bytes']:.2%}" for r in part["epochs"])
    return (
        "### 1. Snapshot bytes per epoch\n\n"
        + table(head, rows)
        + f"\n\nEach epoch's bytes as a share of the bases, in order: {share}.\n"
    )


def report_restart(part: dict) -> str:
    rows = []
    for label, key in (("tickets open", "with_open_tickets"), ("all idle", "idle")):
        r = part[key]
        runs = " / ".join(f"{run['seconds']:.2f}" for run in r["runs"])
        rows.append(
            [
                label,
                f"{r['log_bytes'] / 2**20:,.1f}",
                f"{r['resting_entries']:,}",
                f"{r['instances_built']:,}",
                f"{r['median_s']:.2f}",
                runs,
                f"{r['instances_s']:,.0f}",
            ]
        )
    head = ["state", "log MiB read", "resting entries", "built at once", "median s", "runs s"]
    head.append("instances/s")
    idle = part["idle"]
    probes, restored, live = idle["probes"], idle["probe_restored_s"], idle["probe_live_s"]
    return (
        "### 2. Restart: every shard rebuilt from its marker (a fresh process each)\n\n"
        + table(head, rows)
        + f"\n\nFirst event (a request) to {probes:,} random instances after the restart:"
        f" {restored * 1e3:.0f} ms ({probes / restored:,.0f} events/s, "
        f"{restored / probes * 1e6:.1f} us each, the instance built from its entry); a second"
        f" request to the same instances once answered and packed: {live * 1e3:.0f} ms "
        f"({probes / live:,.0f} events/s, {live / probes * 1e6:.1f} us each). Medians.\n"
    )


def report_memory(rows: list[dict]) -> str:
    found = {(r["kind"], r["traced"]): r for r in rows}
    body = []
    for kind, label in MEMORY_KINDS.items():
        plain, traced = found[(kind, False)], found[(kind, True)]
        body.append(
            [
                label,
                f"{plain['instances']:,}",
                f"{plain['bytes'] / 2**20:,.1f}",
                f"{plain['bytes_per_instance']:.0f}",
                f"{traced['bytes_per_instance']:.0f} (at {traced['instances']:,})",
            ]
        )
    head = ["configuration", "instances", "RSS growth MiB", "RSS bytes / instance"]
    head += ["tracemalloc bytes / instance"]
    return (
        "### 3. Memory per instance (a fresh process each)\n\n"
        + table(head, body)
        + "\n\nRSS after gc.collect() and malloc_trim(0); tracemalloc counts the Python"
        " objects and numpy buffers alone (no allocator overhead, no fragmentation).\n"
    )


# -------------------------------------------------------------------- main
def run(n: int, repeats: int) -> dict:
    started, info = time.perf_counter(), machine()
    rng = random.Random(20261126)
    store = Path(tempfile.mkdtemp(prefix="bench_shards_"))
    try:
        fleet = Fleet(store, Clock())
        markers, snapshots, tickets = snapshot_part(fleet, n, rng)
        with_open = restarts(store, "open", markers, n, repeats)
        markers, closing = epoch(fleet, markers, tickets, True)
        snapshots["epochs"].append(closing | {"closing": True})
        del fleet
        idle = restarts(store, "idle", markers, n, repeats)
        memory = memory_part(n, store)
    finally:
        shutil.rmtree(store, ignore_errors=True)
    info |= {"load_end": os.getloadavg(), "total_s": time.perf_counter() - started}
    restart = {"with_open_tickets": with_open, "idle": idle}
    parts = {"snapshots": snapshots, "restart": restart, "memory": memory}
    return {"machine": info, "instances": n, "repeats": repeats} | parts


def child(args: argparse.Namespace, n: int) -> dict:
    if args.child.startswith("restart-"):
        return restart_child(args.child.removeprefix("restart-"), n, args.store, args.seed)
    return memory_child(args.child, n, args.store, args.traced)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--instances", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true", help="50,000 instances")
    parser.add_argument("--repeats", type=int, default=3)
    kinds = ["restart-open", "restart-idle", *MEMORY_KINDS]
    parser.add_argument("--child", choices=kinds, help=argparse.SUPPRESS)
    parser.add_argument("--store", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--traced", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    n = 50_000 if args.quick else args.instances
    if args.child:
        print(json.dumps(child(args, n)))
        return
    results = run(n, args.repeats)
    results["machine"]["argv"] = " ".join(["bench/bench_shards.py", *sys.argv[1:]])
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    parts = [
        report_machine(results["machine"], n, args.repeats),
        report_snapshots(results["snapshots"]),
        report_restart(results["restart"]),
        report_memory(results["memory"]),
    ]
    print("\n".join(parts))


if __name__ == "__main__":
    main()
