"""Open-loop decision latency of ``bench_flow.py``: requests sent on a schedule, selections read
back, configurations run in rounds."""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the modules beside this one
import open_loop
from flow_kafka import Broker, log, new_topics
from flow_load import RequestSender, SelectionReader, measure_open_loop
from flow_plan import HELPERS, SLOW_MS, LatencyConfig, Plan
from flow_service import service_process


def gc2_pauses(cfg: LatencyConfig, logfile: Path) -> list[float] | None:
    """Full collections in the service (logged by flow_helpers.py serve), else None."""
    if cfg.server[0] != HELPERS:
        return None
    return [
        float(line.split()[1])
        for line in logfile.read_text(errors="replace").splitlines()
        if line.startswith("GC2 ")
    ]


def latency_run(
    bk: Broker, plan: Plan, cfg: LatencyConfig, registry_path: Path, workdir: Path
) -> dict[str, Any]:
    inputs = ("events",) if cfg.events else ("requests", "feedback")
    topics = new_topics(bk.bootstrap, (*inputs, "sel", "dlq"))
    logfile = workdir / f"latency-{len(list(workdir.glob('latency-*')))}.log"
    recovery = str(logfile.with_suffix(".recovery"))  # a fresh directory per run
    server = tuple(arg.replace("{recovery}", recovery) for arg in cfg.server)
    reader = SelectionReader(bk.bootstrap, topics["sel"])
    sender = RequestSender(bk.bootstrap, topics)
    try:
        with service_process(bk, server, topics, registry_path, logfile) as proc:
            t0, ready_s, t_start, measured = measure_open_loop(
                plan, cfg, sender, reader, proc, logfile
            )
    finally:
        reader.close()
    received = dict(reader.received)
    return {
        "config": asdict(cfg),
        "rate": plan.latency_rate,
        "seconds": plan.latency_seconds,
        "ready_s": ready_s,
        "measured_from_s": t_start - t0,
        **open_loop.figures(measured, sender.intended, sender.sent, received, SLOW_MS),
        "timeline": open_loop.timeline(measured, sender.intended, received, t0),
        "gc2_pauses_ms": gc2_pauses(cfg, logfile),
    }


def latency(bk: Broker, plan: Plan, registry_path: Path, workdir: Path) -> list[dict[str, Any]]:
    """Every configuration of the plan in rounds (``latency_rounds``; one run of each a
    round, alternating), then the ``latency_once`` ones; every run is reported."""
    # a fresh broker answers slower until its JIT has warmed up (the first configuration
    # run read a p50 several times the same one's run second: bench/RESULTS.md, "the
    # compiled hot path"): one run is discarded as the broker's warm-up (not a run of the
    # measured configurations)
    log("latency: warm-up run of the broker (not reported)")
    latency_run(bk, plan, plan.latency_configs[0], registry_path, workdir)
    rounds = [(k, cfg) for k in range(plan.latency_rounds) for cfg in plan.latency_configs]
    order = rounds + [(0, cfg) for cfg in plan.latency_once]
    out = []
    for k, cfg in order:
        log(f"latency: {cfg.name} (epoch {cfg.epoch}), {plan.latency_rate:g} requests/s, "
            f"run {k + 1}")  # fmt: skip
        r = latency_run(bk, plan, cfg, registry_path, workdir)
        r["round"] = k + 1
        log(
            f"  open loop p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, max "
            f"{r['max_ms']:.1f} ms ({r['answered']:,} of {r['sent']:,} answered); closed loop "
            f"p99 {r['closed_loop_p99_ms']:.1f}; sender lag up to {r['sender_max_lag_ms']:.1f} ms"
        )
        out.append(r)
    return out
