"""The ``bobw`` variant against the stochastic baselines and the paper: its targets' figures.

    .venv/bin/python bench/bench_bobw.py                  # every part, 10 seeds, T = 10^4
    .venv/bin/python bench/bench_bobw.py --part tuning --scales 1 2 4 8
    .venv/bin/python bench/bench_bobw.py --quick          # smoke run

Parts: ``tuning`` (the tables that chose ``TSALLIS_SCALE``, with the scales to compare),
``held-out`` (stationary and adversarial tables the constants never saw), ``spikes``
(one-arm spikes, scale jumps, close contextual arms: tuning and held-out), ``growth``
(regret at T = 10^5 against 10^4), ``users`` (many short per-user bandits), ``speed``. The
rate constant's trade-off between these targets: ``bench/bobw_frontier.py``.
Regret is in the losses' own units, mean over seeds (± standard error), against the
environment's competitor; tsi and every baseline scored by q·l where exposed (Thompson
sampling by its realised losses). Writes ``--out`` (markdown) and ``--json``.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from arena.lab.baselines import EpsilonGreedy, ThompsonNIG
from arena.lab.datasets import breast_cancer, diabetes, diabetes_forecasts, digits, iris, wine
from arena.lab.environments import (
    bernoulli,
    close_contextual,
    contextual,
    delayed_switch,
    ftl_breaker,
    gaussian,
    heavy_tailed,
    one_arm_spikes,
    outlier,
    piecewise_stationary,
    scale_jump,
    spiky,
)
from arena.runner import Contender, _tsi_fixed, _tsi_matched, play, single_instance_speed
from flows.tools.loss_table import LossTable
from tsi_core import VARIANTS, BatchBandit

BASELINES = ("Thompson (NIG)", "ε-greedy (range-free)")


def log(message: str) -> None:
    print(f"[bobw {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def tuning_tables(t: int) -> list[LossTable]:
    """The tables that chose the constants (seed 1; the held-out ones use other seeds and
    other families)."""
    return [
        bernoulli(t, 10, 1),
        gaussian(t, 10, 1),
        heavy_tailed(t, 10, 1),
        contextual(t, 10, 4, 1),
        ftl_breaker(t, 2, 1),
    ]


def held_out_stationary(t: int) -> list[LossTable]:
    return [
        bernoulli(t, 10, 7),
        heavy_tailed(t, 10, 7),
        outlier(t, 10, 7),
        digits(t, 7),
        wine(t, 7),
        diabetes(t, 7),
        iris(t, 7),
        breast_cancer(t, 7),
    ]


def spike_tuning_tables(t: int) -> list[LossTable]:
    """The tables that chose the Tsallis learner's scale rules (D at most doubles per
    update, estimates cut at ``TSALLIS_CUT``·D, no upper bound on a rare arm's estimate)."""
    return [
        one_arm_spikes(t, 2, 3, 0.1, 30.0),
        one_arm_spikes(t, 2, 4, 0.01, 300.0),
        one_arm_spikes(t, 2, 5, 0.02, 25.0),
        one_arm_spikes(t, 5, 6, 0.05, 40.0),
        scale_jump(t, 8, 3),
        outlier(t, 10, 1),
    ]


def spike_held_out(t: int) -> list[LossTable]:
    """Spikes (several rates and sizes, the spiking arm worse or better), ×100 and ×0.01
    scale jumps between regimes, contextual tables with close arms: seeds and parameters
    the constants never saw."""
    return [
        one_arm_spikes(t, 2, 17, 0.1, 30.0),
        one_arm_spikes(t, 2, 18, 0.05, 60.0),
        one_arm_spikes(t, 2, 19, 0.005, 600.0),
        one_arm_spikes(t, 4, 20, 0.2, 4.0),
        one_arm_spikes(t, 8, 21, 0.03, 20.0, other=0.9),
        scale_jump(t, 8, 17),
        scale_jump(t, 8, 18, factor=0.01),
        scale_jump(t, 4, 19, at=0.3),
        close_contextual(t, 10, 4, 17),
        close_contextual(t, 5, 8, 18, gap=0.03),
    ]


def held_out_adversarial(t: int) -> list[LossTable]:
    return [
        ftl_breaker(t, 2, 7),
        delayed_switch(t, 10, 7),
        spiky(t, 10, 7),
        piecewise_stationary(t, 10, 4, 7),
    ]


def tsi(variant: Any, kind: str, label: str) -> Contender:
    build = _tsi_fixed if kind == "fixed" else _tsi_matched
    return Contender(
        label, "tsi", partial(build, variant=variant), contextual=kind != "fixed", variant=None
    )


def contenders(scales: list[float] | None = None) -> list[Contender]:
    out = [
        tsi("paper", "matched", "paper"),
        tsi("robust", "matched", "robust"),
        tsi("adaptive", "matched", "adaptive"),
        tsi("bobw", "matched", "bobw"),
    ]
    for s in scales or ():
        v = replace(VARIANTS["bobw"], name=f"bobw c={s:g}", tsallis_scale=float(s))
        out.append(tsi(v, "matched", f"bobw c={s:g}"))
    out += [
        Contender(
            BASELINES[0], "baseline", lambda env, n, seed: ThompsonNIG(n, env.shape[1], seed)
        ),
        Contender(
            BASELINES[1], "baseline", lambda env, n, seed: EpsilonGreedy(n, env.shape[1], seed)
        ),
    ]
    return out


def run_tables(tables: list[LossTable], players: list[Contender], seeds: int) -> list[dict]:
    rows = []
    for env in tables:
        row: dict[str, Any] = {"table": env.name, "T": env.shape[0], "M": env.shape[1]}
        for c in players:
            out = play(env, c, seeds, seed=0)
            row[c.name] = (
                float(out.regret.mean()),
                float(out.regret.std(ddof=1) / math.sqrt(seeds)),
            )
            log(f"{env.name}: {c.name} {row[c.name][0]:.1f}")
        if env.name == "piecewise_stationary":  # bobw's Fixed class beside its Switching class
            out = play(env, tsi("bobw", "fixed", "bobw (fixed)"), seeds, seed=0)
            row["bobw (fixed)"] = (
                float(out.regret.mean()),
                float(out.regret.std(ddof=1) / math.sqrt(seeds)),
            )
        rows.append(row)
    return rows


def table_markdown(rows: list[dict], names: list[str]) -> str:
    head = "| table | " + " | ".join(names) + " | bobw / best baseline |"
    lines = [head, "|---|" + "---:|" * (len(names) + 1)]
    for row in rows:
        best = min(row[b][0] for b in BASELINES if b in row)
        cells = [f"{row[n][0]:,.1f} ± {row[n][1]:,.1f}" if n in row else "" for n in names]
        ratio = row["bobw"][0] / best if best > 0 else float("nan")
        lines.append(f"| {row['table']} | " + " | ".join(cells) + f" | {ratio:.2f} |")
    return "\n".join(lines)


#: the tables of the growth part: (label, table of T rounds); the contextual ones are
#: held out (close arms, ``spike_held_out``'s family) and tuning (``tuning_tables``)
GROWTH_TABLES = (
    ("Bernoulli, held-out seed", lambda t: bernoulli(t, 10, 11)),
    ("close contextual, held-out seed", lambda t: close_contextual(t, 10, 4, 3)),
    ("contextual, tuning seed", lambda t: contextual(t, 10, 4, 1)),
)


def growth(seeds: int, short: int, long: int) -> dict:
    """Regret at T = long against T = short, each table of ``GROWTH_TABLES``: bobw and
    robust with their class matched to the table, Thompson sampling (one copy per context)."""
    out: dict[str, dict[str, list[float]]] = {}
    for label, table in GROWTH_TABLES:
        out[label] = {}
        for name, c in (
            ("bobw", tsi("bobw", "matched", "bobw")),
            ("robust", tsi("robust", "matched", "robust")),
            (BASELINES[0], contenders()[-2]),
        ):
            figures = [float(play(table(t), c, seeds, seed=0).regret.mean()) for t in (short, long)]
            log(f"growth {label} {name}: {figures[0]:.1f} -> {figures[1]:.1f}")
            out[label][name] = figures
    return out


def user_tables(kind: str, n_users: int, rounds: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(losses (T, N, M), expected losses (T, N, M)) of ``n_users`` short bandits.

    "diabetes": each user is ``rounds`` patients drawn from the diabetes data, the arms the
    ten forecasting rules (loss = absolute error; expected = realised). "bernoulli": each
    user has 10 arms with means uniform in [0, 1] (expected = the means)."""
    rng = np.random.default_rng(seed)
    if kind == "diabetes":
        forecasts, targets = diabetes_forecasts()
        rows = rng.integers(len(targets), size=(rounds, n_users))
        losses = np.abs(forecasts[rows] - targets[rows][..., None])
        return losses, losses
    means = rng.random((n_users, 10))
    losses = (rng.random((rounds, n_users, 10)) < means[None]).astype(float)
    return losses, np.broadcast_to(means[None], losses.shape)


def user_share(policy: Any, losses: np.ndarray, expected: np.ndarray) -> dict[str, float]:
    """One policy (``n`` instances) on ``n`` per-user tables (T, n, M): its regret against
    each user's best fixed arm (in expectation), as a share of uniform play's, and the share
    of users where it does worse than uniform play."""
    t_rounds, n, _ = losses.shape
    best = expected.sum(axis=0).min(axis=1)
    uniform = expected.mean(axis=2).sum(axis=0) - best
    idx = np.arange(n)
    total = np.zeros(n)
    for t in range(t_rounds):
        tickets = policy.select()
        arms = np.asarray(tickets.arms)
        total += expected[t, idx, arms]
        policy.update(tickets, losses[t, idx, arms])
    regret = total - best
    return {
        "regret": float(regret.mean()),
        "of_uniform": float(regret.sum() / uniform.sum()),
        "worse_than_uniform": float((regret > uniform).mean()),
    }


def per_user(kind: str, n_users: int, rounds: int, seed: int) -> dict:
    """``user_share`` of bobw, robust and the two baselines on ``user_tables``."""
    losses, expected = user_tables(kind, n_users, rounds, seed)
    _, n, m = losses.shape
    out: dict[str, Any] = {"users": n, "rounds": rounds, "arms": m}
    players = {
        "bobw": BatchBandit(n, m, seed=seed, variant="bobw"),
        "robust": BatchBandit(n, m, seed=seed, variant="robust"),
        BASELINES[0]: ThompsonNIG(n, m, seed),
        BASELINES[1]: EpsilonGreedy(n, m, seed),
    }
    for name, policy in players.items():
        out[name] = user_share(policy, losses, expected)
        log(f"users {kind}: {name} {out[name]}")
    return out


def tuning_part(t: int, seeds: int, scales: list[float]) -> tuple[dict[str, Any], list[str]]:
    """The tables that chose the constants (the rate's and the scale rules'), with each
    rate scale of ``scales``."""
    players = contenders(scales)
    rows = run_tables(tuning_tables(t) + spike_tuning_tables(t), players, seeds)
    text = ["### Tuning tables (chose the constants)", ""]
    return {"tuning": rows}, [*text, table_markdown(rows, [c.name for c in players]), ""]


def held_out_part(t: int, seeds: int, names: list[str]) -> tuple[dict[str, Any], list[str]]:
    """The held-out stationary and adversarial tables, and bobw's ratios to the best
    baseline on the stationary ones."""
    players = contenders()
    rows = run_tables(held_out_stationary(t), players, seeds)
    ratios = [r["bobw"][0] / min(r[b][0] for b in BASELINES) for r in rows]
    geo = math.exp(sum(math.log(max(x, 1e-9)) for x in ratios) / len(ratios))
    adversarial = run_tables(held_out_adversarial(t), players, seeds)
    text = [
        "### Held-out stationary tables", "", table_markdown(rows, names), "",
        f"bobw / best baseline: max {max(ratios):.2f}, geometric mean {geo:.2f}", "",
        "### Held-out adversarial tables", "",
        table_markdown(adversarial, [*names, "bobw (fixed)"]), "",
    ]  # fmt: skip
    found = {
        "held_out_stationary": rows,
        "stationary_ratios": ratios,
        "held_out_adversarial": adversarial,
    }
    return found, text


def spikes_part(t: int, seeds: int, names: list[str]) -> tuple[dict[str, Any], list[str]]:
    """One-arm spikes, scale jumps and close contextual arms: the tuning tables of the
    scale rules, then held-out ones, with bobw's ratio to Thompson sampling and robust."""
    players = contenders()
    found: dict[str, Any] = {}
    text: list[str] = []
    for key, title, tables in (
        ("spike_tuning", "the tables that chose the scale rules", spike_tuning_tables(t)),
        ("spike_held_out", "held-out tables", spike_held_out(t)),
    ):
        rows = run_tables(tables, players, seeds)
        for row in rows:
            row["bobw / Thompson"] = row["bobw"][0] / max(row[BASELINES[0]][0], 1e-9)
            row["bobw / robust"] = row["bobw"][0] / max(row["robust"][0], 1e-9)
        found[key] = rows
        text += [f"### Spikes and regimes: {title}", "", table_markdown(rows, names), ""]
        text += [
            f"- {r['table']}: bobw / Thompson {r['bobw / Thompson']:.2f}, "
            f"bobw / robust {r['bobw / robust']:.2f}"
            for r in rows
        ]
        text.append("")
    return found, text


def growth_part(t: int, seeds: int) -> tuple[dict[str, Any], list[str]]:
    """Regret at 10·T against T on a stationary table."""
    g = growth(seeds, t, 10 * t)
    text = ["### Growth: regret at 10·T against T", ""]
    for label, rows in g.items():
        text += [f"{label}:", ""]
        text += [f"- {k}: {a:.1f} → {b:.1f} (×{b / a:.2f})" for k, (a, b) in rows.items()]
        text.append("")
    return {"growth": g}, text


def users_part(n_users: int) -> tuple[dict[str, Any], list[str]]:
    """Per-user bandits, as a share of uniform play's regret."""
    u = {
        "diabetes": per_user("diabetes", n_users, 50, 5),
        "bernoulli": per_user("bernoulli", n_users, 200, 5),
    }
    text = ["### Per-user bandits (regret as a share of uniform play's)", ""]
    for kind, figures in u.items():
        text += [
            f"- {kind}, {figures['users']} users × {figures['rounds']} rounds: "
            + "; ".join(
                f"{k} {v['of_uniform']:.3f} "
                f"(worse than uniform: {100 * v['worse_than_uniform']:.0f}%)"
                for k, v in figures.items()
                if isinstance(v, dict)
            )
        ]
    return {"users": u}, [*text, ""]


def speed_part() -> tuple[dict[str, Any], list[str]]:
    """One instance's rounds per second, robust against bobw, at 10 and 1,000 arms."""
    speeds = {}
    for name in ("robust", "bobw"):
        c = Contender(name, "tsi", None, variant=name)
        for m in (10, 1000):
            speeds[f"{name} M={m}"] = single_instance_speed(
                c, m, 2000 if m == 10 else 300, repeats=5
            ).rounds_per_s
    text = ["### Speed: one instance, rounds per second (median of 5)", ""]
    return {"speed": speeds}, [*text, *(f"- {k}: {v:,.0f}" for k, v in speeds.items()), ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--part",
        nargs="*",
        default=["tuning", "held-out", "spikes", "growth", "users", "speed"],
    )
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=10_000)
    parser.add_argument("--scales", type=float, nargs="*", default=[])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    t = 1000 if args.quick else args.rounds
    seeds = 3 if args.quick else args.seeds
    results: dict[str, Any] = {
        "command": shlex.join(["python", "bench/bench_bobw.py", *sys.argv[1:]])
    }
    text = [f"Reproduce: `{results['command']}`; T = {t:,}, {seeds} seeds per cell.", ""]
    names = ["paper", "robust", "adaptive", "bobw", *BASELINES]
    parts = {
        "tuning": lambda: tuning_part(t, seeds, args.scales),
        "held-out": lambda: held_out_part(t, seeds, names),
        "spikes": lambda: spikes_part(t, seeds, names),
        "growth": lambda: growth_part(t, seeds),
        "users": lambda: users_part(100 if args.quick else 1000),
        "speed": speed_part,
    }
    for name, run in parts.items():
        if name in args.part:
            found, lines = run()
            results.update(found)
            text += lines
    body = "\n".join(text)
    print(body)
    if args.out:
        args.out.write_text(body + "\n")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
