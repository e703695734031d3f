"""The report's plots (matplotlib, Agg), each a ``*_figure`` function that draws it and a
``plot_*`` function that saves it as a PNG. The PNGs are deterministic: fixed sizes and
dpi, and no metadata that changes between runs (``save``), so the same stream gives the
same bytes.

>>> from flows.tools.report_data import ServedLog
>>> letters = [{"reason": "malformed_json"}, {"reason": "malformed_json"}]
>>> fig = dead_letters_figure(ServedLog([], [], letters))
>>> [t.get_text() for t in fig.axes[0].texts]
['2']
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from flows.tools.report_data import (
    ServedLog,
    _key,
    best_arm_hits,
    dead_letter_counts,
    truth_of,
    windowed,
)

DPI = 100
PNG_METADATA = {"Software": None}  # matplotlib writes its version there by default


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: Path) -> Path:
    """Write ``fig`` as a PNG with nothing in it that differs between runs, and close it."""
    fig.savefig(path, dpi=DPI, metadata=PNG_METADATA)
    _pyplot().close(fig)
    return path


def _panels(n: int, height: float, width: float = 5.0) -> tuple[Any, list[Any]]:
    fig, axes = _pyplot().subplots(1, max(n, 1), figsize=(width * max(n, 1), height), squeeze=False)
    return fig, list(axes[0])


def regret_figure(stream: ServedLog) -> Any:
    """Cumulative regret (with the truth) or observed loss over requests, per experiment."""
    names = stream.experiments()
    fig, axes = _panels(len(names), 3.8)
    for ax, name in zip(axes, names, strict=False):
        truth = truth_of(stream, name)
        if truth is not None:
            mu, arms = truth
            got = mu[np.arange(len(arms)), arms]
            ax.plot(np.cumsum(got - mu.min(axis=1)), "C0", label="tsi vs best arm for each request")
            best_fixed = mu[:, int(np.argmin(mu.sum(axis=0)))]
            ax.plot(np.cumsum(got - best_fixed), "C1", label="tsi vs best fixed arm")
            uniform = np.cumsum(mu.mean(axis=1) - mu.min(axis=1))
            ax.plot(uniform, "C2--", label="uniform play vs best arm for each request")
            ax.axhline(0.0, color="grey", linewidth=0.6)
            ax.set_ylabel("cumulative expected regret (loss units)")
        else:
            observed = stream.observed_losses(name)
            values = [observed.get(_key(s)) for s in stream.served(name)]
            ax.plot(np.cumsum([v for v in values if v is not None]), label="observed loss")
            ax.set_ylabel("cumulative observed loss")
        ax.set_title(name)
        ax.set_xlabel("requests")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


@dataclass(frozen=True)
class Panel:
    """One experiment's panel of the allocation plot.

    ``kind`` is ``"arms"`` (the share of requests each arm got: ``series`` by arm name) or
    ``"best_arm_share"`` (per-unit experiments: the share that went to the unit's own best
    arm, ``series`` has one entry); ``baseline`` is that share under uniform play.
    """

    experiment: str
    kind: str
    xs: np.ndarray
    series: dict[str, np.ndarray]
    baseline: float | None = None


def allocation_panels(stream: ServedLog, windows: int = 40) -> list[Panel]:
    """What the allocation plot draws, experiment by experiment (windows of equal size)."""
    panels = []
    for name in stream.experiments():
        served = stream.served(name)
        arm_names = stream.arm_names(name)
        if stream.units(name):
            xs, share = windowed(best_arm_hits(stream, name), windows)
            label = "each user's best arm" if stream.truth is not None else "estimated best arm"
            panels.append(Panel(name, "best_arm_share", xs, {label: share}, 1 / len(arm_names)))
            continue
        arms = np.array([s["arm"] for s in served])
        series = {
            arm: windowed((arms == a).astype(float), windows)[1] for a, arm in enumerate(arm_names)
        }
        panels.append(Panel(name, "arms", windowed(arms, windows)[0], series))
    return panels


def allocation_figure(stream: ServedLog, windows: int = 40) -> Any:
    """Traffic per arm over time (shared experiments, stacked), or the share of each user's
    best arm over time (per-unit experiments, against uniform play)."""
    panels = allocation_panels(stream, windows)
    fig, axes = _panels(len(panels), 3.6)
    for ax, panel in zip(axes, panels, strict=False):
        if panel.kind == "arms":
            ax.stackplot(panel.xs, list(panel.series.values()), labels=list(panel.series))
            ax.set_title(f"{panel.experiment}: traffic per arm")
            ax.set_ylabel("share of requests")
        else:
            ((label, share),) = panel.series.items()
            ax.plot(panel.xs, share, marker=".", label=f"share to {label}")
            ax.axhline(panel.baseline, color="grey", linestyle="--", label="uniform play")
            ax.set_title(f"{panel.experiment}: share of requests to {label}")
            ax.set_ylabel("share of requests")
        ax.set_xlabel("fraction of the stream")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    return fig


def delays_figure(stream: ServedLog, ttl: dict[str, float] | None = None) -> Any:
    """Histogram of feedback delays per experiment (log-spaced bins); the experiments'
    feedback TTLs as dotted lines when known."""
    fig, ax = _pyplot().subplots(figsize=(7, 3.6))
    for name in stream.experiments():
        d = stream.delays(name)
        d = d[d > 0]
        if len(d):
            bins = np.logspace(np.log10(d.min()), np.log10(d.max()), 40)
            _, _, patches = ax.hist(
                d, bins=bins, histtype="step", label=f"{name} (median {np.median(d):,.0f} s)"
            )
            if ttl and name in ttl:
                colour = patches[0].get_edgecolor()
                ax.axvline(ttl[name], color=colour, linestyle=":", linewidth=1.2)
    ax.set_xscale("log")
    ax.set_xlabel("feedback delay (s); dotted: the experiment's feedback TTL")
    ax.set_ylabel("feedback events")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    else:
        ax.set_title("no feedback with a known request time")
    fig.tight_layout()
    return fig


def dead_letters_figure(stream: ServedLog) -> Any:
    """Dead letters by reason: horizontal bars on a log scale, the count on each bar."""
    counts = dead_letter_counts(stream)
    fig, ax = _pyplot().subplots(figsize=(7, 0.45 * max(len(counts), 1) + 1.2))
    values = [n for _, n in counts]
    bars = ax.barh([r for r, _ in counts], values)
    ax.bar_label(bars, labels=[f"{n:,}" for n in values], padding=3, fontsize=8)
    ax.set_xscale("log")
    ax.set_xlim(0.5, max(values, default=1) * 4)  # room for the labels; bars of 1 show
    ax.set_xlabel("dead letters (log scale; the count is written on each bar)")
    ax.invert_yaxis()
    if not counts:
        ax.set_title("no dead letters")
    fig.tight_layout()
    return fig


def plot_regret(stream: ServedLog, path: Path) -> Path:
    return save(regret_figure(stream), path)


def plot_allocation(stream: ServedLog, path: Path, windows: int = 40) -> Path:
    return save(allocation_figure(stream, windows), path)


def plot_delays(stream: ServedLog, path: Path, ttl: dict[str, float] | None = None) -> Path:
    return save(delays_figure(stream, ttl), path)


def plot_dead_letters(stream: ServedLog, path: Path) -> Path:
    return save(dead_letters_figure(stream), path)


def plot_evaluation(evaluation: Any, path: Path) -> Path:
    """``tsi evaluate``: cumulative regret over the log (full information), or the running
    mean loss of the replayed policy against the logged policy (bandit logs); a replay
    whose ESS is below its ``min_ess`` is titled insufficient data, without its interval."""
    results = list(evaluation)
    fig, axes = _panels(len(results), 3.8, 5.5)
    for ax, r in zip(axes, results, strict=False):
        title = r.experiment
        if r.kind == "full-information":
            ax.plot(np.cumsum(r.curve_regret_fixed), label="regret vs best fixed arm")
            ax.set_ylabel("cumulative expected regret")
            ax.set_xlabel("rounds")
        else:
            accepted = np.asarray(r.accepted_losses, dtype=float)
            running = np.cumsum(accepted) / np.arange(1, len(accepted) + 1)
            ax.plot(running, label=f"configuration ({r.method})")
            ax.axhline(r.logged.value, color="grey", linestyle="--", label="logged policy")
            if r.policy.enough(r.min_ess):
                level = f"{r.policy.level:.0%} CI"
                ax.axhspan(r.policy.low, r.policy.high, alpha=0.2, label=level)
            else:
                title += f": insufficient data (ESS {r.policy.ess:g} < {r.min_ess:g})"
            ax.set_ylabel("mean loss so far")
            ax.set_xlabel("accepted events")
        ax.set_title(title)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return save(fig, path)
