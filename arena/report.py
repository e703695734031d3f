"""The arena's outputs: a Markdown report and PNG plots of regret and speed.

>>> from arena.runner import Outcome
>>> import numpy as np
>>> o = Outcome("a", "tsi", "env", np.ones(3), np.array([0.1, 0.2, 0.3]), np.zeros((1, 3)),
...             np.array([1]), True)
>>> print(regret_table([o], "identity").splitlines()[2])
| env | **0.200 ± 0.100** |
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from arena.peers import Failure
from arena.runner import TSI_CLASSES, Outcome, Speed, tsi_name

#: a variant is worse (better) than the paper on a table when its mean normalised regret
#: exceeds (falls short of) the paper's by more than this fraction of |paper's|
MARGIN = 0.05


def _pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend (imported when a plot is made)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _contenders(outcomes: Sequence[Outcome]) -> list[str]:
    return list(dict.fromkeys(o.contender for o in outcomes))


def _environments(outcomes: Sequence[Outcome]) -> list[str]:
    return list(dict.fromkeys(o.environment for o in outcomes))


def _small(x: float) -> bool:
    """Too small for 3 decimals: the outlier table, whose range D includes its spike, has
    normalised regrets near 1e-4."""
    return x != 0.0 and abs(x) < 0.01


def _num(x: float) -> str:
    """3 decimals, or 3 significant digits for a small figure."""
    return f"{x:.2e}" if _small(x) else f"{x:.3f}"


def _pair(mean: float, spread: float) -> str:
    """mean ± spread, the spread in the mean's style."""
    return f"{_num(mean)} ± {spread:.1e}" if _small(mean) else f"{mean:.3f} ± {spread:.3f}"


def regret_table(outcomes: Sequence[Outcome], transform: str) -> str:
    """Environments × contenders: mean ± sd of the normalised regret; best in bold.

    A dagger marks a recorded failure (see the findings), a tilde silent degradation.
    """
    chosen = [o for o in outcomes if o.transform == transform]
    names = _contenders(chosen)
    cells: dict[tuple[str, str], Outcome] = {(o.environment, o.contender): o for o in chosen}
    lines = [
        "| Environment | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for env in _environments(chosen):
        row = [cells[(env, n)] for n in names if (env, n) in cells]
        best = min(o.mean for o in row)
        text = []
        for n in names:
            o = cells.get((env, n))
            if o is None:
                text.append("")
                continue
            cell = _pair(o.mean, o.spread)
            if o.mean == best:
                cell = f"**{cell}**"
            cell += " †" if o.failures else ""
            cell += " ~" if o.notes else ""
            text.append(cell)
        lines.append(f"| {env} | " + " | ".join(text) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------ variants
def worse(value: float, paper: float, margin: float = MARGIN) -> bool:
    """True when ``value`` exceeds ``paper`` by more than ``margin``·|paper|: value >
    1.05·paper when paper > 0; for a negative paper regret the margin is 5% of its size;
    paper = 0 makes any larger value worse. No absolute floor: near-zero figures (the
    outlier table's are ~1e-4) are compared relatively too.

    >>> worse(1.06, 1.0), worse(1.04, 1.0), worse(-0.94, -1.0), worse(-0.96, -1.0)
    (True, False, True, False)
    """
    return value - paper > margin * abs(paper)


def better(value: float, paper: float, margin: float = MARGIN) -> bool:
    """True when ``value`` falls short of ``paper`` by more than ``margin``·|paper|."""
    return paper - value > margin * abs(paper)


def _variant_means(
    outcomes: Sequence[Outcome], variants: Sequence[str]
) -> dict[tuple[str, str, str], dict[str, float]]:
    """(environment, transform, class) -> {variant: mean normalised regret}, for the
    tables where the paper's contender ran."""
    by_name = {(o.environment, o.transform, o.contender): o.mean for o in outcomes}
    tables = dict.fromkeys((o.environment, o.transform) for o in outcomes)
    out: dict[tuple[str, str, str], dict[str, float]] = {}
    for env, transform in tables:
        for kind in TSI_CLASSES:
            means = {
                v: by_name[(env, transform, tsi_name(v, kind))]
                for v in variants
                if (env, transform, tsi_name(v, kind)) in by_name
            }
            if "paper" in means:
                out[(env, transform, kind)] = means
    return out


def _versus(value: float, paper: float) -> str:
    """A variant's cell: its mean, its ratio to the paper's (the difference when the
    paper's is not positive), ▲ worse / ▼ better by more than the margin."""
    rel = f"×{value / paper:.2f}" if paper > 0 else f"Δ {value - paper:+.2g}"
    mark = " ▲" if worse(value, paper) else " ▼" if better(value, paper) else ""
    return f"{_num(value)} ({rel}){mark}"


def variant_table(outcomes: Sequence[Outcome], variants: Sequence[str], kind: str) -> str:
    """Environment × transform rows; per variant its mean normalised regret with the
    class ``kind`` ("fixed" or "matched class") and its ratio to the paper's; the best.

    >>> from arena.runner import Outcome
    >>> def o(name, mean):
    ...     return Outcome(name, "tsi", "env", np.ones(1), np.array([mean]),
    ...                    np.zeros((1, 1)), np.array([1]), True)
    >>> rows = [o("tsi (fixed)", 0.5), o("tsi robust (fixed)", 0.4)]
    >>> print(variant_table(rows, ["paper", "robust"], "fixed").splitlines()[2])
    | env | identity | 0.500 | 0.400 (×0.80) ▼ | robust |
    """
    means = _variant_means(outcomes, variants)
    shown = [v for v in variants if any(v in m for m in means.values())]
    lines = [
        "| Environment | Losses | " + " | ".join(shown) + " | best |",
        "|---|---|" + "---:|" * len(shown) + "---|",
    ]
    for (env, transform, k), row in means.items():
        if k != kind:
            continue
        paper = row["paper"]
        cells = [
            "" if v not in row else _num(paper) if v == "paper" else _versus(row[v], paper)
            for v in shown
        ]
        lines.append(f"| {env} | {transform} | " + " | ".join(cells) + f" | {_best(row)} |")
    return "\n".join(lines)


def _best(row: dict[str, float]) -> str:
    """The variant with the least mean regret (ties: the first, so the paper's)."""
    return min(row, key=row.__getitem__)


def variant_summary(outcomes: Sequence[Outcome], variants: Sequence[str]) -> list[str]:
    """One line per variant: on how many tables (environment × transform) it is worse /
    better than the paper by more than the margin, per class (the worse ones named with
    their ratio), and in how many (table, class) cells it is the best variant.

    >>> from arena.runner import Outcome
    >>> def o(name, env, mean):
    ...     return Outcome(name, "tsi", env, np.ones(1), np.array([mean]),
    ...                    np.zeros((1, 1)), np.array([1]), True)
    >>> rows = [o("tsi (fixed)", "a", 0.5), o("tsi robust (fixed)", "a", 0.6),
    ...         o("tsi (fixed)", "b", 0.5), o("tsi robust (fixed)", "b", 0.3)]
    >>> print(variant_summary(rows, ["paper", "robust"])[1])  # doctest: +NORMALIZE_WHITESPACE
    - **robust**: best variant on 1/2 (table, class) cells; fixed: worse on 1/2, better
    on 1/2. Worse on: a identity (fixed, 0.600 (×1.20) ▲)
    """
    means = _variant_means(outcomes, variants)
    lines = []
    for v in variants:
        rows = {key: row for key, row in means.items() if v in row}
        if not rows:
            continue
        wins = sum(_best(row) == v for row in rows.values())
        line = f"- **{v}**: best variant on {wins}/{len(rows)} (table, class) cells"
        named = []
        for kind in TSI_CLASSES if v != "paper" else ():
            mine = {key: row for key, row in rows.items() if key[2] == kind}
            if not mine:
                continue
            bad = [key for key, row in mine.items() if worse(row[v], row["paper"])]
            good = sum(better(row[v], row["paper"]) for row in mine.values())
            line += f"; {kind}: worse on {len(bad)}/{len(mine)}, better on {good}/{len(mine)}"
            for key in bad:
                named.append(
                    f"{key[0]} {key[1]} ({kind}, {_versus(mine[key][v], mine[key]['paper'])})"
                )
        lines.append(line + (". Worse on: " + ", ".join(named) if named else ""))
    return lines


def findings(outcomes: Sequence[Outcome]) -> list[str]:
    """Failures and degradation, one line per contender × transform × kind, naming the
    environments (with the instances affected and the first round)."""
    grouped: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for o in outcomes:
        kinds: dict[str, list[Failure]] = defaultdict(list)
        for f in o.failures:
            kinds[f.kind].append(f)
        for kind, found in kinds.items():
            instances = len({f.instance for f in found})
            first = min(f.round for f in found)
            grouped[(o.contender, o.transform, f"† {kind}")].append(
                f"{o.environment} ({instances}/{len(o.normalised)} instances, round {first})"
            )
        for note in o.notes:
            grouped[(o.contender, o.transform, f"~ {note}")].append(o.environment)
        if not o.expected:
            grouped[(o.contender, o.transform, "regret from realised losses (no q)")].append(
                o.environment
            )
    return [
        f"- {contender}, losses {transform}: {what} on {', '.join(envs)}"
        for (contender, transform, what), envs in grouped.items()
    ]


def speed_table(speeds: Sequence[Speed]) -> str:
    """Rounds per second of one instance, per contender and number of arms."""
    arms = sorted({s.n_arms for s in speeds})
    by = {(s.contender, s.n_arms): s for s in speeds}
    names = list(dict.fromkeys(s.contender for s in speeds))
    lines = [
        "| Algorithm | " + " | ".join(f"M = {m} (rounds/s)" for m in arms) + " |",
        "|---|" + "---:|" * len(arms),
    ]
    for n in names:
        cells = [f"{by[(n, m)].rounds_per_s:,.0f}" if (n, m) in by else "" for m in arms]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_regret(outcomes: Sequence[Outcome], path: Path) -> Path:
    """Grouped bars: normalised regret per environment and contender, one panel per transform."""
    plt = _pyplot()

    plt.style.use("default")  # a peer library may have changed the global style
    transforms = list(dict.fromkeys(o.transform for o in outcomes))
    names, envs = _contenders(outcomes), _environments(outcomes)
    fig, axes = plt.subplots(len(transforms), 1, figsize=(14, 3.6 * len(transforms)), sharex=True)
    axes = np.atleast_1d(axes)
    width = 0.8 / len(names)
    colours = plt.get_cmap("tab20")(np.linspace(0, 1, max(len(names), 2)))
    for ax, transform in zip(axes, transforms, strict=True):
        cells = {(o.environment, o.contender): o for o in outcomes if o.transform == transform}
        for j, name in enumerate(names):
            xs, ys, es = [], [], []
            for i, env in enumerate(envs):
                o = cells.get((env, name))
                if o is not None:
                    xs.append(i + (j - len(names) / 2 + 0.5) * width)
                    ys.append(o.mean)
                    es.append(o.spread)
            ax.bar(xs, ys, width, yerr=es, label=name, color=colours[j], capsize=1.5)
        ax.axhline(0.0, color="black", linewidth=0.5)
        ax.set_ylabel("regret / (D·√(MT))")
        ax.set_title(f"losses: {transform}")
    axes[-1].set_xticks(range(len(envs)), envs, rotation=15)
    axes[0].legend(ncol=min(len(names), 6), fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_curves(outcomes: Sequence[Outcome], environment: str, path: Path) -> Path:
    """Mean normalised regret against the best fixed arm over time, one panel per transform;
    one colour per contender throughout, line style by family (tsi, baseline, peer)."""
    plt = _pyplot()

    chosen = [o for o in outcomes if o.environment == environment]
    transforms = list(dict.fromkeys(o.transform for o in chosen))
    names = _contenders(chosen)
    colours = dict(zip(names, plt.get_cmap("tab20")(np.linspace(0, 1, len(names))), strict=True))
    styles = {"tsi": "-", "baseline": "--", "peer": ":"}
    with plt.style.context("default"):  # a peer library may have changed the global style
        fig, axes = plt.subplots(
            1, len(transforms), figsize=(6 * len(transforms), 4.6), sharey=True, squeeze=False
        )
        for ax, transform in zip(axes[0], transforms, strict=True):
            for o in (o for o in chosen if o.transform == transform):
                ax.plot(
                    o.checkpoints,
                    o.curve.mean(axis=1),
                    styles.get(o.family, "-"),
                    color=colours[o.contender],
                    linewidth=2.2 if o.family == "tsi" else 1.2,
                    label=o.contender,
                )
            ax.set_title(f"losses {transform}")
            ax.set_xlabel("round")
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel("regret vs best fixed arm / (D·√(MT))")
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 5), fontsize=8)
        fig.suptitle(environment)
        fig.tight_layout(rect=(0, 0.06 + 0.035 * (len(labels) // 5), 1, 1))
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return path


def plot_speed(speeds: Sequence[Speed], path: Path) -> Path:
    """Rounds per second (log scale) per contender at each number of arms."""
    plt = _pyplot()

    plt.style.use("default")  # a peer library may have changed the global style
    arms = sorted({s.n_arms for s in speeds})
    names = list(dict.fromkeys(s.contender for s in speeds))
    by = {(s.contender, s.n_arms): s.rounds_per_s for s in speeds}
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(names) * len(arms) + 1.5))
    height = 0.8 / len(arms)
    for j, m in enumerate(arms):
        ys = [i + j * height for i in range(len(names))]
        ax.barh(ys, [by.get((n, m), 0.0) for n in names], height, label=f"M = {m}")
    ax.set_yticks([i + height * (len(arms) - 1) / 2 for i in range(len(names))], names)
    ax.set_xscale("log")
    ax.set_xlabel("rounds per second, one instance (log scale)")
    ax.invert_yaxis()
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---------------------------------------------------------------- held out
def _ratio(value: float, best: float) -> str:
    """value / best, or the difference Δ when either is not positive.

    >>> _ratio(0.3, 0.2), _ratio(-0.05, 0.1)
    ('×1.50', 'Δ -0.15')
    """
    return f"×{value / best:.2f}" if best > 0 and value >= 0 else f"Δ {value - best:+.2g}"


def headline_table(
    outcomes: Sequence[Outcome],
    default: str,
    paper: str,
    baselines: Sequence[str],
    held_out: Sequence[str],
    transform: str = "identity",
) -> str:
    """Per family: the default's mean normalised regret beside the paper's and the
    ``baselines``', its ratio to the best of those baselines and to the paper, and the best
    contender of the row; ``held_out`` names the families scored on held-out draws.

    >>> from arena.runner import Outcome
    >>> def o(name, mean):
    ...     return Outcome(name, "tsi", "env", np.ones(2), np.array([mean, mean]),
    ...                    np.zeros((1, 2)), np.array([1]), True)
    >>> rows = [o("d", 0.3), o("p", 0.6), o("b1", 0.2), o("b2", 0.4)]
    >>> print(headline_table(rows, "d", "p", ["b1", "b2"], ["env"]).splitlines()[2])
    | env | yes | 0.300 ± 0.000 | 0.600 | 0.200 | 0.400 | ×1.50 | ×0.50 | b1 (0.200) |
    """
    cells = {(o.environment, o.contender): o for o in outcomes if o.transform == transform}
    lines = [
        f"| Family | held out | {default} | {paper} | "
        + " | ".join(baselines)
        + " | default / best of those baselines | default / paper | best of the row |",
        "|---|---|" + "---:|" * (len(baselines) + 4) + "---|",
    ]
    for env in _environments([o for o in outcomes if o.transform == transform]):
        if (env, default) not in cells:
            continue
        mine = cells[(env, default)]
        base = [cells[(env, b)].mean for b in baselines if (env, b) in cells]
        row = [o for (e, _), o in cells.items() if e == env]
        top = min(row, key=lambda o: o.mean)
        pap = cells.get((env, paper))
        lines.append(
            f"| {env} | {'yes' if env in held_out else 'no'} | {_pair(mine.mean, mine.spread)} | "
            + ("" if pap is None else _num(pap.mean))
            + " | "
            + " | ".join(_num(cells[(env, b)].mean) if (env, b) in cells else "" for b in baselines)
            + f" | {_ratio(mine.mean, min(base)) if base else ''}"
            + f" | {'' if pap is None else _ratio(mine.mean, pap.mean)}"
            + f" | {top.contender} ({_num(top.mean)}) |"
        )
    return "\n".join(lines)


def ratios_to_best(
    outcomes: Sequence[Outcome],
    default: str,
    baselines: Sequence[str],
    families: Sequence[str],
    transform: str = "identity",
) -> dict[str, float]:
    """Family -> the default's mean normalised regret / the least of ``baselines``', for
    the ``families`` where that least is positive."""
    cells = {(o.environment, o.contender): o.mean for o in outcomes if o.transform == transform}
    out = {}
    for env in families:
        base = [cells[(env, b)] for b in baselines if (env, b) in cells]
        if (env, default) in cells and base and min(base) > 0:
            out[env] = cells[(env, default)] / min(base)
    return out


def per_table_ratios(
    outcomes: Sequence[Outcome],
    default: str,
    baselines: Sequence[str],
    families: Sequence[str],
    n_seeds: int,
    transform: str = "identity",
) -> dict[str, np.ndarray]:
    """Family -> per draw, the default's mean normalised regret over its ``n_seeds``
    instances / the least of ``baselines``' on that draw (outcomes merged by
    ``arena.runner.merge``: the draws' instances side by side), where every least is
    positive.

    >>> from arena.runner import Outcome
    >>> def o(name, values):
    ...     return Outcome(name, "tsi", "env", np.ones(4), np.array(values),
    ...                    np.zeros((1, 4)), np.array([1]), True)
    >>> rows = [o("d", [1, 1, 3, 3]), o("b", [2, 2, 1, 1])]
    >>> per_table_ratios(rows, "d", ["b"], ["env"], 2)["env"].tolist()
    [0.5, 3.0]
    """
    cells = {(o.environment, o.contender): o for o in outcomes if o.transform == transform}
    out = {}
    for env in families:
        base = [cells[(env, b)].normalised for b in baselines if (env, b) in cells]
        if (env, default) not in cells or not base:
            continue
        least = np.min([b.reshape(-1, n_seeds).mean(axis=1) for b in base], axis=0)
        if (least > 0).all():
            out[env] = cells[(env, default)].normalised.reshape(-1, n_seeds).mean(axis=1) / least
    return out


def geometric_mean(values: Sequence[float]) -> float:
    """The geometric mean of positive ``values``.

    >>> round(geometric_mean([1.0, 4.0]), 6)
    2.0
    """
    if not values or min(values) <= 0:
        raise ValueError(f"geometric_mean needs positive values, got {list(values)!r}")
    return float(np.exp(np.mean(np.log(values))))


# ---------------------------------------------------------------- frontier
#: the default's targets on the frontier's columns, each an upper limit: (column, title, limit)
FRONTIER_TARGETS = (
    ("geo_mean", "stationary, geometric mean / best baseline", 1.1),
    ("max", "stationary, worst table / best baseline", 1.5),
    ("ftl_breaker", "FTL-breaker regret", 35.0),
    ("spikes_thompson", "one-arm spikes, worst / Thompson", 1.5),
    ("spikes_robust", "one-arm spikes, worst / robust", 1.0),
    ("regimes", "scale jumps, worst / best baseline", 1.5),
    ("close", "close contextual, worst / best baseline", 1.5),
    ("users", "per-user / Thompson", 0.9),
    ("growth", "close contextual, regret at 10·T / at T", 2.0),
    ("changed", "selections changed by rounding", 0.0),
)


def _met(row: dict[str, Any], column: str, limit: float) -> bool:
    return bool(row[column] <= limit)


def frontier_table(rows: Sequence[dict[str, Any]], preset: float) -> str:
    """The rate constant c against every target's figure (rows as
    ``bench/bobw/frontier.json`` holds them); the preset in bold, each figure that meets its
    target marked ✓.

    >>> row = {"c": 2, "geo_mean": 0.58, "max": 1.94, "ftl_breaker": 46.4,
    ...        "spikes_thompson": 3.9, "spikes_robust": 0.8, "regimes": 0.9, "close": 1.4,
    ...        "users": 0.94, "growth": 2.5, "changed": 0}
    >>> print(frontier_table([row], 2.0).splitlines()[-1])
    | **2 (preset)** | 0.58 ✓ | 1.94 | 46.4 | 3.90 | 0.80 ✓ | 0.90 ✓ | 1.40 ✓ | 0.94 | 2.50 | 0 ✓ |
    """
    head = " | ".join(f"{title} (≤ {limit:g})" for _, title, limit in FRONTIER_TARGETS)
    lines = [f"| c | {head} |", "|---:|" + "---:|" * len(FRONTIER_TARGETS)]
    for r in rows:
        c = f"**{r['c']:g} (preset)**" if r["c"] == preset else f"{r['c']:g}"
        cells = []
        for column, _, limit in FRONTIER_TARGETS:
            value = r[column]
            text = f"{value:.1f}" if column == "ftl_breaker" else f"{value:.2f}"
            text = f"{value:,}" if column == "changed" else text
            cells.append(text + (" ✓" if _met(r, column, limit) else ""))
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


Target = tuple[str, str, float]


def _costs(mine: dict[str, Any], other: dict[str, Any], targets: Sequence[Target]) -> str:
    """What ``other`` gives up against ``mine``: the targets ``mine`` meets and it misses,
    and those both miss where it is more than 10% further off."""
    lost = [t for k, t, x in targets if _met(mine, k, x) and not _met(other, k, x)]
    worse = [
        f"{t} {other[k]:.3g} against {mine[k]:.3g}"
        for k, t, x in targets
        if not _met(mine, k, x) and not _met(other, k, x) and other[k] > 1.1 * mine[k]
    ]
    parts = (["misses " + ", ".join(lost)] if lost else []) + (
        ["is further off on " + "; ".join(worse)] if worse else []
    )
    return ", which " + " and ".join(parts) if parts else ", at no cost on these targets"


def frontier_verdict(
    rows: Sequence[dict[str, Any]], preset: float, targets: Sequence[Target] = FRONTIER_TARGETS
) -> list[str]:
    """Which targets the preset misses, and for each the constants that meet it and what
    they give up (a target the preset meets, or a missed one by more than 10%).

    >>> rows = [{"c": 2, "max": 1.9, "ftl": 30, "sp": 3}, {"c": 4, "max": 1.2, "ftl": 50, "sp": 9},
    ...         {"c": 1, "max": 2.5, "ftl": 20, "sp": 2}]
    >>> targets = [("max", "W", 1.5), ("ftl", "F", 35), ("sp", "S", 1.5)]
    >>> for line in frontier_verdict(rows, 2, targets):
    ...     print(line)
    - W (≤ 1.5): the preset 1.9; met at c = 4, which misses F and is further off on S 9 against 3
    - S (≤ 1.5): the preset 3; met by no c
    """
    mine = {r["c"]: r for r in rows}[preset]
    lines = []
    for column, title, limit in targets:
        if _met(mine, column, limit):
            continue
        others = [r for r in rows if _met(r, column, limit)]
        head = f"- {title} (≤ {limit:g}): the preset {mine[column]:.4g}; "
        if not others:
            lines.append(head + "met by no c")
            continue
        met = [f"c = {r['c']:g}" + _costs(mine, r, targets) for r in others]
        lines.append(head + "met at " + "; ".join(met))
    return lines


def section_of(text: str, heading: str) -> str:
    """The body of the Markdown section whose heading line is ``heading``, up to the next
    heading of the same or a higher level.

    >>> section_of("# a\\nx\\n## b\\ny\\n\\n## c\\nz", "## b")
    'y'
    """
    lines = text.splitlines()
    if heading not in lines:
        raise ValueError(f"no section {heading!r} in the text")
    level = len(heading) - len(heading.lstrip("#"))
    body = []
    for line in lines[lines.index(heading) + 1 :]:
        hashes = len(line) - len(line.lstrip("#"))
        if 0 < hashes <= level and line[hashes : hashes + 1] == " ":
            break
        body.append(line)
    return "\n".join(body).strip("\n")


def plot_frontier(rows: Sequence[dict[str, Any]], preset: float, path: Path) -> Path:
    """FTL-breaker regret against the held-out stationary geometric-mean ratio, one point
    per rate constant c (the worst stationary table and the worst spike table over Thompson
    sampling beside it), the targets as lines."""
    plt = _pyplot()
    limits = {column: limit for column, _, limit in FRONTIER_TARGETS}
    with plt.style.context("default"):
        fig, ax = plt.subplots(figsize=(7, 4.6))
        xs = [r["ftl_breaker"] for r in rows]
        ax.plot(xs, [r["geo_mean"] for r in rows], "o-", label="geometric mean / best baseline")
        ax.plot(xs, [r["max"] for r in rows], "s:", color="grey", label="worst stationary table")
        ax.plot(xs, [r["spikes_thompson"] for r in rows], "^:", color="purple",
                label="worst spike table / Thompson")  # fmt: skip
        for r in rows:
            weight = "bold" if r["c"] == preset else "normal"
            ax.annotate(
                f"c={r['c']:g}" + (" (preset)" if r["c"] == preset else ""),
                (r["ftl_breaker"], r["geo_mean"]),
                textcoords="offset points",
                xytext=(4, 6),
                fontsize=8,
                fontweight=weight,
            )
        ax.axvline(limits["ftl_breaker"], color="red", linewidth=0.8, linestyle="--")
        ax.axhline(limits["geo_mean"], color="red", linewidth=0.8, linestyle="--")
        ax.axhline(limits["max"], color="orange", linewidth=0.8, linestyle="--")
        ax.set_yscale("log")
        ax.set_xlabel(f"FTL-breaker regret (T = 10^4; target ≤ {limits['ftl_breaker']:g}, dashed)")
        ax.set_ylabel("bobw / baseline (log)")
        ax.set_title("bobw's rate constant c: each target against the FTL-breaker")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return path
