"""The gateway's latency: what ``tsi serve`` adds to the Kafka round trip.

Run from the repository root::

    .venv/bin/python bench/bench_gateway.py            # 3 pairs of 20 s runs at 1,000/s
    .venv/bin/python bench/bench_gateway.py --quick    # 1 pair of 5 s runs at 200/s

One broker (``flows/testing/kafka_broker.py``), one ``tsi run`` with a recovery directory and
snapshots at their default period (the configuration users run), one ``tsi serve`` in
front of it. Runs alternate: (a) the reference, an ``AsyncDecider`` in this process (the
Kafka round trip as an application sees it), then (b) the same decisions through the
gateway over HTTP (keep-alive HTTP/1.1 connections on asyncio streams, a new one opened when
all are busy: ``httpx.AsyncClient`` cost the sender more than the gateway took and fell
behind its schedule at 200/s on 2 cores, bench/RESULTS.md). Both are open loop
(``open_loop.py``): request k is due at ``start + k / rate`` and is launched then whatever
earlier ones are doing; its latency runs from that intended time to its answer. The
sender's own lateness (``sender_max_lag_ms``, ``sender_late_share``) is reported with every
run. The added p99 of a pair is p99(b) - p99(a); the report gives every run and the median
over pairs. Raw figures go to ``--out`` (default ``bench/gateway_results.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).parent))
import open_loop

from flows.client import AsyncDecider, ClientSettings
from flows.service.connectors.topics import Topics
from flows.testing.kafka_broker import (
    broker_session,
    create_topic,
    free_port,
    unique_topic,
)

REGISTRY = '[experiments.shop]\narms = ["a", "b", "c"]\nfeedback_ttl = 600\n'
TSI = str(Path(sys.executable).parent / "tsi")
DECIDE_TIMEOUT = 10.0
SLOW_MS = 50.0


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def open_loop_run(
    call: Callable[[str], Awaitable[Any]], tag: str, rate: float, seconds: float, warm_s: float
) -> dict[str, Any]:
    """Requests ``tag-k`` launched at their intended times; figures of those after the
    warm-up seconds."""
    intended: dict[str, float] = {}
    sent: dict[str, float] = {}
    received: dict[str, float] = {}
    errors: list[str] = []

    async def one(rid: str) -> None:
        sent[rid] = time.perf_counter()
        try:
            await call(rid)
            received[rid] = time.perf_counter()
        except Exception as exc:  # counted as unanswered (infinitely slow)
            errors.append(repr(exc))

    tasks = []
    start = time.perf_counter()
    n, warm = round(rate * (warm_s + seconds)), round(rate * warm_s)
    for k in range(n):
        due = start + k / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        rid = f"{tag}-{k}"
        intended[rid] = due
        tasks.append(asyncio.create_task(one(rid)))
    await asyncio.gather(*tasks)
    measured = [f"{tag}-{k}" for k in range(warm, n)]
    return {
        **open_loop.figures(measured, intended, sent, received, SLOW_MS),
        "errors": errors[:5],
        "error_count": len(errors),
        "timeline": open_loop.timeline(measured, intended, received, intended[measured[0]]),
    }


def wait_until(condition: Callable[[], bool], proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 120
    while not condition():
        if proc.poll() is not None:
            raise RuntimeError(f"{what} stopped (exit {proc.returncode})")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready within 120 s")
        time.sleep(0.3)


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as answer:
            return orjson.loads(answer.read())["connected"]
    except (OSError, ValueError, KeyError):
        return False


class Http:
    """POSTs over keep-alive HTTP/1.1 connections to ``127.0.0.1:port``: an idle connection
    is reused, a new one opened when none is idle."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """(status, body); a reused connection the server closed meanwhile (its keep-alive
        timeout) is replaced by a new one, as any HTTP client does."""
        while self.idle:
            try:
                return await self._exchange(self.idle.pop(), path, body)
            except (asyncio.IncompleteReadError, ConnectionError):
                continue
        return await self._exchange(
            await asyncio.open_connection("127.0.0.1", self.port), path, body
        )

    async def _exchange(
        self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], path: str, body: bytes
    ) -> tuple[int, bytes]:
        reader, writer = conn
        writer.write(
            b"POST %s HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (path.encode(), len(body), body)
        )
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.lower().split(b"\r\n")
        length = next(int(line[15:]) for line in lines if line.startswith(b"content-length:"))
        answer = await reader.readexactly(length)
        self.idle.append(conn)
        return int(lines[0].split()[1]), answer

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()


async def pairs(
    args: argparse.Namespace, settings: ClientSettings, ports: dict[str, int]
) -> list[dict]:
    """Rounds of one run of each path (direct, then each gateway), after a warm-up of each."""
    runs = []
    clients = {name: Http(port) for name, port in ports.items()}
    async with AsyncDecider(settings) as decider:

        async def direct(rid: str) -> None:
            await decider.decide("shop", request_id=rid, timeout=DECIDE_TIMEOUT)

        def through(http: Http) -> Callable[[str], Awaitable[None]]:
            async def call(rid: str) -> None:
                body = orjson.dumps({"experiment": "shop", "request_id": rid})
                status, answer = await http.post("/v1/decide", body)
                if status != 200:
                    raise RuntimeError(f"{status}: {answer!r}")

            return call

        paths = {"direct": direct, **{name: through(http) for name, http in clients.items()}}
        for k in range(600):  # the service answers: ready
            try:
                await decider.decide("shop", request_id=f"probe-{k}", timeout=1)
                break
            except Exception:
                await asyncio.sleep(0.2)
        log("warm-up of every path (not reported)")
        for name, call in paths.items():
            await open_loop_run(call, f"warm-{name}", args.rate, 3, 1)
        for k in range(args.pairs):
            for name, call in paths.items():
                r = await open_loop_run(call, f"{name}{k}", args.rate, args.seconds, args.warm)
                r.update(path=name, pair=k + 1)
                log(
                    f"{name} round {k + 1}: p50 {r['p50_ms']:.1f} p99 {r['p99_ms']:.1f} "
                    f"p99.9 {r['p99_9_ms']:.1f} max {r['max_ms']:.1f} ms; answered "
                    f"{r['answered']}/{r['sent']}; sender lag max {r['sender_max_lag_ms']:.1f} ms"
                    f", late share {r['sender_late_share']:.3f}"
                )
                runs.append(r)
    for http in clients.values():
        http.close()
    return runs


def report(meta: dict[str, Any], runs: list[dict[str, Any]]) -> str:
    rows = [
        "| Run | p50 ms | p99 ms | p99.9 ms | max ms | answered | sender lag max ms | late share |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        rows.append(
            f"| {r['path']} {r['pair']} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
            f"{r['p99_9_ms']:.1f} | {r['max_ms']:.1f} | {r['answered']:,}/{r['sent']:,} | "
            f"{r['sender_max_lag_ms']:.1f} | {r['sender_late_share']:.3f} |"
        )
    direct = {r["pair"]: r for r in runs if r["path"] == "direct"}
    added = {
        name: [
            (r["p50_ms"] - direct[r["pair"]]["p50_ms"], r["p99_ms"] - direct[r["pair"]]["p99_ms"])
            for r in runs
            if r["path"] == name
        ]
        for name in dict.fromkeys(r["path"] for r in runs if r["path"] != "direct")
    }
    lines = [
        f"- command: `{meta['command']}`",
        f"- machine: {meta['machine']}; nproc {meta['nproc']}; load average "
        f"{meta['load_before']} before, {meta['load_after']} after",
        f"- {meta['rate']:g} decisions/s open loop, {meta['seconds']:g} s measured a run after "
        f"{meta['warm']:g} s warm-up; tsi run with --recovery-dir, snapshots every "
        f"{meta['snapshot_every']} s",
        "",
        *rows,
        "",
        *(
            f"{name} - direct in the same round: added p99 "
            f"{', '.join(f'{p99:.1f}' for _, p99 in pairs)} ms, median "
            f"{statistics.median(p99 for _, p99 in pairs):.1f} ms (target <= 3 ms); added p50 "
            f"{', '.join(f'{p50:.1f}' for p50, _ in pairs)} ms, median "
            f"{statistics.median(p50 for p50, _ in pairs):.1f} ms."
            for name, pairs in added.items()
        ),
    ]
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warm", type=float, default=2.0)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--snapshot-every", default="10")
    parser.add_argument(
        "--uvloop-path",
        help="a directory holding uvloop and httptools (pip install --target DIR uvloop "
        "httptools): a second gateway runs with it on its PYTHONPATH (uvicorn then uses both)",
    )
    parser.add_argument("--out", default="bench/gateway_results.json")
    args = parser.parse_args()
    if args.quick:
        args.rate, args.seconds, args.pairs = 200.0, 5.0, 1
    return args


def run_meta(args: argparse.Namespace) -> dict[str, Any]:
    """The command, the machine and its load before the runs, and the runs' settings."""
    return {
        "command": " ".join([".venv/bin/python", *sys.argv]),
        "machine": f"{platform.processor() or platform.machine()}, {platform.platform()}",
        "nproc": os.cpu_count(),
        "load_before": " / ".join(f"{x:.2f}" for x in os.getloadavg()),
        "rate": args.rate,
        "seconds": args.seconds,
        "warm": args.warm,
        "snapshot_every": args.snapshot_every,
    }


def start_gateways(
    topics: list[str], extra: dict[str, str | None], ports: dict[str, int]
) -> list[subprocess.Popen]:
    """One ``tsi serve`` a gateway variant, each with its extra PYTHONPATH (or none)."""
    return [
        subprocess.Popen(
            [TSI, "serve", *topics, "--port", str(ports[name]), "--decide-timeout", "10"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(
                p for p in (path, os.environ.get("PYTHONPATH")) if p
            )},
        )
        for name, path in extra.items()
    ]  # fmt: skip


def main() -> None:
    args = parse_args()
    meta = run_meta(args)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for bootstrap in broker_session(tmp / "kafka"):
            names = {n: create_topic(bootstrap, unique_topic(n), 3) for n in ("ev", "sel", "dlq")}
            (tmp / "registry.toml").write_text(REGISTRY)
            topics = [
                *("--brokers", bootstrap, "--events-topic", names["ev"]),
                *("--selections-topic", names["sel"], "--dlq-topic", names["dlq"]),
            ]
            service = subprocess.Popen(
                [TSI, "run", "--registry", str(tmp / "registry.toml"), *topics,
                 "--recovery-dir", str(tmp / "rec"), "--snapshot-every", args.snapshot_every,
                 "--log-file", str(tmp / "run.log")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            extra = {"gateway": None}
            if args.uvloop_path:
                extra["gateway_uvloop"] = args.uvloop_path
            ports = {name: free_port() for name in extra}
            gateways = start_gateways(topics, extra, ports)
            try:
                for proc, port in zip(gateways, ports.values(), strict=True):
                    wait_until(lambda p=port: healthy(p), proc, "tsi serve")
                settings = ClientSettings(
                    brokers=bootstrap,
                    topics=Topics(events=names["ev"], selections=names["sel"],
                                  dead_letters=names["dlq"]),
                    timeout=DECIDE_TIMEOUT,
                )  # fmt: skip
                runs = asyncio.run(pairs(args, settings, ports))
            finally:
                for proc in (*gateways, service):
                    proc.kill()
                    proc.wait()
            break
    meta["load_after"] = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    Path(args.out).write_text(json.dumps({"meta": meta, "runs": runs}, indent=1) + "\n")
    print(report(meta, runs))


if __name__ == "__main__":
    main()
