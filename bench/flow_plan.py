"""The plan of ``bench_flow.py``: the workload's registry, the targets, the latency configurations
and the full and quick plans."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the modules beside this one


ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = "bench"
N_ARMS = 10
WARM_UNITS = 100  # warm-up requests of the memory run
# the targets: steady throughput against the same-work Python reference of the same run,
# open-loop p99 at 2,000 requests/s with feedback (recovery on), bytes per 10-arm
# instance at 10^6 by state (at the peak)
TARGET_REFERENCE_RATIO = 0.8
TARGET_P99_MS = 20.0
SLOW_MS = 50.0  # the share of answers slower than this is reported too
#: seasoned: an idle instance of a long-lived user, held to the idle target
TARGET_BYTES_PER_INSTANCE = {"open_tickets": 400, "idle": 250, "seasoned": 250}


def registry_toml(feedback_ttl: float = 3600.0) -> str:
    arms = ", ".join(f'"arm{i}"' for i in range(N_ARMS))
    return (
        f"[experiments.{EXPERIMENT}]\narms = [{arms}]\nper_unit = true\nseed = 7\n"
        f"feedback_ttl = {feedback_ttl}\n"
    )


@dataclass(frozen=True)
class LatencyConfig:
    name: str
    server: tuple[str, ...]  # arguments after the Python executable
    epoch: str
    feedback: bool = False
    events: bool = False  # requests and feedback on the combined events topic (one hop)


@dataclass(frozen=True)
class Plan:
    mode: str
    requests: int  # N: throughput runs have 2N events
    units: int
    repeats: int
    short_epoch_ms: float | None  # extra throughput run with a short epoch (None: skip)
    latency_rate: float
    latency_seconds: float
    latency_warmup_seconds: float
    latency_rounds: int  # runs of each of latency_configs, one of each a round
    latency_configs: tuple[LatencyConfig, ...]
    latency_once: tuple[LatencyConfig, ...]  # run once each, after the rounds
    memory_stages: tuple[int, ...]  # cumulative numbers of instances, open tickets
    idle_stages: tuple[int, ...]  # the same, idle instances
    seasoned_stages: tuple[int, ...]  # the same, idle instances of 20 rounds each
    # the memory runs' service: ``tsi run --recovery-dir DIR`` (what users run: recovery
    # and its changelog on), else ``python -m bytewax.run`` without recovery
    memory_recovery: bool = True


RUN_DEFAULT = LatencyConfig(
    "python -m bytewax.run flows.service.main:flow",
    ("-m", "bytewax.run", "flows.service.main:flow"),
    "10 s",
)
RUN_S1 = LatencyConfig(
    "python -m bytewax.run flows.service.main:flow -s 1",
    ("-m", "bytewax.run", "flows.service.main:flow", "-s", "1"),
    "1 s",
)
HELPERS = str(ROOT / "bench" / "flow_helpers.py")
SERVER_100MS = LatencyConfig("bench/flow_helpers.py serve 100", (HELPERS, "serve", "100"), "100 ms")
SERVER_10MS = LatencyConfig("bench/flow_helpers.py serve 10", (HELPERS, "serve", "10"), "10 ms")
NO_SNAPSHOT = LatencyConfig(
    "diagnostic: serve 10000 --no-snapshot",
    (HELPERS, "serve", "10000", "--no-snapshot"),
    "10 s",
)
NO_SNAPSHOT_NO_GC = LatencyConfig(
    "diagnostic: serve 10000 --no-snapshot --no-gc",
    (HELPERS, "serve", "10000", "--no-snapshot", "--no-gc"),
    "10 s",
)
PASSTHROUGH_ONE_HOP = LatencyConfig(
    "reference: raw passthrough, one hop, + feedback",
    (HELPERS, "passthrough", "1"),
    "-",
    feedback=True,
)
PASSTHROUGH_TWO_HOPS = LatencyConfig(
    "reference: raw passthrough, two hops (the internal topic's), + feedback",
    (HELPERS, "passthrough", "2"),
    "-",
    feedback=True,
)
RUN_RECOVERY_FEEDBACK = LatencyConfig(
    "tsi run --recovery-dir DIR (recovery on), + feedback",
    ("-m", "flows.cli", "run", "--recovery-dir", "{recovery}"),
    "10 s",
    feedback=True,
)
RUN_RECOVERY_S1_FEEDBACK = LatencyConfig(
    "tsi run --recovery-dir DIR --snapshot-every 1, + feedback",
    ("-m", "flows.cli", "run", "--recovery-dir", "{recovery}", "--snapshot-every", "1"),
    "1 s",
    feedback=True,
)
# no epoch closes within the measured window: what recovery costs the calls, apart from
# the closes' pauses
RUN_RECOVERY_NO_CLOSE_FEEDBACK = LatencyConfig(
    "diagnostic: tsi run --recovery-dir DIR --snapshot-every 60 (no close measured), + feedback",
    ("-m", "flows.cli", "run", "--recovery-dir", "{recovery}", "--snapshot-every", "60"),
    "60 s",
    feedback=True,
)
RUN_DEFAULT_FEEDBACK = LatencyConfig(
    "python -m bytewax.run flows.service.main:flow, + feedback",
    RUN_DEFAULT.server,
    "10 s",
    feedback=True,
)
RUN_EVENTS_FEEDBACK = LatencyConfig(
    "python -m bytewax.run flows.service.main:flow, events topic, + feedback",
    RUN_DEFAULT.server,
    "10 s",
    feedback=True,
    events=True,
)
#: the configuration users run (a recovery directory, a snapshot every 10 s): the target's
HEADLINE_LATENCY = RUN_RECOVERY_FEEDBACK
RECOVERY_OFF_LATENCY = RUN_DEFAULT_FEEDBACK

FULL = Plan(
    mode="full",
    requests=100_000,
    units=10_000,
    repeats=5,
    short_epoch_ms=100.0,
    latency_rate=2000.0,
    latency_seconds=20.0,
    latency_warmup_seconds=2.0,
    latency_rounds=3,
    latency_configs=(HEADLINE_LATENCY, RECOVERY_OFF_LATENCY, PASSTHROUGH_TWO_HOPS),
    latency_once=(
        PASSTHROUGH_ONE_HOP,
        RUN_EVENTS_FEEDBACK,
        RUN_RECOVERY_S1_FEEDBACK,
        RUN_DEFAULT,
    ),
    memory_stages=(100_000, 300_000, 1_000_000),
    idle_stages=(100_000, 300_000, 1_000_000),
    seasoned_stages=(100_000,),
)
QUICK = Plan(
    mode="quick",
    requests=50_000,
    units=10_000,
    repeats=1,
    short_epoch_ms=None,
    latency_rate=2000.0,
    latency_seconds=8.0,
    latency_warmup_seconds=1.0,
    latency_rounds=1,
    latency_configs=(HEADLINE_LATENCY, RECOVERY_OFF_LATENCY),
    latency_once=(),
    memory_stages=(30_000, 100_000),
    idle_stages=(30_000, 100_000),
    seasoned_stages=(30_000,),
)
#: run only when named (``--latency-configs TEXT``): what an earlier tail was made of
DIAGNOSTIC_LATENCY = (
    RUN_S1,
    SERVER_100MS,
    SERVER_10MS,
    RUN_RECOVERY_NO_CLOSE_FEEDBACK,
    NO_SNAPSHOT,
    NO_SNAPSHOT_NO_GC,
)
