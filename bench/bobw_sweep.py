"""bobw alone on the arena's tuning, held-out and spike tables (40 seeds, T = 10^4): one line
per table, tab-separated (group, table, mean regret, ...), for comparing a change of the Tsallis
learner's rules against ``bench/bobw/spikes.json`` (which holds the baselines of the same
tables and seeds). A change of a compiled constant needs a rebuild before each run.

    .venv/bin/python bench/bobw_sweep.py > /tmp/bobw.tsv
    .venv/bin/python bench/bobw_sweep.py --seeds 400 --groups tuning spike_tune  # to choose

The fourth column is the standard error of the mean, the fifth the runs above five times
the mean (lock-ins): with 40 seeds one such run moves a tuning table's mean a good deal
(bench/bobw/estimate_bound.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

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
GROUPS = {
    "tuning": tuning_tables,
    "held_out": held_out_stationary,
    "adv": held_out_adversarial,
    "spike_tune": spike_tuning_tables,
    "spike_held": spike_held_out,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seeds", type=int, default=SEEDS)
    parser.add_argument("--groups", nargs="*", default=list(GROUPS), choices=list(GROUPS))
    args = parser.parse_args(argv)
    bobw = tsi("bobw", "matched", "bobw")
    for group in args.groups:
        for env in GROUPS[group](ROUNDS):
            regret = play(env, bobw, args.seeds, seed=0).regret
            error = regret.std() / np.sqrt(regret.size)
            locked = int((regret > 5.0 * max(regret.mean(), 1.0)).sum())
            print(f"{group}\t{env.name}\t{regret.mean():.1f}\t{error:.1f}\t{locked}", flush=True)


if __name__ == "__main__":
    main()
