"""Reports of a served stream (``tsi demo``, ``tsi replay``): REPORT.md with its PNG plots,
and REPORT.html, the same report in one file (plots inline) that opens without a server.

From what went through the service — selections, feedback, dead letters — and, when
known, the true expected loss of every arm for each request (synthetic traffic), the
registry (arms, competition, algorithm variant, feedback TTL) and the faults put in on
purpose (``Injected``), the report says what ran and shows:

* cumulative regret over time against the best arm for each request and the best fixed
  arm (with the truth), or the cumulative observed loss (without it);
* traffic per arm over time (shared experiments), or the share of each user's best arm
  over time (per-user experiments);
* the feedback delay distribution;
* dead letters by reason, beside the injected faults that should have produced them;
* with the registry, for an experiment with a ``default_loss`` the windows closed by
  feedback (a conversion) and by default, arm by arm, and for one with a ``holdout`` the
  bandit's traffic against the holdout's (``report_windows``).

The outputs are deterministic: the same input gives the same bytes (no time stamps, PNGs
without varying metadata). The pieces: ``report_data`` (the stream and its figures),
``report_windows`` (how each request's feedback window ended), ``report_text`` (the
words), ``report_plots`` (the PNGs), ``report_render`` (Markdown and HTML).

>>> sel = [{"experiment": "e", "unit": None, "request_id": "r1", "arm": 0, "arm_name": "a"}]
>>> stream = ServedLog(sel, [], [], request_ts={("e", None, "r1"): 0.0})
>>> stream.experiments()
['e']
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flows.tools.report_data import (
    Fault,
    Injected,
    Key,
    ServedLog,
    Summary,
    log_events,
    request_contexts,
    summarise,
)
from flows.tools.report_plots import (
    plot_allocation,
    plot_dead_letters,
    plot_delays,
    plot_evaluation,
    plot_regret,
)
from flows.tools.report_render import Block, Figure, Heading, Para, html, markdown
from flows.tools.report_text import dead_letters, results, what_ran, windows_and_holdouts

__all__ = [
    "Fault",
    "Injected",
    "Key",
    "ServedLog",
    "Summary",
    "log_events",
    "plot_evaluation",
    "request_contexts",
    "summarise",
    "write_report",
]


def _captions(stream: ServedLog, registry: Any) -> dict[str, str]:
    """What each plot shows and how to read it."""
    per_user = [n for n in stream.experiments() if stream.units(n)]
    shared = [n for n in stream.experiments() if not stream.units(n)]
    regret = (
        "Cumulative expected regret of each experiment over its requests: blue against the "
        "best arm for each request, orange against the best fixed arm, dashed green: uniform "
        "play against the best arm for each request. Lower is better; a curve that flattens "
        "has found the best arm, and an orange curve below zero beats every single arm "
        "(possible when the best arm varies between users, contexts or over time)."
        if stream.truth is not None
        else "Cumulative observed loss of each experiment over its requests with feedback: "
        "the slope is the mean loss, so a curve that bends down is learning."
    )
    allocation = []
    if shared:
        allocation.append(
            f"{', '.join(shared)}: the share of the requests each arm got, over the stream "
            "(stacked; 40 windows of equal numbers of requests). A learning bandit puts most "
            "of the traffic on the best arm, and moves when the best arm changes."
        )
    if per_user:
        allocation.append(
            f"{', '.join(per_user)} (one bandit per user): the share of the requests that "
            "went to that user's own best arm, over the stream; the dashed line is uniform "
            "play. Users have different best arms, so traffic per arm would look even across "
            "arms although each user gets their own."
        )
    ttl = (
        " Dotted: each experiment's feedback TTL; feedback later than that comes after its "
        "ticket expired (a `late_feedback`)."
    )
    delays = "How long feedback took to come after its request, per experiment (log scale)." + (
        ttl if registry is not None else ""
    )
    letters = (
        "Dead letters by reason, the count written on each bar (log scale: a bar of 1 is "
        "short but there); the table above sets them beside the faults injected on purpose."
    )
    return {
        "regret": regret,
        "allocation": " ".join(allocation) or "No selections to show.",
        "feedback_delays": delays,
        "dead_letters": letters,
    }


def _plots(stream: ServedLog, out_dir: Path, registry: Any) -> list[Path]:
    ttl = (
        {n: e.feedback_ttl for n, e in registry.experiments.items()}
        if registry is not None
        else None
    )
    return [
        plot_regret(stream, out_dir / "regret.png"),
        plot_allocation(stream, out_dir / "allocation.png"),
        plot_delays(stream, out_dir / "feedback_delays.png", ttl),
        plot_dead_letters(stream, out_dir / "dead_letters.png"),
    ]


def report_blocks(
    stream: ServedLog,
    title: str,
    notes: list[str],
    plots: list[Path],
    registry: Any = None,
    injected: Injected | None = None,
) -> list[Block]:
    """The whole report, as blocks (``report_render``)."""
    captions = _captions(stream, registry)
    blocks: list[Block] = [Heading(title, 1), *(Para(n) for n in notes)]
    blocks += what_ran(stream, registry, injected)
    blocks += results(stream)
    blocks += windows_and_holdouts(stream, registry)
    blocks += dead_letters(stream, injected)
    blocks.append(Heading("Plots"))
    blocks += [Figure(p, p.stem, captions.get(p.stem, "")) for p in plots]
    return blocks


def write_report(
    stream: ServedLog,
    out_dir: Path,
    title: str,
    notes: list[str],
    *,
    registry: Any = None,
    injected: Injected | None = None,
) -> Path:
    """REPORT.md, its PNGs and REPORT.html in ``out_dir``; returns the Markdown file.

    ``registry`` (a ``flows.service.instances.registry.Registry``) adds each experiment's
    competition, algorithm variant and feedback TTL; ``injected`` what the traffic
    generator broke on purpose (without it the report says the faults are not known).

    >>> import tempfile
    >>> sel = [{"experiment": "e", "unit": None, "request_id": "r", "arm": 0, "arm_name": "a"}]
    >>> with tempfile.TemporaryDirectory() as d:
    ...     path = write_report(ServedLog(sel, [], []), Path(d), "t", [])
    ...     sorted(p.name for p in Path(d).iterdir())[:3]
    ['REPORT.html', 'REPORT.md', 'allocation.png']
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = _plots(stream, out_dir, registry)
    blocks = report_blocks(stream, title, notes, plots, registry, injected)
    (out_dir / "REPORT.html").write_bytes(html(blocks, title).encode("utf-8"))
    path = out_dir / "REPORT.md"
    path.write_bytes(markdown(blocks).encode("utf-8"))
    return path
