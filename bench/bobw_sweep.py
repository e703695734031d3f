"""bobw alone on the arena's tuning, held-out and spike tables (40 seeds, T = 10^4): one line
per table, tab-separated (group, table, mean regret), for comparing a change of the Tsallis
learner's rules against ``bench/bobw/spikes.json`` (which holds the baselines of the same
tables and seeds). A change of a compiled constant needs a rebuild before each run.

    .venv/bin/python bench/bobw_sweep.py > /tmp/bobw.tsv
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_bobw import (
    held_out_adversarial,
    held_out_stationary,
    play,
    spike_held_out,
    spike_tuning_tables,
    tsi,
    tuning_tables,
)

ROUNDS = 10_000
SEEDS = 40  # as bench/bobw/spikes.json: 10 seeds hide lock-ins that 40 show


def main() -> None:
    bobw = tsi("bobw", "matched", "bobw")
    groups = {
        "tuning": tuning_tables(ROUNDS),
        "held_out": held_out_stationary(ROUNDS),
        "adv": held_out_adversarial(ROUNDS),
        "spike_tune": spike_tuning_tables(ROUNDS),
        "spike_held": spike_held_out(ROUNDS),
    }
    for group, tables in groups.items():
        for env in tables:
            out = play(env, bobw, SEEDS, seed=0)
            print(f"{group}\t{env.name}\t{out.regret.mean():.1f}", flush=True)


if __name__ == "__main__":
    main()
