"""What ``bench_core.py`` runs: its constants, the work of every measure, the targets, and
the plans (full and quick)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BEFORE = "433eead"  # the last numpy implementation
# bench/RESULTS.md, 2026-11-26, AMD EPYC (2 cores): numpy BatchBandit N=10,000 M=10, Fixed
RECORDED_NUMPY_BATCH = 5_430_876.0
BUILD_NOTE = "kernel built with -O3 -ffp-contract=off (setup.py: no fast-math, no FMA)"

LOSS_SHIFT = 1e6
LOSS_SCALE = 1000.0
TABLE_SEED = 12345
DRAW_SEED = 54321
TABLE_ROWS = 8192  # single instance: at most this many rows, cycled
TABLE_CELLS = 2**18  # ... and at most this many cells (Python floats)
BATCH_SLABS = 32  # batch: at most this many (N, M) slabs, cycled
BATCH_N = 10_000
BATCH_M = 10
N_CONTEXTS = 3
RIVER_GAMMA = 0.1
MEM_BATCH_N = 100_000
MEM_BANDITS = 10_000

# (label, measure, reference, op, bound): ratio = measure / reference, PASS if `ratio op bound`
TARGETS = (
    ("Bandit Fixed M=10 vs pure-Python EXP3", "bandit_fixed_m10", "python_exp3_m10", ">=", 2.0),
    ("Bandit Fixed M=10 vs river Exp3", "bandit_fixed_m10", "river_exp3_m10", ">=", 5.0),
    ("Bandit Fixed M=1000 vs numpy EXP3", "bandit_fixed_m1000", "exp3_m1000", ">=", 2.0),
    ("Fixed / Switching(1e-3), M=10", "bandit_fixed_m10", "bandit_switching_m10", "<=", 1.5),
    ("Fixed / Switching() decaying, M=10", "bandit_fixed_m10", "bandit_decaying_m10", "<=", 1.5),
    ("Fixed / Contextual(3), M=10", "bandit_fixed_m10", "bandit_contextual_m10", "<=", 1.5),
    ("BatchBandit Fixed vs numpy BatchBandit", "batch_fixed", "numpy_batch_fixed", ">=", 4.0),
)

# rounds timed per repeat in the full run; chosen so that, on a 2-core AMD EPYC, each
# timed loop takes about 0.3 s
WORK = {
    "bandit_fixed_m10": 900_000,
    "bandit_contextual_m10": 450_000,
    "bandit_switching_m10": 550_000,
    "bandit_decaying_m10": 550_000,
    "bandit_markov_m10": 250_000,
    "bandit_fixed_m1000": 45_000,
    "python_exp3_m10": 170_000,
    "exp3_m10": 40_000,
    "exp3_m1000": 22_000,
    "river_exp3_m10": 55_000,  # below ~130,000: river's weights overflow at log w = 709
    "river_exp3_m1000": 900,
    "bandit_u_m10": 800_000,
    "table_m10": 900_000,
    "bandit_u_m1000": 45_000,
    "table_m1000": 45_000,
    "batch_fixed": 220,
    "batch_switching": 100,
    "batch_contextual": 220,
    "numpy_batch_fixed": 230,
    "numpy_batch_switching": 130,
    "numpy_batch_contextual": 130,
    "exp3_batch": 180,
    "batch_u_fixed": 220,
    "table_batch": 240,
}


@dataclass(frozen=True)
class Plan:
    """How much work each measure does (rounds are timed; warm-up rounds are not)."""

    repeats: int
    warmup: int  # single-instance warm-up rounds
    batch_warmup: int  # batch warm-up rounds
    share: float  # fraction of ``WORK`` timed per repeat

    def rounds(self, key: str) -> int:
        return max(1, round(WORK[key] * self.share))


FULL = Plan(repeats=7, warmup=1000, batch_warmup=3, share=1.0)
QUICK = Plan(repeats=2, warmup=100, batch_warmup=1, share=0.1)


@dataclass
class Measure:
    """A timed loop: ``once()`` builds, warms up and returns the timed seconds."""

    key: str
    label: str
    unit: str
    work: int  # rounds (or instance-rounds) timed per call of ``once``
    once: Callable[[], float]
