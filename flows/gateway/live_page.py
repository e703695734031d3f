"""The live page's HTML (``GET /experiments``): ``live_data.summary`` in words a product
manager reads without the paper. Self-contained (inline CSS and SVG, no script, nothing
fetched), refreshing itself every sampling interval; every name from the registry or the
metrics is escaped. Each number a test checks sits in an element with a ``data-``
attribute holding the exact value.

>>> page = render({"sampled_at": None, "every": 10.0, "recent_seconds": 0.0,
...                "endpoints": [], "experiments": [], "dead_letters": {}})
>>> "No sample of the service's metrics yet" in page
True
"""

from __future__ import annotations

import time
from html import escape
from typing import Any

__all__ = ["render"]

#: what each feedback outcome (``tsi_feedback_total``) means, in plain words
OUTCOME_WORDS = {
    "applied": "scored: the outcome came and the bandit learned from it",
    "collected": "collected into its window, scored once when the window ends",
    "defaulted": "never came: the default outcome was scored",
    "early": "came before its decision and waited for it",
    "duplicate": "a second outcome for the same decision (ignored)",
    "arm_mismatch": "named another arm than the one served (ignored)",
    "early_buffer_full": "came before its decision while the waiting room was full (ignored)",
    "unknown": "its decision never came (ignored)",
    "expired_ticket": "never came before the decision expired",
    "late": "came after its decision expired (ignored)",
}
_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
            "#17becf")  # fmt: skip
_STYLE = """
body{font:15px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1100px;color:#222;
padding:0 16px}
h1{font-size:24px;margin-bottom:4px}h2{margin:28px 0 4px;font-size:20px}
.meta,.note{color:#555;font-size:13px}.down{color:#b00020;font-weight:600}.up{color:#1b7f3b}
table{border-collapse:collapse;margin:10px 0}td,th{padding:4px 10px;border-bottom:1px solid #ddd;
text-align:right}th{background:#f5f5f5}td:first-child,th:first-child{text-align:left}
section{border-top:2px solid #eee;margin-top:16px}svg{background:#fafafa;border:1px solid #eee}
.swatch{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;vertical-align:middle}
"""


def _num(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}g}"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def _data(value: float | None) -> str:
    return "" if value is None else repr(float(value))


def _count(value: float) -> str:
    return f"{value:,.0f}"


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(at))


def render(summary: dict[str, Any]) -> str:
    """The page of a ``live_data.summary``."""
    every = summary["every"]
    body = [f"<h1>Experiments, live</h1>{_header(summary)}"]
    if summary["sampled_at"] is None:
        body.append("<p>No sample of the service's metrics yet: the first comes within "
                    f"{every:g} s.</p>")  # fmt: skip
    for experiment in summary["experiments"]:
        body.append(_experiment(experiment, summary["recent_seconds"]))
    if summary["sampled_at"] is not None:
        body.append(_dead_letters(summary["dead_letters"]))
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="refresh" content="{max(every, 1.0):g}">'
        f"<title>tsi: experiments, live</title><style>{_STYLE}</style></head>"
        f'<body data-sampled-at="{_data(summary["sampled_at"])}">{"".join(body)}</body></html>'
    )


def _header(summary: dict[str, Any]) -> str:
    endpoints = []
    for endpoint in summary["endpoints"]:
        url = escape(endpoint["url"])
        if endpoint["up"]:
            endpoints.append(f'<li data-endpoint="{url}" data-up="1"><span class="up">up</span> '
                             f"{url}</li>")  # fmt: skip
        else:
            endpoints.append(
                f'<li data-endpoint="{url}" data-up="0"><span class="down">down</span> {url}: '
                f"{escape(endpoint['error'])}</li>"
            )
    when = "" if summary["sampled_at"] is None else f"Sampled at {_clock(summary['sampled_at'])}; "
    return (
        f'<p class="meta">{when}this page refreshes every {summary["every"]:g} s. '
        "Numbers count since the service's processes started.</p>"
        f'<ul class="meta">{"".join(endpoints)}</ul>'
    )


def _experiment(e: dict[str, Any], recent_seconds: float) -> str:
    name = escape(e["experiment"])
    recent = (
        f"last {recent_seconds / 60:.0f} min" if recent_seconds >= 60
        else f"last {recent_seconds:.0f} s" if recent_seconds > 0 else "so far"
    )  # fmt: skip
    rows = "".join(_arm_row(arm, e["rewards"]) for arm in e["arms"])
    outcome = "reward" if e["rewards"] else "loss"
    table = (
        f"<table><tr><th>Arm</th><th>Traffic ({recent})</th><th>Traffic (all)</th>"
        f"<th>Decisions</th><th>Mean {outcome} (95% interval)</th><th>Outcomes scored</th>"
        f"<th>Mean {outcome} if served to all (IPS)</th><th>Learner's q now</th>"
        f"<th>Served now</th></tr>{rows}</table>{_note(e['rewards'])}"
    )
    return (
        f'<section data-experiment="{name}" data-outcome-kind="{outcome}"><h2>{name}</h2>'
        f'<p class="meta"><span data-decisions="{_data(e["decisions"])}">'
        f"{_count(e['decisions'])}</span> decisions ({_count(e['retries'])} repeated answers "
        f'to retries); <span data-pending="{_data(e["pending"])}">{_count(e["pending"])}'
        "</span> awaiting their outcome.</p>"
        f"{table}{_guardrails(e.get('guardrails', []))}"
        f"{_chart(e['q_history'])}{_contexts(e['context_q'])}"
        f"{_feedback(e['feedback'])}</section>"
    )


def _guardrails(checks: list[dict[str, Any]]) -> str:
    """Each guardrail: bandit - holdout, its anytime-valid interval and its state."""
    if not checks:
        return ""
    rows = []
    for c in checks:
        interval = "" if c["low"] is None else f"[{_num(c['low'])}, {_num(c['high'])}]"
        rows.append(
            f'<tr data-guardrail="{escape(c["metric"])}" data-state="{escape(c["state"])}">'
            f"<td>{escape(c['metric'])}</td><td>{escape(c['worse'])}</td>"
            f"<td>{_num(c['estimate'])}</td><td>{interval}</td>"
            f"<td>{_count(c['n_bandit'])} / {_count(c['n_holdout'])}</td>"
            f"<td>{escape(c['state'])}</td></tr>"
        )
    return (
        "<h3>Guardrails</h3><table><tr><th>Metric</th><th>Worse when</th>"
        "<th>Bandit − holdout</th><th>Interval (any time)</th>"
        "<th>Samples (bandit / holdout)</th><th>State</th></tr>"
        f"{''.join(rows)}</table>"
    )


def _arm_row(arm: dict[str, Any], rewards: bool) -> str:
    """One arm's row; fed rewards, its outcomes as rewards (the negated losses)."""
    sign, kind = (-1.0, "reward") if rewards else (1.0, "loss")
    mean = None if arm["mean_loss"] is None else sign * arm["mean_loss"] + 0.0  # no -0
    ips = None if arm["ips_loss"] is None else sign * arm["ips_loss"] + 0.0
    interval = "" if arm["interval"] is None else f" ± {_num(arm['interval'], 2)}"
    scored = arm["feedback"] + arm["defaulted"]
    return (
        f'<tr data-arm="{escape(arm["arm"])}"><td>{escape(arm["arm"])}</td>'
        f'<td data-recent-share="{_data(arm["recent_share"])}">{_pct(arm["recent_share"])}</td>'
        f'<td data-share="{_data(arm["share"])}">{_pct(arm["share"])}</td>'
        f'<td data-selections="{_data(arm["selections"])}">{_count(arm["selections"])}</td>'
        f'<td data-mean-{kind}="{_data(mean)}">{_num(mean)}{interval}</td>'
        f'<td data-scored="{_data(scored)}">{_count(scored)}</td>'
        f'<td data-ips-{kind}="{_data(ips)}">{_num(ips)}</td>'
        f'<td data-q="{_data(arm["q"])}">{_pct(arm["q"])}</td>'
        f'<td data-served="{_data(arm["served"])}">{_pct(arm["served"])}</td></tr>'
    )


def _note(rewards: bool) -> str:
    """How to read the table: lower loss is better, or higher reward when fed rewards."""
    outcome, better = ("reward", "Higher reward") if rewards else ("loss", "Lower loss")
    fed = " (this experiment is fed rewards: each is the negated loss)" if rewards else ""
    return (
        f'<p class="note">{better} is better{fed}. The mean is over the outcomes scored (the '
        "default outcome when none came); the interval is where the true mean lies with "
        f"95% confidence. \u201cIf served to all\u201d estimates each arm's mean {outcome} had "
        "every decision gone to it, from the randomised traffic. \u201cLearner's q now\u201d "
        "is the learner's own chance for each arm; \u201cServed now\u201d is the chance each "
        "arm is served at the next decision, after the allocation (a min_share floor, a "
        "holdout, a burn-in, a forced arm): an arm whose q reads 0% may still be "
        "served (shared experiments).</p>"
    )


def _chart(history: dict[str, list[tuple[float, float]]]) -> str:
    """Each arm's q over time, one line per arm (inline SVG)."""
    if not history:
        return ""
    width, height, pad = 640, 180, 36
    times = [t for points in history.values() for t, _ in points]
    start, end = min(times), max(times)
    span = max(end - start, 1e-9)

    def x(t: float) -> float:
        return pad + (width - 2 * pad) * ((t - start) / span if end > start else 1.0)

    def y(q: float) -> float:
        return height - pad / 2 - (height - pad) * q

    lines, legend = [], []
    for i, (arm, points) in enumerate(sorted(history.items())):
        colour = _COLOURS[i % len(_COLOURS)]
        path = " ".join(f"{x(t):.1f},{y(q):.1f}" for t, q in points)
        lines.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{path}">'
            f"<title>{escape(arm)}</title></polyline>"
            if len(points) > 1
            else f'<circle cx="{x(points[0][0]):.1f}" cy="{y(points[0][1]):.1f}" r="3" '
            f'fill="{colour}"><title>{escape(arm)}</title></circle>'
        )
        legend.append(f'<span class="swatch" style="background:{colour}"></span>{escape(arm)}')
    grid = "".join(
        f'<line x1="{pad}" x2="{width - pad}" y1="{y(q):.1f}" y2="{y(q):.1f}" stroke="#ddd"/>'
        f'<text x="2" y="{y(q) + 4:.1f}" font-size="11">{100 * q:.0f}%</text>'
        for q in (0.0, 0.5, 1.0)
    )
    axis = (
        f'<text x="{pad}" y="{height - 2}" font-size="11">{_clock(start)}</text>'
        f'<text x="{width - pad}" y="{height - 2}" font-size="11" text-anchor="end">'
        f"{_clock(end)}</text>"
    )
    return (
        "<p><b>How the learner's q moved</b> (its chance for each arm, over time)</p>"
        f'<svg role="img" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'xmlns="http://www.w3.org/2000/svg" data-chart="q">{grid}{axis}{"".join(lines)}</svg>'
        f'<div class="meta">{"".join(legend)}</div>'
    )


def _contexts(by_context: dict[str, dict[str, float]]) -> str:
    """The current q in each context of a contextual shared instance."""
    if not by_context:
        return ""
    arms = sorted({arm for q in by_context.values() for arm in q})
    head = "".join(f"<th>{escape(arm)}</th>" for arm in arms)
    rows = "".join(
        f'<tr data-context="{escape(context)}"><td>{escape(context)}</td>'
        + "".join(f'<td data-q="{_data(q.get(arm))}">{_pct(q.get(arm))}</td>' for arm in arms)
        + "</tr>"
        for context, q in by_context.items()
    )
    return (
        "<p><b>Learner's q now, by context</b></p>"
        f"<table><tr><th>Context</th>{head}</tr>{rows}</table>"
    )


def _feedback(outcomes: dict[str, float]) -> str:
    items = "".join(
        f'<li data-outcome="{escape(outcome)}" data-count="{_data(n)}"><b>{_count(n)}</b> '
        f"{escape(OUTCOME_WORDS.get(outcome, outcome))}</li>"
        for outcome, n in outcomes.items()
        if n
    )
    return f"<p><b>Outcomes (feedback health)</b></p><ul>{items or '<li>none yet</li>'}</ul>"


def _dead_letters(dead: dict[str, float]) -> str:
    items = "".join(
        f'<li data-reason="{escape(reason)}" data-count="{_data(n)}"><b>{_count(n)}</b> '
        f"{escape(reason)}</li>"
        for reason, n in dead.items()
        if n
    )
    return (
        '<section data-dead-letters="1"><h2>Messages set aside (dead letters)</h2>'
        '<p class="note">Requests or outcomes the service could not use, by reason, all '
        f"experiments together.</p><ul>{items or '<li>none</li>'}</ul></section>"
    )
