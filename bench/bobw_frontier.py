"""The frontier of ``bobw``'s rate constant c: for each c, every target the default is held
to, measured on tables the constant was not chosen on, so that the report can say which
target gives way to which.

    .venv/bin/python bench/bobw_frontier.py --json bench/bobw/frontier.json
    .venv/bin/python bench/bobw_frontier.py --scales 2 3 --quick      # smoke run

Per c (T = 10^4, 40 seeds per table: 10 hide the runs that lock onto a worse arm; the
baselines measured once in the same run):
bench_bobw's held-out stationary tables (geometric mean and worst of bobw over the best of
Thompson sampling and ε-greedy), the FTL-breaker's regret, the held-out one-arm spike tables
(worst ratio to Thompson sampling and to ``robust``), the held-out scale jumps and close
contextual tables (worst ratio to the best baseline), 1,000 per-user diabetes bandits of 50
rounds (bobw's share of uniform play's regret over Thompson sampling's), and the selections
changed under the rounding maps (``arena.lab.rounding_tables``, 2·10^4 rounds × 6 instances
of real forecast errors and of a trend with ×100 regimes, Fixed and Contextual: the classes
the rate constant drives), and regret at 10·T against T on the held-out close contextual
table of bench_bobw's growth part.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from arena.lab.baselines import ThompsonNIG
from arena.lab.environments import ftl_breaker
from arena.report import frontier_table, frontier_verdict
from arena.runner import play
from bench.bench_bobw import (
    GROWTH_TABLES,
    contenders,
    held_out_stationary,
    log,
    spike_held_out,
    tsi,
    user_share,
    user_tables,
)
from bench.bench_invariance import measure
from tsi_core import VARIANTS, BatchBandit, Variant

SCALES = [1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0]
#: the per-user tables: diabetes rules, 1,000 users of 50 rounds (bench_bobw's users part)
USERS = ("diabetes", 1000, 50, 5)
INVARIANCE_TABLES = ("forecast_errors", "trend_and_regimes")
INVARIANCE_ROUNDS, INVARIANCE_INSTANCES = 20_000, 6
#: the classes the rate constant drives (Switching and Markov run robust's round)
TSALLIS_CLASSES = ("fixed", "contextual")


def mean_regret(env: Any, player: Any, seeds: int) -> float:
    return float(play(env, player, seeds, seed=0).regret.mean())


def references(t: int, seeds: int) -> dict[str, Any]:
    """What the ratios divide by, measured once: the best of Thompson sampling and
    ε-greedy per table (stationary and spike tables), Thompson sampling's and robust's
    regret per spike table, Thompson sampling's per-user share."""
    thompson, greedy = contenders()[-2:]
    robust = tsi("robust", "matched", "robust")
    stationary = held_out_stationary(t)
    spikes = spike_held_out(t)
    losses, expected = user_tables(*USERS)
    found = {
        "stationary_best": [
            min(mean_regret(env, thompson, seeds), mean_regret(env, greedy, seeds))
            for env in stationary
        ],
        "spikes_thompson": [mean_regret(env, thompson, seeds) for env in spikes],
        "spikes_greedy": [mean_regret(env, greedy, seeds) for env in spikes],
        "spikes_robust": [mean_regret(env, robust, seeds) for env in spikes],
        "users_thompson": user_share(
            ThompsonNIG(USERS[1], losses.shape[2], USERS[3]), losses, expected
        )["of_uniform"],
    }
    log(f"frontier references {found}")
    return found


def changed_selections(variant: Variant) -> int:
    """Selections that differ under any of the rounding maps from the unmapped run, summed
    over ``INVARIANCE_TABLES`` and the Fixed and Contextual classes (``bench_invariance``)."""
    return sum(
        row["changed"]
        for kind in INVARIANCE_TABLES
        for row in measure(kind, INVARIANCE_ROUNDS, INVARIANCE_INSTANCES, variant, TSALLIS_CLASSES)
    )


def worst_of(kind: str, kinds: list[str], regret: list[float], over: list[float]) -> float:
    """The largest regret / reference among the tables of one kind."""
    return max(r / o for r, o, k in zip(regret, over, kinds, strict=True) if k == kind)


def stationary_figures(player: Any, t: int, seeds: int, refs: dict[str, Any]) -> dict[str, Any]:
    tables = held_out_stationary(t)
    ratios = [
        mean_regret(env, player, seeds) / best
        for env, best in zip(tables, refs["stationary_best"], strict=True)
    ]
    return {
        "geo_mean": math.exp(sum(math.log(max(x, 1e-9)) for x in ratios) / len(ratios)),
        "max": max(ratios),
        "worst_table": tables[int(np.argmax(ratios))].name,
    }


def spike_figures(player: Any, t: int, seeds: int, refs: dict[str, Any]) -> dict[str, float]:
    tables = spike_held_out(t)
    regret = [mean_regret(env, player, seeds) for env in tables]
    kinds = [env.name for env in tables]
    best = [min(a, b) for a, b in zip(refs["spikes_thompson"], refs["spikes_greedy"], strict=True)]
    return {
        "spikes_thompson": worst_of("one_arm_spikes", kinds, regret, refs["spikes_thompson"]),
        "spikes_robust": worst_of("one_arm_spikes", kinds, regret, refs["spikes_robust"]),
        "regimes": worst_of("scale_jump", kinds, regret, best),
        "close": worst_of("close_contextual", kinds, regret, best),
    }


def growth(player: Any, t: int, seeds: int) -> float:
    """Regret at 10·t over regret at t on the close contextual table of ``GROWTH_TABLES``."""
    table = dict(GROWTH_TABLES)["close contextual, held-out seed"]
    return mean_regret(table(10 * t), player, seeds) / mean_regret(table(t), player, seeds)


def point(c: float, t: int, seeds: int, refs: dict[str, Any]) -> dict[str, Any]:
    """Every target's figure for the rate constant c."""
    v = replace(VARIANTS["bobw"], name=f"bobw c={c:g}", tsallis_scale=float(c))
    player = tsi(v, "matched", v.name)
    losses, expected = user_tables(*USERS)
    users = BatchBandit(USERS[1], losses.shape[2], seed=USERS[3], variant=v)
    row = {
        "c": c,
        **stationary_figures(player, t, seeds, refs),
        "ftl_breaker": mean_regret(ftl_breaker(t, 2, 7), player, seeds),
        **spike_figures(player, t, seeds, refs),
        "users": user_share(users, losses, expected)["of_uniform"] / refs["users_thompson"],
        "growth": growth(player, t, seeds),
        "changed": changed_selections(v),
    }
    log(f"frontier {row}")
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--scales", type=float, nargs="*", default=SCALES)
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--quick", action="store_true", help="smoke run: T = 1,000, 3 seeds")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    t, seeds = (1000, 3) if args.quick else (10_000, args.seeds)
    command = shlex.join(["python", "bench/bobw_frontier.py", *(argv or sys.argv[1:])])
    refs = references(t, seeds)
    rows = [point(c, t, seeds, refs) for c in args.scales]
    preset = VARIANTS["bobw"].tsallis_scale
    head = f"Reproduce: `{command}`; T = {t:,}, {seeds} seeds per table."
    print("\n".join([head, "", frontier_table(rows, preset), "", *frontier_verdict(rows, preset)]))
    if args.json:
        found = {"command": command, "rounds": t, "seeds": seeds, "references": refs}
        args.json.write_text(json.dumps({**found, "frontier": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
