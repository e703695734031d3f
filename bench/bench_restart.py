"""Time to ``/ready`` of ``tsi run``: a fresh start, a restart with N instances, and a
restart after a lost recovery directory, each against the fresh start of the same run.

Run from the repository root::

    .venv/bin/python bench/bench_restart.py --instances 100000

On a real broker (``KAFKA_BOOTSTRAP_SERVERS``, else one started as the tests start theirs,
``flows.testing.kafka_broker``), with the defaults: the topics of ``tsi topics create``
(128 shards), recovery and the changelog on, one worker, the default snapshot interval.

1. fresh: an empty recovery directory and empty topics; the time to ``/ready`` (the
   reference). Then N requests, one per unit of a per-unit experiment (N instances),
   served; the service stopped (SIGTERM) once an epoch closed after the last of them.
2. restart: the same directory; the time to ``/ready``, and at that moment the shards
   restored against those held and the instances held (``tsi_shards_*``,
   ``tsi_instances``): all of them, or the start did not restore before ready.
3. lost: the directory deleted; the same, every shard rebuilt from the changelog.

Each time is from the process's start (its interpreter's start included); ``/ready``
needs a first epoch too (``--snapshot-every``), which the reference pays as well. The
results go to stdout as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from confluent_kafka import Producer  # noqa: E402

from flows.testing.kafka_broker import broker_session, free_port  # noqa: E402
from flows.testing.service_run import (  # noqa: E402
    create_topics,
    environment,
    gauges,
    start,
    stop,
    wait_ready,
    wait_served,
)

REGISTRY = '[experiments.e]\narms = ["a", "b", "c", "d"]\nper_unit = true\nfeedback_ttl = 3600\n'
COUNTS = ("tsi_shards_restored", "tsi_shards_held", "tsi_instances")


def produce(bootstrap: str, topic: str, n: int) -> None:
    """``n`` requests, one per unit: ``n`` instances."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i in range(n):
        value = json.dumps({"experiment": "e", "unit": f"u{i}", "request_id": f"r{i}"})
        producer.produce(topic, key=f"e\x1fu{i}", value=value)
        producer.poll(0)
    if producer.flush(120):
        raise RuntimeError(f"{topic}: requests not acknowledged")


def timed_start(env: dict, recovery: Path, timeout: float) -> tuple[dict, object, int]:
    """A start: its time to ``/ready``, the counts then, and the process and its port."""
    port = free_port()
    process = start(env, recovery, port)
    try:
        seconds, reasons = wait_ready(process, port, timeout)
        shown = reasons if len(reasons) <= 6 else [*reasons[:3], "...", *reasons[-3:]]
        result = {"ready_s": round(seconds, 3), "not_ready_answers": len(reasons)}
        result["reasons_before"] = shown
        result.update(gauges(port, *COUNTS))
    except BaseException:
        process.kill()
        raise
    return result, process, port


def run(bootstrap: str, n: int, workdir: Path, timeout: float, extra: dict) -> dict:
    """The three starts (see the module), on topics of their own."""
    registry = workdir / "registry.toml"
    registry.write_text(REGISTRY)
    env = environment(bootstrap, f"bench-restart-{uuid.uuid4().hex[:8]}", registry, **extra)
    create_topics(env)
    recovery = workdir / "recovery"
    fresh, process, port = timed_start(env, recovery, timeout)
    try:
        produce(bootstrap, env["TSI_TOPIC_REQUESTS"], n)
        wait_served(process, port, n, timeout)
    finally:
        stop(process)
    results = {"instances": n, "fresh": fresh}
    for name in ("restart", "lost"):
        if name == "lost":
            shutil.rmtree(recovery)
        results[name], process, _ = timed_start(env, recovery, timeout)
        stop(process)
        results[name]["over_fresh_s"] = round(results[name]["ready_s"] - fresh["ready_s"], 3)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--instances", type=int, default=100_000)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a step may take")
    parser.add_argument("--snapshot-every", help="TSI_SNAPSHOT_EVERY (default: the service's)")
    args = parser.parse_args()
    extra = {} if args.snapshot_every is None else {"TSI_SNAPSHOT_EVERY": args.snapshot_every}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        bootstrap = stack.enter_context(contextlib.contextmanager(broker_session)(Path(tmp)))
        work = Path(tmp) / "work"
        work.mkdir()
        results = run(bootstrap, args.instances, work, args.timeout, extra)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
