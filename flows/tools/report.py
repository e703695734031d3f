"""Reports of a served stream (``tsi demo``, ``tsi replay``): Markdown with PNG plots.

From what went through the service — selections, feedback, dead letters — and, when the
traffic is synthetic, the true expected loss of every arm for each request:

* cumulative regret over time against the best arm at each moment and the best fixed
  arm (with the truth), or the cumulative observed loss (without it);
* traffic allocation per arm over time;
* feedback delay distribution;
* dead letters by reason.

>>> sel = [{"experiment": "e", "unit": None, "request_id": "r1", "arm": 0, "arm_name": "a"}]
>>> stream = ServedLog(sel, [], [], request_ts={("e", None, "r1"): 0.0})
>>> stream.experiments()
['e']
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

Key = tuple[str, str | None, str]  # experiment, unit, request_id


def _key(event: dict[str, Any]) -> Key:
    return (event["experiment"], event.get("unit"), event["request_id"])


@dataclass
class ServedLog:
    """What went through the service, as JSON objects."""

    selections: list[dict[str, Any]]
    feedback: list[dict[str, Any]]  # as sent (with ``ts``, and ``loss`` or ``reward``)
    dead_letters: list[dict[str, Any]]
    request_ts: dict[Key, float] = field(default_factory=dict)
    truth: dict[str, np.ndarray] | None = None  # request_id -> expected loss of every arm

    def experiments(self) -> list[str]:
        return sorted({s["experiment"] for s in self.selections})

    def served(self, experiment: str) -> list[dict[str, Any]]:
        """Selections of one experiment in request-time order (first answer per request)."""
        seen, out = set(), []
        for s in self.selections:
            k = _key(s)
            if s["experiment"] == experiment and k not in seen:
                seen.add(k)
                out.append(s)
        return sorted(out, key=lambda s: self.request_ts.get(_key(s), 0.0))

    def delays(self, experiment: str) -> np.ndarray:
        """Seconds from request to feedback, for feedback that names a known request."""
        out = []
        for f in self.feedback:
            t0 = self.request_ts.get(_key(f))
            if f["experiment"] == experiment and t0 is not None and "ts" in f:
                out.append(f["ts"] - t0)
        return np.array(out)

    def observed_losses(self, experiment: str) -> dict[Key, float]:
        """Loss of each request that got feedback (first delivery; reward = -loss)."""
        out: dict[Key, float] = {}
        for f in self.feedback:
            if f["experiment"] == experiment:
                loss = f.get("loss", -f["reward"] if f.get("reward") is not None else None)
                out.setdefault(_key(f), loss)
        return out


def log_events(
    messages: Iterable[tuple[bytes, Any]], feedback_sources: Collection[str] = ()
) -> tuple[dict[Key, float], list[dict[str, Any]]]:
    """(request times, feedback sent) of a served log of (raw bytes, origin) messages.

    Feedback is what has ``"type": "feedback"`` or comes from one of ``feedback_sources``
    (logs without a type field); unreadable lines are skipped.
    """
    request_ts: dict[Key, float] = {}
    feedback: list[dict[str, Any]] = []
    for raw, origin in messages:
        try:
            event = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(event, dict) or "request_id" not in event or "experiment" not in event:
            continue
        if event.get("type") == "feedback" or origin.source in feedback_sources:
            feedback.append(event)
        elif "ts" in event:
            request_ts[_key(event)] = event["ts"]
    return request_ts, feedback


@dataclass(frozen=True)
class Summary:
    experiment: str
    requests: int
    with_feedback: int
    regret_vs_best_arm_each_time: float | None
    regret_vs_best_fixed_arm: float | None
    uniform_regret_vs_best_arm_each_time: float | None
    best_share_last_fifth: float | None
    mean_observed_loss: float | None


def summarise(stream: ServedLog, experiment: str) -> Summary:
    served = stream.served(experiment)
    observed = stream.observed_losses(experiment)
    losses = [v for k, v in observed.items() if v is not None]
    dynamic = fixed = uniform = share = None
    if stream.truth is not None and served:
        mu = np.array([stream.truth[s["request_id"]] for s in served])
        arms = np.array([s["arm"] for s in served])
        got = mu[np.arange(len(arms)), arms]
        dynamic = float((got - mu.min(axis=1)).sum())
        fixed = float(got.sum() - mu.sum(axis=0).min())
        uniform = float((mu.mean(axis=1) - mu.min(axis=1)).sum())
        tail = slice(len(arms) * 4 // 5, None)
        share = float((got[tail] == mu[tail].min(axis=1)).mean())
    return Summary(
        experiment,
        len(served),
        sum(1 for s in served if _key(s) in observed),
        dynamic,
        fixed,
        uniform,
        share,
        float(np.mean(losses)) if losses else None,
    )


def _fmt(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{x:,.{digits}f}"


def markdown(stream: ServedLog, title: str, plots: list[Path], notes: list[str]) -> str:
    lines = [f"# {title}", "", *notes, ""]
    truth = stream.truth is not None
    head = "| Experiment | Requests | With feedback | Mean observed loss |"
    rule = "|---|---:|---:|---:|"
    if truth:
        head += (
            " Regret vs best arm at each time | Same, uniform play | Regret vs best fixed arm"
            " | Best arm's share, last fifth |"
        )
        rule += "---:|---:|---:|---:|"
    lines += [head, rule]
    for name in stream.experiments():
        s = summarise(stream, name)
        row = f"| {name} | {s.requests:,} | {s.with_feedback:,} | {_fmt(s.mean_observed_loss, 3)} |"
        if truth:
            row += (
                f" {_fmt(s.regret_vs_best_arm_each_time)} |"
                f" {_fmt(s.uniform_regret_vs_best_arm_each_time)} |"
                f" {_fmt(s.regret_vs_best_fixed_arm)} | {_fmt(s.best_share_last_fifth, 3)} |"
            )
        lines.append(row)
    reasons = Counter(d["reason"] for d in stream.dead_letters)
    lines += ["", "## Dead letters by reason", "", "| Reason | Count |", "|---|---:|"]
    lines += [f"| {r} | {n:,} |" for r, n in reasons.most_common()] or ["| (none) | 0 |"]
    lines += ["", "## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots]
    return "\n".join(lines) + "\n"


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_regret(stream: ServedLog, path: Path) -> Path:
    """Cumulative regret (with the truth) or observed loss over requests, per experiment."""
    plt = _pyplot()
    names = stream.experiments()
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 3.8), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        served = stream.served(name)
        if stream.truth is not None:
            mu = np.array([stream.truth[s["request_id"]] for s in served])
            arms = np.array([s["arm"] for s in served])
            got = mu[np.arange(len(arms)), arms]
            ax.plot(np.cumsum(got - mu.min(axis=1)), label="tsi vs best arm at each time")
            best_fixed = mu[:, int(np.argmin(mu.sum(axis=0)))]
            ax.plot(np.cumsum(got - best_fixed), label="tsi vs best fixed arm")
            ax.plot(np.cumsum(mu.mean(axis=1) - mu.min(axis=1)), "--", label="uniform play")
            ax.set_ylabel("cumulative expected regret (loss units)")
        else:
            observed = stream.observed_losses(name)
            values = [observed.get(_key(s)) for s in served]
            ax.plot(np.cumsum([v for v in values if v is not None]), label="observed loss")
            ax.set_ylabel("cumulative observed loss")
        ax.set_title(name)
        ax.set_xlabel("requests")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_allocation(stream: ServedLog, path: Path, windows: int = 40) -> Path:
    """Share of requests served by each arm, over time (stacked)."""
    plt = _pyplot()
    names = stream.experiments()
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 3.6), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        served = stream.served(name)
        arm_names = {s["arm"]: s["arm_name"] for s in served}
        n_arms = max(arm_names) + 1
        chunks = np.array_split(np.array([s["arm"] for s in served]), min(windows, len(served)))
        shares = np.array([np.bincount(c, minlength=n_arms) / max(len(c), 1) for c in chunks])
        xs = np.linspace(0, 1, len(chunks))
        labels = [arm_names.get(a, str(a)) for a in range(n_arms)]
        ax.stackplot(xs, shares.T, labels=labels)
        ax.set_title(f"{name}: traffic per arm")
        ax.set_xlabel("fraction of the stream")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_delays(stream: ServedLog, path: Path) -> Path:
    """Histogram of feedback delays per experiment (log-spaced bins)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for name in stream.experiments():
        d = stream.delays(name)
        d = d[d > 0]
        if len(d):
            bins = np.logspace(np.log10(d.min()), np.log10(d.max()), 40)
            ax.hist(d, bins=bins, histtype="step", label=f"{name} (median {np.median(d):,.0f} s)")
    ax.set_xscale("log")
    ax.set_xlabel("feedback delay (s)")
    ax.set_ylabel("feedback events")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    else:
        ax.set_title("no feedback with a known request time")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_dead_letters(stream: ServedLog, path: Path) -> Path:
    plt = _pyplot()
    counts = Counter(d["reason"] for d in stream.dead_letters).most_common()
    fig, ax = plt.subplots(figsize=(7, 0.45 * max(len(counts), 1) + 1.2))
    ax.barh([r for r, _ in counts], [n for _, n in counts])
    ax.set_xlabel("dead letters")
    ax.set_xscale("log")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_report(stream: ServedLog, out_dir: Path, title: str, notes: list[str]) -> Path:
    """REPORT.md and its PNGs in ``out_dir``; returns the Markdown file."""
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = [
        plot_regret(stream, out_dir / "regret.png"),
        plot_allocation(stream, out_dir / "allocation.png"),
        plot_delays(stream, out_dir / "feedback_delays.png"),
        plot_dead_letters(stream, out_dir / "dead_letters.png"),
    ]
    path = out_dir / "REPORT.md"
    path.write_text(markdown(stream, title, plots, notes))
    return path


def plot_evaluation(evaluation: Any, path: Path) -> Path:
    """``tsi evaluate``: cumulative regret over the log (full information), or the running
    mean loss of the replayed policy against the logged policy (bandit logs)."""
    plt = _pyplot()
    results = list(evaluation)
    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 3.8), squeeze=False)
    for ax, r in zip(axes[0], results, strict=True):
        if r.kind == "full-information":
            ax.plot(np.cumsum(r.curve_regret_fixed), label="regret vs best fixed arm")
            ax.set_ylabel("cumulative expected regret")
            ax.set_xlabel("rounds")
        else:
            accepted = np.asarray(r.accepted_losses, dtype=float)
            running = np.cumsum(accepted) / np.arange(1, len(accepted) + 1)
            ax.plot(running, label=f"configuration ({r.method})")
            ax.axhline(r.logged.value, color="grey", linestyle="--", label="logged policy")
            ax.axhspan(r.policy.low, r.policy.high, alpha=0.2, label=f"{r.policy.level:.0%} CI")
            ax.set_ylabel("mean loss so far")
            ax.set_xlabel("accepted events")
        ax.set_title(r.experiment)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
