"""The arena: tsi's variants beside baselines and peer libraries on the same loss tables.

    .venv/bin/python bench/bench_arena.py              # full run: 10,000 rounds
    .venv/bin/python bench/bench_arena.py --tsi-and-baselines   # the same without peers
    .venv/bin/python bench/bench_arena.py --quick      # smoke run: 500 rounds, 3 × 3

Every family of ``arena.lab.tables`` is scored on held-out draws (10 tables per family,
seeds no earlier choice saw, 10 instances each: ``--tables``, ``--seeds``); the tables that
chose the default's constants and the earlier presets are named in the report, and none of
them is scored (the FTL-breaker has no held-out draw: it is played on its tuning table).

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
from core_machine import machine_info

from arena.lab.tables import (
    CHOSE,
    FAMILIES,
    FIRST_HELD_OUT_SEED,
    NOT_HELD_OUT,
    SEEN,
    STATIONARY,
    Table,
    held_out,
)
from arena.report import (
    MARGIN,
    findings,
    frontier_table,
    frontier_verdict,
    geometric_mean,
    headline_table,
    per_table_ratios,
    plot_curves,
    plot_frontier,
    plot_regret,
    plot_speed,
    ratios_to_best,
    regret_table,
    section_of,
    speed_table,
    variant_summary,
    variant_table,
    worse,
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
    tsi_name,
)
from flows.tools.loss_table import LossTable
from tsi_core import VARIANTS
from tsi_core.variant import DEFAULT_VARIANT

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- arena:begin -->", "<!-- arena:end -->"


def log(message: str) -> None:
    print(f"[arena {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


#: the default as the service runs it (the environment's class), the paper's Algorithm 1
#: with the same class, and the stochastic baselines it is measured against
DEFAULT = tsi_name(DEFAULT_VARIANT, "matched class")
PAPER = tsi_name("paper", "matched class")
BEST_OF = ("Thompson (NIG)", "ε-greedy (range-free)")
#: the default's targets: the default's regret at most PER_TABLE times the best of ``BEST_OF``
#: on every stationary table and GEO_MEAN times in geometric mean; on the adversarial
#: families at most the paper's plus PAPER_MARGIN of it
PER_TABLE, GEO_MEAN, PAPER_MARGIN = 1.5, 1.1, 0.10
#: the tuning table the FTL-breaker is played on (it has no held-out draw)
FTL_TABLE = Table("ftl_breaker", 1)
FRONTIER = ROOT / "bench" / "bobw" / "frontier.json"
SPIKES = ROOT / "bench" / "bobw" / "spikes.md"
SCALE_RULES = ROOT / "bench" / "bobw" / "scale_rules.md"
ESTIMATE_BOUND = ROOT / "bench" / "bobw" / "estimate_bound.md"
CLOCKS = ROOT / "bench" / "bobw" / "clocks.md"


def environments(n_rounds: int, n_tables: int) -> dict[str, list[LossTable]]:
    """Family -> its held-out draws (``arena.lab.tables.held_out``), in ``FAMILIES``'
    order; the FTL-breaker's one table."""
    draws: dict[str, list[LossTable]] = {f: [] for f in FAMILIES}
    for table in held_out(n_tables):
        draws[table.family].append(table.build(n_rounds))
    draws[FTL_TABLE.family] = [FTL_TABLE.build(n_rounds)]
    return draws


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
        "## Arena: tsi's variants beside baselines and peers, scored on held-out tables",
        "",
        f"Reproduce: `{results['command']}` ({results['wall_seconds']:.0f} s on the machine "
        f"below, load average {results['load_average'][0]:.1f} at the end; `--quick` for a "
        f"smoke run). Raw figures: `{results['out_dir']}/arena.json`.",
        "",
        f"- CPU: {m['cpu_model']} ({m['usable_cpus']} usable); Python {m['python']}, "
        f"numpy {m['numpy']}; {m['platform']}",
        f"- {plan['rounds']:,} rounds{plan['rounds_note']}. Every family is scored on "
        f"{plan['tables']} held-out tables (table seeds {plan['held_out_seeds']}, drawn "
        f"afresh: none chose anything or was scored before), {plan['seeds']} independent "
        f"instances on each (algorithm seeds {plan['seed']} + the draw's index): "
        f"{plan['tables'] * plan['seeds']} runs per cell with the raw losses. The other two "
        "transforms show invariance (or its lack), which one table shows: they run on each "
        f"family's first held-out draw ({plan['seeds']} instances). The FTL-breaker has no "
        f"held-out draw (every seed is the same table up to arm labels): it is played on "
        f"its tuning table ({FTL_TABLE.family} seed {FTL_TABLE.seed}), {plan['seeds']} "
        "instances, and marked so.",
        "- Cell: mean ± standard deviation over all runs of the cell (tables × instances) of "
        "regret / (D·√(MT)), D = range of the table, against the competitor the environment "
        "is built for (best fixed arm; best sequence with the environment's number of "
        "switches for piecewise; best context → arm map for the contextual ones). Regret "
        "uses the expected loss q·l where an algorithm exposes q. Bold: best in the row. "
        "† failure, ~ silent degradation (see findings). Baselines without contexts play "
        "one copy per context.",
        "- Families (`arena.lab.tables.FAMILIES`, built by `arena.lab.environments` and "
        "`arena.lab.datasets`): Bernoulli, Gaussian, heavy-tailed Student-t with df 2.5, "
        "piecewise stationary (4 switches), FTL-breaker, contextual (4 contexts), `outlier` "
        "(a Bernoulli table whose round T/10 is max + 10^4·range for every arm, "
        "regret-neutral but a trap for a running range estimate; its D includes the spike, "
        "so its figures are ~1e-4: compare by ratios), `delayed_switch` (the best arm "
        "turns worst at 0.6·T), `spiky` (rare arm-specific losses 50 ranges high), and real "
        "data bundled with scikit-learn: digits and wine (arm = guessed class, k-means "
        "contexts; a draw's seed sets the order of the samples and the clustering), "
        "diabetes (10 fixed forecasting rules, loss = absolute error in the target's units, "
        "about 0 to 250; a draw's seed sets which patients arrive).",
        "- tsi runs every preset of `tsi_core.VARIANTS` ("
        + ", ".join(f"`{v}`" for v in plan["variants"])
        + f"; `tsi (…)` is the paper's Algorithm 1; the default is `{plan['default']}`), "
        "each with fixed arms and with the matched competition class.",
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


def split_lines(plan: dict[str, Any]) -> list[str]:
    """The report's section naming the tables that chose the default (and the earlier
    presets), those scored before, and the held-out draws."""
    by_choice: dict[tuple[str, str], list[str]] = {}
    for c in CHOSE:
        by_choice.setdefault((c.chose, c.source), []).append(f"{c.table.family} {c.table.seed}")
    lines = [
        "### Which tables chose the default, and which are held out",
        "",
        "Tables are named *family seed* (`arena.lab.tables`; the seeds of the arena's "
        "old suite are `suite_seeds(0)`). None of the tables below is scored here but "
        f'{FTL_TABLE.family} {FTL_TABLE.seed} (see "Not held out").',
        "",
    ]
    lines += [
        f"- **Chose {what}** ({source}): " + ", ".join(tables) + "."
        for (what, source), tables in by_choice.items()
    ]
    lines += [
        "- **Scored before, chose nothing** (the arena's other seed-0 tables; "
        "bench_bobw's held-out and growth tables, whose frontier is below): "
        + ", ".join(f"{t.family} {t.seed}" for t in SEEN)
        + ". bench_bobw's iris and breast-cancer tables and its synthetic rare-loss table "
        "(tuning for a second attempt whose changes were not kept) are not arena families.",
        f"- **Held out** (chose nothing, never scored before): every family but "
        f"{', '.join(NOT_HELD_OUT)}, table seeds {plan['held_out_seeds']}. The data sets of "
        "digits, wine and diabetes are the same as in earlier runs: a draw is held out in "
        "the order of the samples and the clustering, not in the data.",
        f"- **Not held out**: {', '.join(NOT_HELD_OUT)} (every seed is the same table up to "
        "the labels of its two arms, so every draw is a table that chose `bobw`'s "
        'constants); its row is marked "no".',
        "",
    ]
    return lines


def headline_lines(outcomes: list, plan: dict[str, Any]) -> list[str]:
    """The held-out headline: the default against the best stochastic baseline and the
    paper per family, and the default's targets as this run measures them."""
    families = list(dict.fromkeys(o.environment for o in outcomes))
    held = [f for f in families if f not in NOT_HELD_OUT]
    stationary = [f for f in held if f in STATIONARY]
    cells = {(o.environment, o.contender): o for o in outcomes if o.transform == "identity"}
    lines = [
        f"### Headline: the default (`{DEFAULT_VARIANT}`) on held-out tables",
        "",
        f"Mean normalised regret with the raw losses over {plan['tables']} held-out tables "
        f"× {plan['seeds']} instances per family (the FTL-breaker: its tuning table, "
        f"{plan['seeds']} instances). `{DEFAULT}` is the default with the family's class "
        "(Fixed, Contextual, or Switching with `robust`'s round on piecewise); ratios are "
        "of the means; best of the row over every contender.",
        "",
        headline_table(outcomes, DEFAULT, PAPER, BEST_OF, held),
        "",
    ]
    lines += _family_ratio_lines(ratios_to_best(outcomes, DEFAULT, BEST_OF, stationary))
    lines += _per_table_lines(
        per_table_ratios(outcomes, DEFAULT, BEST_OF, stationary, plan["seeds"])
    )
    lines += _adversarial_lines(held, cells)
    lines += _ftl_lines(cells, plan)
    return [*lines, ""]


def _family_ratio_lines(ratios: dict[str, float]) -> list[str]:
    """The stationary held-out families' ratios of means against the default's targets."""
    if not ratios:
        return []
    geo = geometric_mean(list(ratios.values()))
    over = [f"{f} ×{r:.2f}" for f, r in ratios.items() if r > PER_TABLE]
    return [
        f"- Stationary held-out families ({len(ratios)}): default / best of "
        f"({', '.join(BEST_OF)}) from ×{min(ratios.values()):.2f} to "
        f"×{max(ratios.values()):.2f}, geometric mean ×{geo:.2f} "
        f"(target: ≤ {PER_TABLE} on every table, ≤ {GEO_MEAN} in geometric mean); "
        + (f"above ×{PER_TABLE}: {', '.join(over)}." if over else f"none above ×{PER_TABLE}.")
    ]


def _per_table_lines(per_table: dict[str, np.ndarray]) -> list[str]:
    """The stationary held-out tables one by one: the worst, the geometric mean, and how
    many exceed the per-table target."""
    if not per_table:
        return []
    every = np.concatenate(list(per_table.values()))
    k, worst = max(
        ((k, (f, r)) for f, rs in per_table.items() for k, r in enumerate(rs)),
        key=lambda x: x[1][1],
    )
    above = [
        f"{f} {int((rs > PER_TABLE).sum())}/{len(rs)}"
        for f, rs in per_table.items()
        if (rs > PER_TABLE).any()
    ]
    return [
        f"- Per table ({len(every)} stationary held-out tables; the default's mean over "
        "its instances / the better of the two baselines' on the same table): worst "
        f"×{worst[1]:.2f} ({worst[0]} seed {FIRST_HELD_OUT_SEED + k}), geometric mean "
        f"×{geometric_mean(list(every)):.2f}; tables above ×{PER_TABLE}: "
        f"{int((every > PER_TABLE).sum())}" + (f" ({', '.join(above)})." if above else ".")
    ]


def _adversarial_lines(held: list[str], cells: dict[tuple[str, str], Any]) -> list[str]:
    """Each held-out adversarial family: the default against the paper's variant."""
    lines = []
    for f in held:
        if f in STATIONARY or (f, DEFAULT) not in cells or (f, PAPER) not in cells:
            continue
        mine, paper = cells[(f, DEFAULT)].mean, cells[(f, PAPER)].mean
        verdict = "worse" if worse(mine, paper, PAPER_MARGIN) else "not worse"
        lines.append(
            f"- {f}: default {mine:.3f} against the paper's {paper:.3f}: {verdict} than the "
            f"paper + {100 * PAPER_MARGIN:.0f}% (the target on adversarial tables)."
        )
    return lines


def _ftl_lines(cells: dict[tuple[str, str], Any], plan: dict[str, Any]) -> list[str]:
    """The default's regret on the FTL-breaker (its tuning table), if it was run."""
    ftl = cells.get((FTL_TABLE.family, DEFAULT))
    if ftl is None:
        return []
    return [
        f"- FTL-breaker (tuning table, not held out): the default's regret "
        f"{ftl.regret.mean():.1f} ± {ftl.regret.std(ddof=1):.1f} in loss units at "
        f"T = {plan['rounds']:,} (target: ≤ 35 at T = 10^4)."
    ]


#: why the frontier has no point that meets every target (the figures it cites are in
#: bench/bobw/estimate_bound.md and rate_choice.md)
WHY_THE_FRONTIER = (
    "Why no constant meets them all. A larger c exploits sooner: the q of an arm behind the "
    "leader falls like 1/c², so the stationary tables explore less and diabetes (ten "
    "rules 5-15 apart under noise of about 38, where ε-greedy's greed fits) improves. But a "
    "run that pushes the best arm away early (an unlucky draw while q is small) rarely "
    "brings it back: an arm behind the leader is played with q ∝ S/(c²·distance²), and the "
    "clock S = Σ(1 − q) grows like log t once play settles, so that q stays small. A wider "
    "bound on negative estimates, a floor or a reset from each arm's observed mean does not "
    "bring those runs back without costing the stationary tables more; a clock that grows "
    'with the rounds does, at a larger cost (bench/bobw/estimate_bound.md, "Rules tried '
    "against lock-ins under each arm's own scale\"). Since each arm keeps its own mean "
    "squared gap in D, D no longer "
    "shrinks on the arms that are played, and the one-arm spike tables stay within 1.5× "
    "Thompson sampling up to c = 2 (one scale over every gap locked 9 runs of 40 on the "
    "4-arm table at c = 2); lock-ins still multiply with c above 2 on the spike "
    "tables, in some Bernoulli runs and at 10^5 rounds on close contextual arms; a smaller c "
    "locks in less and explores more. The FTL-breaker's regret is not monotone in c (it "
    "depends on how long play looks settled on the alternating sequence); per-user bandits "
    "of 50 rounds stay at 0.95-0.99× Thompson sampling at every c. These held-out tables "
    "cannot choose c without ceasing to be held out; on the tables that chose it the "
    "Bernoulli, Gaussian, heavy-tailed and contextual tables sum to 403 at c = 2, 447 at "
    "1.75 and 458 at 2.5 over 400 seeds (bench/bobw/estimate_bound.md; over the 40 seeds "
    "of rate_choice.md lock-ins in a few Bernoulli runs make them 491, 406 and 402), so the "
    "preset stays 2 and the worst stationary table, growth, the FTL-breaker and the "
    "per-user target are the ones that gave way. Every point has the bound on a negative "
    "estimate at 0.75/(η̃·sqrt(q)), chosen on the same tables."
)


def frontier_lines(plots_dir: Path) -> tuple[list[str], Path]:
    """The "Best of both worlds: the frontier" section, from ``bench/bobw/frontier.json``
    (``bench/bobw_frontier.py``): every target against the rate constant c, which target
    gives way, and why; and its plot."""
    found = json.loads(FRONTIER.read_text())
    rows, preset = found["frontier"], VARIANTS["bobw"].tsallis_scale
    plot = plot_frontier(rows, preset, plots_dir / "frontier.png")
    worst = {r["c"]: r["worst_table"] for r in rows}
    lines = [
        "### Best of both worlds: the frontier",
        "",
        f"From `bench/bobw/frontier.json` (`{found['command']}`; T = {found['rounds']:,}, "
        f"{found['seeds']} seeds per table, each ratio's reference measured in the same run): "
        "`bobw`'s rate constant c against every target of the default, on tables the constant "
        "was not chosen on: bench_bobw's held-out stationary tables (best of Thompson NIG and "
        "ε-greedy), its held-out one-arm spike, scale-jump and close-contextual tables, the "
        "FTL-breaker (seed 7: the tuning table up to arm labels), 1,000 per-user diabetes "
        "bandits of 50 rounds, and the selections changed under 1000·l + 10^6, 1000·l, l + 3 "
        "and 10^-4·l − 3 over 2·10^4 rounds × 6 instances of real forecast errors and of a "
        "trend with ×100 regimes (Fixed and Contextual), and regret at 10·T against T on a "
        "held-out close contextual table. ✓: meets the target. "
        f"Plot: [frontier.png](arena/{plot.name}).",
        "",
        frontier_table(rows, preset),
        "",
        "Worst stationary table per c: "
        + ", ".join(f"{c:g}: {name}" for c, name in worst.items())
        + ".",
        "",
        "Which targets the preset misses, and what meeting each would cost:",
        "",
        *frontier_verdict(rows, preset),
        "",
        WHY_THE_FRONTIER,
        "",
    ]
    return lines, plot


def spikes_lines() -> list[str]:
    """The "Spikes and regimes" section: the default's scale rules on one-arm spikes, scale
    jumps and close contextual arms (held out), quoted from ``bench/bobw/spikes.md``
    (bench_bobw's ``spikes`` part), and the frontier of those rules
    (``bench/bobw/scale_rules.md``)."""
    found = SPIKES.read_text()
    rules = SCALE_RULES.read_text()
    return [
        "### Spikes and regimes (quoted from bench/bobw/spikes.md, scale_rules.md)",
        "",
        found.splitlines()[0],
        "",
        "Held-out tables:",
        "",
        section_of(found, "### Spikes and regimes: held-out tables"),
        "",
        section_of(rules, "### Frontier: the estimate's cut K and D's growth bound G "
                   "(tuning tables, before the grid)"),
        "",
    ]  # fmt: skip


def lock_in_lines() -> list[str]:
    """The frontier of the rules tried against lock-in (a context or an arm settled on its
    second-best arm), quoted from ``bench/bobw/estimate_bound.md`` and ``clocks.md``."""
    bound, clocks = ESTIMATE_BOUND.read_text(), CLOCKS.read_text()
    tried = "## Tried and not kept (prototype of the clocks, `bench/bobw_sweep.py`, 10 seeds)"
    return [
        "### Lock-in: the estimate's bound and what was tried against it "
        "(quoted from bench/bobw/estimate_bound.md, clocks.md)",
        "",
        section_of(bound, "## c (the bound's constant)"),
        "",
        section_of(clocks, tried),
        "",
        "With 40 seeds (quoted from bench/bobw/estimate_bound.md):",
        "",
        section_of(bound, "## With 40 seeds: the runs that 10 seeds did not show"),
        "",
    ]


def report(
    results: dict[str, Any], outcomes: list, speeds: list, plots: list[Path], frontier: list[str]
) -> str:
    plan = results["plan"]
    lines = method_lines(results) + split_lines(plan) + headline_lines(outcomes, plan)
    for label, _, _ in TRANSFORMS:
        scope = (
            f"mean over {plan['tables']} held-out tables × {plan['seeds']} instances; "
            "the FTL-breaker: its tuning table"
            if label == "identity"
            else f"each family's first held-out table, {plan['seeds']} instances"
        )
        lines += [f"### Losses {label} ({scope})", "", regret_table(outcomes, label), ""]
    lines += variant_section(outcomes, plan["variants"])
    lines += frontier
    lines += spikes_lines() + lock_in_lines()
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
    parser.add_argument(
        "--tables", type=int, default=None, help="held-out tables per family (10; 3 with --quick)"
    )
    parser.add_argument(
        "--seeds", type=int, default=None, help="instances (seeds) per table (10; 3 with --quick)"
    )
    parser.add_argument("--seed", type=int, default=0, help="the first algorithm seed")
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
    parser.add_argument(
        "--quotes-only",
        action="store_true",
        help="rewrite only the sections quoted from bench/bobw (the frontier, spikes and "
        "regimes, lock-in) in the report and RESULTS.md, without running the arena",
    )
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


def replace_subsection(path: Path, lines: list[str]) -> None:
    """Put ``lines`` in place of the section of ``path`` whose heading is ``lines[0]`` (up
    to the next heading of the same level or higher)."""
    heading = lines[0]
    old = section_of(path.read_text(), heading)
    text = path.read_text()
    start = text.index(heading + "\n")
    end = text.index(old, start) + len(old) if old else start + len(heading) + 1
    path.write_text(text[:start] + "\n".join(lines).rstrip("\n") + text[end:])


def rewrite_quotes(out_dir: Path, results: Path) -> None:
    """The sections the report quotes from bench/bobw (the frontier, spikes and regimes,
    lock-in), rewritten in ``out_dir``/REPORT.md and ``results`` from those files alone."""
    sections = [frontier_lines(out_dir)[0], spikes_lines(), lock_in_lines()]
    for path in (out_dir / "REPORT.md", results):
        for lines in sections:
            replace_subsection(path, lines)
    print("\n".join(line for lines in sections for line in lines))


def main() -> None:
    args = parse_args()
    if args.quotes_only:
        rewrite_quotes(args.out_dir or ROOT / "bench" / "arena", args.results)
        return
    rounds = args.rounds or (500 if args.quick else 10_000)
    n_tables = args.tables or (3 if args.quick else 10)
    seeds = args.seeds or (3 if args.quick else 10)
    command = shlex.join(["python", "bench/bench_arena.py", *sys.argv[1:]])
    if args.out_dir is None:
        quick_dir = Path(tempfile.gettempdir()) / "tsi-arena-quick"
        args.out_dir = quick_dir if args.quick else ROOT / "bench" / "arena"
    t0 = time.perf_counter()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    envs = environments(rounds, n_tables)
    ours = tsi_contenders() + baseline_contenders()
    peers = [] if args.no_peers else peer_contenders(None if args.all_peers else DEFAULT_PEERS)
    players = ours + peers
    outcomes = run_arena(envs, ours, seeds, args.seed, progress=log)
    # peers loop in Python per instance, far slower than tsi (bench/RESULTS.md, "Figures
    # behind the code"): two transforms are enough to show what a shift and a scale do to them
    outcomes += run_arena(envs, peers, seeds, args.seed, TRANSFORMS[:2], progress=log)
    speeds = measure_speeds(players, args.quick)
    plots = make_plots(outcomes, speeds, args.out_dir)
    frontier, frontier_plot = frontier_lines(args.out_dir)
    out_dir = args.out_dir.resolve()
    draws = held_out(n_tables)
    results: dict[str, Any] = {
        "command": command,
        "out_dir": str(out_dir.relative_to(ROOT) if out_dir.is_relative_to(ROOT) else out_dir),
        "plan": {
            "rounds": rounds,
            "rounds_note": "" if rounds == 10_000 else " (the arena's default is 10,000)",
            "tables": n_tables,
            "seeds": seeds,
            "seed": args.seed,
            "held_out_seeds": f"{draws[0].seed}–{draws[0].seed + n_tables - 1}",
            "held_out": [[t.family, t.seed] for t in draws],
            "chose": [[c.table.family, c.table.seed, c.chose, c.source] for c in CHOSE],
            "seen": [[t.family, t.seed] for t in SEEN],
            "not_held_out": {f: [FTL_TABLE.family, FTL_TABLE.seed] for f in NOT_HELD_OUT},
            "default": DEFAULT_VARIANT,
            "variants": list(VARIANTS),
            "presets": {name: v.to_dict() for name, v in VARIANTS.items()},
        },
        "machine": machine_info(),
        "load_average": os.getloadavg(),
        "wall_seconds": time.perf_counter() - t0,
        "outcomes": [outcome_record(o) for o in outcomes],
        "speeds": [asdict(s) for s in speeds],
    }
    plots.append(frontier_plot)
    text = report(results, outcomes, speeds, plots, frontier)
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
