"""The arena: tsi's variants beside baselines and peer libraries on the same loss tables.

    .venv/bin/python bench/bench_arena.py              # full run: 10,000 rounds, 20 seeds
    .venv/bin/python bench/bench_arena.py --tsi-and-baselines   # the same without peers
    .venv/bin/python bench/bench_arena.py --quick      # smoke run: 500 rounds, 5 seeds

Writes ``REPORT.md``, PNG plots and raw figures (``arena.json``) to ``--out-dir``
(default ``bench/arena``; for ``--quick`` a directory under the system's temporary
directory, so a smoke run leaves the committed figures alone). A full run (not
``--quick``) also replaces the arena section of ``bench/RESULTS.md`` (between its
markers) with the latest tables.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from bench_core import machine_info

from arena.lab.datasets import diabetes, digits, wine
from arena.lab.environments import suite
from arena.report import (
    MARGIN,
    findings,
    plot_curves,
    plot_regret,
    plot_speed,
    regret_table,
    speed_table,
    variant_summary,
    variant_table,
)
from arena.runner import (
    DEFAULT_PEERS,
    TRANSFORMS,
    TSI_CLASSES,
    baseline_contenders,
    peer_contenders,
    run_arena,
    single_instance_speed,
    tsi_contenders,
)
from flows.tools.loss_table import LossTable
from tsi_core import VARIANTS

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- arena:begin -->", "<!-- arena:end -->"


def log(message: str) -> None:
    print(f"[arena {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def environments(n_rounds: int, seed: int) -> list[LossTable]:
    """The standard suite, then the real data sets (``arena.lab.datasets``)."""
    real = [digits(n_rounds, seed), wine(n_rounds, seed), diabetes(n_rounds, seed)]
    return [*suite(n_rounds, seed), *real]


def replace_section(path: Path, body: str) -> None:
    """Put ``body`` between the arena markers of ``path`` (appended the first time)."""
    text = path.read_text() if path.exists() else ""
    block = f"{BEGIN}\n{body}\n{END}"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + block + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)


def method_lines(results: dict[str, Any]) -> list[str]:
    """How the arena was run: the command, the machine, the cells, the environments and
    what each algorithm is told."""
    m, plan = results["machine"], results["plan"]
    return [
        "## Arena: tsi's variants beside baselines and peers (issue #4; outlier, "
        "heavy-tailed, diabetes and wine tables; range-free ε-greedy)",
        "",
        f"Reproduce: `{results['command']}` ({results['wall_seconds']:.0f} s on the machine "
        f"below; `--quick` for a smoke run). Raw figures: `{results['out_dir']}/arena.json`.",
        "",
        f"- CPU: {m['cpu_model']} ({m['usable_cpus']} usable); Python {m['python']}, "
        f"numpy {m['numpy']}; {m['platform']}",
        f"- {plan['rounds']:,} rounds, {plan['seeds']} seeds (independent instances) per cell, "
        f"the same loss tables for every algorithm; seed {plan['seed']}.",
        "- Cell: mean ± standard deviation over seeds of regret / (D·√(MT)), D = range of "
        "the table, against the competitor the environment is built for (best fixed arm; "
        "best sequence with the environment's number of switches for piecewise; best "
        "context → arm map for the contextual ones). Regret uses the expected loss q·l where "
        "an algorithm exposes q. Bold: best in the row. † failure, ~ silent degradation "
        "(see findings). Baselines without contexts play one copy per context.",
        "- Environments: the suite of `arena.lab.environments` (Bernoulli, Gaussian, "
        "heavy-tailed Student-t with df 2.5, piecewise stationary, FTL-breaker, contextual, "
        "and `outlier`: a Bernoulli table whose round T/10 is max + 10^4·range for every "
        "arm, regret-neutral but a trap for a running range estimate; its D includes the "
        "spike, so its figures are ~1e-4: compare by ratios), and real data bundled with "
        "scikit-learn (`arena.lab.datasets`): digits and wine (arm = guessed class, k-means "
        "contexts), diabetes (10 fixed forecasting rules, loss = absolute error in the "
        "target's units, about 0 to 250).",
        "- tsi runs every preset of `tsi_core.VARIANTS` ("
        + ", ".join(f"`{v}`" for v in plan["variants"])
        + "; `tsi (…)` is the paper's Algorithm 1), each with fixed arms and with the "
        "matched competition class.",
        "- Only `EXP3 (oracle)` is told the true loss range and horizon; `EXP3 (raw)`, "
        "EXP3-IX, EXP3.S and Tsallis-INF are tuned for losses in [0, 1] and get the raw "
        "losses, as a practitioner would; `EXP3 (running min/max)` rescales with the range "
        "seen so far; AHB adapts to the range by design; `ε-greedy (range-free)` plays the "
        "least empirical mean loss with probability 1 − ε_t, ε_t = min(1, 5M/t) (invariant: "
        "it compares means and never looks at the range); `Thompson (NIG)` samples a "
        "Student-t mean per arm from a normal-inverse-gamma posterior whose prior variance "
        "is the pooled variance of the losses seen (affine-invariant; scored by its realised "
        "losses). Peers (river, SMPyBandits, Vowpal "
        "Wabbit, MABWiser; versions and quirks in `arena/PEERS.md`) get reward = −loss (VW: "
        "cost = loss), their defaults, and the first two transforms only (they loop in "
        "Python per instance).",
        "",
    ]


def report(results: dict[str, Any], outcomes: list, speeds: list, plots: list[Path]) -> str:
    lines = method_lines(results)
    for label, _, _ in TRANSFORMS:
        lines += [f"### Losses {label}", "", regret_table(outcomes, label), ""]
    lines += variant_section(outcomes, results["plan"]["variants"])
    found = findings(outcomes)
    lines += ["### Findings (failures and degradation)", ""]
    lines += found or ["- none recorded"]
    lines += [
        "",
        "### Speed: one instance, select + update, median of 3",
        "",
        speed_table(speeds),
        "",
        "tsi runs its single-instance `Bandit`; the others run their policy with one instance.",
        "",
        "Plots: " + ", ".join(f"[{p.name}](arena/{p.name})" for p in plots),
    ]
    return "\n".join(lines)


def variant_section(outcomes: list, variants: list[str]) -> list[str]:
    """The report's "Variants against the paper's Algorithm 1" section."""
    pct = f"{100 * MARGIN:.0f}%"
    lines = [
        "### Variants against the paper's Algorithm 1",
        "",
        "Mean normalised regret per table (environment × transform) and, in brackets, the "
        "ratio to the paper's with the same competition class (the difference Δ where the "
        f"paper's regret is not positive). ▲ worse, ▼ better than the paper by more than {pct}: "
        f"value − paper > {MARGIN}·|paper| (value > {1 + MARGIN}·paper when paper > 0; a "
        "negative paper regret gets a margin of 5% of its size; no absolute floor, so "
        "the outlier table's ~1e-4 figures are compared relatively). best: the variant "
        "with the least mean (ties to the paper). The cells are means over seeds: a "
        "difference within a few percent may be noise (the spreads are in the tables above).",
        "",
    ]
    titles = {
        "fixed": "tsi competing with fixed arms",
        "matched class": "tsi with the matched class",
    }
    for kind in TSI_CLASSES:
        lines += [f"#### {titles.get(kind, kind)}", "", variant_table(outcomes, variants, kind), ""]
    lines += [*variant_summary(outcomes, variants), ""]
    return lines


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="smoke run")
    parser.add_argument(
        "--rounds", type=int, default=None, help="rounds per run (10,000; 500 with --quick)"
    )
    parser.add_argument("--seeds", type=int, default=None, help="instances (seeds) per cell")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--no-peers",
        "--tsi-and-baselines",
        dest="no_peers",
        action="store_true",
        help="skip peer libraries (tsi's variants and the baselines only)",
    )
    parser.add_argument("--all-peers", action="store_true", help="every peer adapter")
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        help="report, plots and raw figures (bench/arena; a temporary directory with --quick)",
    )
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "RESULTS.md")
    return parser.parse_args()


def measure_speeds(players: list, quick: bool) -> list:
    """Single-instance speed of every contender at M = 10 and M = 1000."""
    speeds = []
    for contender in players:
        for n_arms, n in ((10, 300 if quick else 2000), (1000, 50 if quick else 300)):
            log(f"speed: {contender.name}, M = {n_arms}")
            speeds.append(single_instance_speed(contender, n_arms, n))
    return speeds


def make_plots(outcomes: list, speeds: list, out_dir: Path) -> list[Path]:
    plots = [plot_regret(outcomes, out_dir / "regret.png")]
    for name in ("bernoulli", "piecewise_stationary", "contextual", "outlier"):
        plots.append(plot_curves(outcomes, name, out_dir / f"curves_{name}.png"))
    plots.append(plot_speed(speeds, out_dir / "speed.png"))
    return plots


def outcome_record(o: Any) -> dict[str, Any]:
    """The raw figures of one outcome, as written to ``arena.json``."""
    return {
        "contender": o.contender,
        "family": o.family,
        "environment": o.environment,
        "transform": o.transform,
        "normalised": o.normalised.tolist(),
        "expected": o.expected,
        "failures": [asdict(f) for f in o.failures[:20]],
        "n_failures": len(o.failures),
        "notes": list(o.notes),
        "checkpoints": o.checkpoints.tolist(),
        "curve_mean": o.curve.mean(axis=1).tolist(),
        "seconds": o.seconds,
    }


def main() -> None:
    args = parse_args()
    rounds = args.rounds or (500 if args.quick else 10_000)
    seeds = args.seeds or (5 if args.quick else 20)
    command = shlex.join(["python", "bench/bench_arena.py", *sys.argv[1:]])
    if args.out_dir is None:
        quick_dir = Path(tempfile.gettempdir()) / "tsi-arena-quick"
        args.out_dir = quick_dir if args.quick else ROOT / "bench" / "arena"
    t0 = time.perf_counter()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    envs = environments(rounds, args.seed)
    ours = tsi_contenders() + baseline_contenders()
    peers = [] if args.no_peers else peer_contenders(None if args.all_peers else DEFAULT_PEERS)
    players = ours + peers
    outcomes = run_arena(envs, ours, seeds, args.seed, progress=log)
    # peers loop in Python per instance, far slower than tsi (bench/RESULTS.md, "Figures
    # behind the code"): two transforms are enough to show what a shift and a scale do to them
    outcomes += run_arena(envs, peers, seeds, args.seed, TRANSFORMS[:2], progress=log)
    speeds = measure_speeds(players, args.quick)
    plots = make_plots(outcomes, speeds, args.out_dir)
    out_dir = args.out_dir.resolve()
    results: dict[str, Any] = {
        "command": command,
        "out_dir": str(out_dir.relative_to(ROOT) if out_dir.is_relative_to(ROOT) else out_dir),
        "plan": {
            "rounds": rounds,
            "seeds": seeds,
            "seed": args.seed,
            "variants": list(VARIANTS),
            "presets": {name: v.to_dict() for name, v in VARIANTS.items()},
        },
        "machine": machine_info(),
        "load_average": os.getloadavg(),
        "wall_seconds": time.perf_counter() - t0,
        "outcomes": [outcome_record(o) for o in outcomes],
        "speeds": [asdict(s) for s in speeds],
    }
    text = report(results, outcomes, speeds, plots)
    (args.out_dir / "REPORT.md").write_text(text + "\n")
    (args.out_dir / "arena.json").write_text(json.dumps(results, indent=1, default=_plain) + "\n")
    if not args.quick:
        replace_section(args.results, text)
    print(text)
    log(f"wrote {args.out_dir} in {results['wall_seconds']:.0f} s")


def _plain(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(f"not JSON: {x!r}")


if __name__ == "__main__":
    main()
