"""What the other process does when one of two dies (kill -9): a Bytewax cluster
(``--process-id/--addresses``) against two members (``--members 2 --member K``).

Run from the repository root (about 2 minutes; it starts the project's broker unless
``KAFKA_BOOTSTRAP_SERVERS`` is set)::

    .venv/bin/python bench/failure_isolation.py    # figures: bench/isolation_results.json

Clients ask at a steady pace on the two input topics (4 partitions each, every event on
its shard's partition); once both processes answer, process 1 is killed with -9 and the
survivor is watched: whether it exits (when, with what status and last log line) and how
many answers it writes in the seconds after the kill. Figures go to bench/RESULTS.md,
"Members".
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from flow_kafka import broker, log  # noqa: E402

from flows.testing.kafka_broker import create_topic, free_port, unique_topic  # noqa: E402
from tests.service.members_live import REGISTRY, Clients, member_env  # noqa: E402

PARTITIONS = 4


def start_processes(
    bootstrap: str, workdir: Path, mode: str, topics: dict[str, str]
) -> tuple[list[subprocess.Popen], list[Path]]:
    """Two ``tsi run`` processes of ``mode`` (cluster or members) and their log files."""
    registry = workdir / "registry.toml"
    registry.write_text(REGISTRY)
    addresses = ";".join(f"127.0.0.1:{free_port()}" for _ in range(2))
    procs, logs = [], []
    for k in range(2):
        env = member_env(bootstrap, registry, topics, 2 if mode == "members" else 1, k)
        if mode == "cluster":
            env.update(TSI_PROCESS_ID=str(k), TSI_ADDRESSES=addresses, TSI_MEMBER="0")
        logs.append(workdir / f"{mode}-{k}.log")
        recovery = workdir / f"{mode}-{k}"
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "flows.cli", "run", "--recovery-dir", str(recovery)],
                env={**env, "TSI_LOG_FILE": str(logs[k])},
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    return procs, logs


def run_mode(bootstrap: str, workdir: Path, mode: str, watch_s: float) -> dict[str, Any]:
    """Two processes of ``mode`` (cluster or members) under steady load; process 1 killed."""
    topics = {n: unique_topic(n) for n in ("requests", "feedback", "sel", "dlq", "internal")}
    for name, topic in topics.items():
        create_topic(bootstrap, topic, 1 if name == "dlq" else PARTITIONS)
    procs, logs = start_processes(bootstrap, workdir, mode, topics)
    clients = Clients(bootstrap, topics, 100_000, 0.01)
    threads = clients.start()
    result: dict[str, Any] = {"mode": mode}
    try:
        deadline = time.monotonic() + 120
        while clients.answered() < 200:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"{mode}: not serving; see {logs}")
            time.sleep(0.2)
        procs[1].kill()
        procs[1].wait()
        killed = time.monotonic()
        with clients.lock:
            before = len(clients.first_seen)
        survivor, exited_after = procs[0], None
        while time.monotonic() - killed < watch_s:
            if exited_after is None and survivor.poll() is not None:
                exited_after = time.monotonic() - killed
            time.sleep(0.1)
        with clients.lock:
            after = sorted(t - killed for t in clients.first_seen.values() if t >= killed)
        result.update(
            answered_before_kill=before,
            answered_in_watch=len(after),
            last_answer_after_s=after[-1] if after else None,
            survivor_exited_after_s=exited_after,
            survivor_status=survivor.poll(),
            survivor_last_lines=logs[0].read_text(errors="replace").splitlines()[-3:],
            watch_s=watch_s,
        )
    finally:
        clients.stop.set()
        for thread in threads:
            thread.join()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    log(f"{mode}: {json.dumps({k: v for k, v in result.items() if k != 'survivor_last_lines'})}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--watch", type=float, default=30.0, help="seconds watched after")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "isolation_results.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tsi-isolation-") as tmp, broker() as bk:
        results = [
            run_mode(bk.bootstrap, Path(tmp), mode, args.watch) for mode in ("cluster", "members")
        ]
    args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
