"""What an internal topic of many partitions costs one idle ``tsi run`` process: its
threads, its RSS and its CPU while no event comes (bench/RESULTS.md, "The shard count").

Run from the repository root (about 2 minutes; starts its own broker, as the tests do)::

    .venv/bin/python bench/bench_internal_partitions.py --partitions 4,32,128

For each count P, fresh topics (the inputs and outputs with 4 partitions, the internal
topic with P) and one ``tsi run`` without a recovery directory; after ``--settle`` seconds
its ``/proc`` status is read (threads, RSS), then its CPU time over ``--window`` seconds.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from flows.testing.kafka_broker import broker_session, create_topic, unique_topic

REGISTRY = '[experiments.shop]\narms = ["a", "b"]\nper_unit = true\n'
TSI = Path(sys.executable).parent / "tsi"


def proc_status(pid: int) -> tuple[int, int]:
    """(threads, RSS in kB) of process ``pid``."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["Threads"]), int(fields["VmRSS"].split()[0])


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of process ``pid`` so far."""
    ticks = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[11:13]
    return sum(map(int, ticks)) / os.sysconf("SC_CLK_TCK")


def idle_process(bootstrap: str, workdir: Path, partitions: int, settle: float, window: float):
    """(threads, RSS kB, CPU cores) of one idle ``tsi run`` whose internal topic has
    ``partitions``."""
    topics = {n: unique_topic(n) for n in ("rq", "fb", "sel", "dlq", "int")}
    for role, name in topics.items():
        create_topic(bootstrap, name, partitions if role == "int" else 4)
    env = {
        **os.environ,
        "TSI_REGISTRY": str(workdir / "registry.toml"),
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "TSI_TOPIC_REQUESTS": topics["rq"],
        "TSI_TOPIC_FEEDBACK": topics["fb"],
        "TSI_TOPIC_SELECTIONS": topics["sel"],
        "TSI_TOPIC_DLQ": topics["dlq"],
        "TSI_TOPIC_INTERNAL": topics["int"],
        "TSI_NO_RECOVERY": "1",
        "TSI_LOG_FILE": str(workdir / f"run-{partitions}.log"),
    }
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    proc = subprocess.Popen([str(TSI), "run"], env=env, **quiet)
    try:
        time.sleep(settle)
        threads, rss = proc_status(proc.pid)
        before = cpu_seconds(proc.pid)
        time.sleep(window)
        cores = (cpu_seconds(proc.pid) - before) / window
    finally:
        proc.terminate()
        proc.wait(60)
    return threads, rss, cores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", default="4,32,128", help="internal partition counts")
    parser.add_argument("--settle", type=float, default=25.0, help="seconds before reading")
    parser.add_argument("--window", type=float, default=10.0, help="seconds of CPU time read")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        (workdir / "registry.toml").write_text(REGISTRY)
        for bootstrap in broker_session(workdir / "kafka"):
            print("| internal partitions | threads | RSS MB | idle CPU (cores) |")
            print("|---:|---:|---:|---:|")
            for count in map(int, args.partitions.split(",")):
                threads, rss, cores = idle_process(
                    bootstrap, workdir, count, args.settle, args.window
                )
                print(f"| {count} | {threads} | {rss / 1024:.0f} | {cores:.2f} |", flush=True)


if __name__ == "__main__":
    main()
