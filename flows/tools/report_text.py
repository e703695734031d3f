"""The words of a report: what ran, the summary table and how to read it, the dead letters
beside the faults put in on purpose, and a caption for each plot. Every sentence is
computed from the stream (and the registry and the injected faults, when given); one
that explains a number appears only when it applies.

>>> from flows.tools.report_data import ServedLog
>>> sel = [{"experiment": "e", "unit": None, "request_id": "r1", "arm": 0, "arm_name": "a"}]
>>> text = [b.text for b in results(ServedLog(sel, [], [])) if hasattr(b, "text")]
>>> any("best fixed arm is negative" in t for t in text)  # no truth, no such number
False
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flows.tools.report_data import (
    Injected,
    ServedLog,
    best_arm_hits,
    dead_letter_counts,
    summarise,
    why_best_arm_varies,
)
from flows.tools.report_render import Block, Bullets, Heading, Para, Table
from tsi_core.variant import DEFAULT_VARIANT


def _fmt(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{x:,.{digits}f}"


def _competition(spec: dict[str, Any]) -> str:
    kind = spec.get("kind")
    if kind == "fixed":
        return "competes with the best fixed arm"
    if kind == "switching":
        return f"competes with sequences of arms that switch (rate {spec.get('rate', 0):g})"
    if kind == "contextual":
        return f"contextual: a best arm per context ({spec.get('n_contexts')} contexts)"
    return f"competition `{kind}`"


def describe(
    stream: ServedLog, name: str, registry: Any = None, injected: Injected | None = None
) -> str:
    """One experiment in a sentence: arms, units or contexts, algorithm, feedback."""
    experiment = registry.experiments.get(name) if registry is not None else None
    arms = list(experiment.arms) if experiment is not None else stream.arm_names(name)
    units = stream.units(name)
    parts = [
        f"`{name}`: {len(arms)} arms ({', '.join(arms)})",
        f"one bandit per user ({len(units):,} users)" if units else "one bandit for all requests",
    ]
    contexts = {c for k, c in stream.contexts.items() if k[0] == name}
    if contexts and getattr(experiment, "n_contexts", 0) != len(contexts):
        parts.append(f"{len(contexts)} contexts seen in the requests")
    if experiment is not None:
        default = " (the default)" if experiment.variant == DEFAULT_VARIANT else ""
        parts += [
            _competition(experiment.competition.to_dict()),
            f"algorithm variant `{experiment.variant}`{default}",
            f"feedback TTL {experiment.feedback_ttl:,g} s",
        ]
    s = summarise(stream, name)
    answered = s.with_feedback / s.requests if s.requests else 0.0
    feedback = f"{s.requests:,} requests, feedback for {s.with_feedback:,} ({answered:.1%})"
    delays = stream.delays(name)
    if len(delays):
        feedback += f" after a median {np.median(delays):,.0f} s"
    if injected is not None and name in injected.feedback:
        delay, lost = injected.feedback[name]
        feedback += f" (generated: mean delay {delay:,g} s, {lost:.0%} never answered)"
    return "; ".join([*parts, feedback]) + "."


def what_ran(stream: ServedLog, registry: Any = None, injected: Injected | None = None) -> list:
    """The section that says what the experiments were."""
    blocks: list[Block] = [Heading("What ran")]
    names = stream.experiments()
    blocks.append(Bullets(tuple(describe(stream, n, registry, injected) for n in names)))
    if registry is None:
        blocks.append(Para("The algorithm variant is not known: no registry was given."))
    return blocks


HOW_TO_READ_TRUTH = (
    "How to read the table: *regret vs best arm at each time* adds up, over the requests, "
    "the true expected loss of the arm served minus that of the best arm for that request "
    "(a user's own best arm, a context's, the best one at that moment); it cannot be "
    "negative, and *same, uniform play* is its value for arms picked at random, for scale. "
    "*Regret vs best fixed arm* compares with the single arm that, played for the whole "
    "stream, has the lowest total expected loss. *Best arm's share, last fifth* is the "
    "fraction of the last fifth of the requests that went to their best arm. Losses are in "
    "each experiment's own units (a reward counts as its negative)."
)
HOW_TO_READ_OBSERVED = (
    "How to read the table: the true expected losses are not known for this stream, so it "
    "gives what was observed: the requests served, how many got feedback, and the mean loss "
    "of that feedback (a reward counts as its negative)."
)


def summary_table(stream: ServedLog) -> Table:
    truth = stream.truth is not None
    header = ["Experiment", "Requests", "With feedback", "Mean observed loss"]
    if truth:
        header += [
            "Regret vs best arm at each time",
            "Same, uniform play",
            "Regret vs best fixed arm",
            "Best arm's share, last fifth",
        ]
    rows = []
    for name in stream.experiments():
        s = summarise(stream, name)
        row = [name, f"{s.requests:,}", f"{s.with_feedback:,}", _fmt(s.mean_observed_loss, 3)]
        if truth:
            row += [
                _fmt(s.regret_vs_best_arm_each_time),
                _fmt(s.uniform_regret_vs_best_arm_each_time),
                _fmt(s.regret_vs_best_fixed_arm),
                _fmt(s.best_share_last_fifth, 3),
            ]
        rows.append(tuple(row))
    return Table(tuple(header), tuple(rows))


def negative_regret(stream: ServedLog, name: str) -> str | None:
    """Why the regret against the best fixed arm is negative — only when it is, as shown
    in the table (to its one decimal)."""
    s = summarise(stream, name)
    if s.regret_vs_best_fixed_arm is None or round(s.regret_vs_best_fixed_arm, 1) >= 0:
        return None
    reason = why_best_arm_varies(stream, name) or "no single arm is the best for every request"
    return (
        f"`{name}`: the regret against the best fixed arm is negative "
        f"({_fmt(s.regret_vs_best_fixed_arm)}) because {reason}. A policy that follows "
        "that, as the bandit does, can beat any single arm played for the whole stream: "
        "negative is good here, not a bug. Against the best arm for each request the regret "
        f"is {_fmt(s.regret_vs_best_arm_each_time)}, and that one cannot be negative."
    )


def best_arm_share(stream: ServedLog, name: str) -> str | None:
    """For a per-unit experiment: how much traffic went to each user's best arm."""
    units = stream.units(name)
    hits = best_arm_hits(stream, name)
    if not units or not np.isfinite(hits).any():
        return None
    k = len(stream.arm_names(name))
    whose = "that user's best arm" if stream.truth is not None else "that user's estimated best arm"
    estimate = (
        ""
        if stream.truth is not None
        else " (estimated: the arm of lowest mean observed loss for the user, over the whole log)"
    )
    return (
        f"`{name}` (one bandit per user): {np.nanmean(hits):.1%} of its requests went to "
        f"{whose}{estimate}, against {1 / k:.1%} for uniform play over its {k} arms; the "
        "allocation plot shows that share over time."
    )


def results(stream: ServedLog) -> list[Block]:
    """The summary table, how to read it, and what explains its unusual numbers."""
    blocks: list[Block] = [Heading("Results"), summary_table(stream)]
    blocks.append(Para(HOW_TO_READ_TRUTH if stream.truth is not None else HOW_TO_READ_OBSERVED))
    for name in stream.experiments():
        for sentence in (negative_regret(stream, name), best_arm_share(stream, name)):
            if sentence is not None:
                blocks.append(Para(sentence))
    return blocks


def dead_letters(stream: ServedLog, injected: Injected | None = None) -> list[Block]:
    """The dead letters by reason, beside what was injected to produce them (if known)."""
    blocks: list[Block] = [Heading("Dead letters and injected faults")]
    counts = dead_letter_counts(stream)
    if injected is None:
        blocks.append(
            Para(
                "Injected faults: not known (this stream does not say what, if anything, was "
                "broken on purpose), so the dead letters below cannot be checked against them."
            )
        )
        rows = tuple((r, f"{n:,}") for r, n in counts) or (("(none)", "0"),)
        return [*blocks, Table(("Reason", "Count"), rows)]
    blocks.append(
        Para(
            "The traffic generator broke some messages and feedback on purpose and counted "
            "them; each should end as a dead letter with the reason given."
        )
    )
    faults = tuple(
        (f.what, f"{f.count:,}", ", ".join(f"`{r}`" for r in f.reasons) or "not a dead letter")
        for f in injected.faults
    )
    blocks.append(Table(("Injected on purpose", "Count", "Should end as"), faults))
    reasons = [r for r, _ in counts] + sorted(
        {r for f in injected.faults for r in f.reasons} - {r for r, _ in counts}
    )
    seen = dict(counts)
    rows = tuple((r, f"{seen.get(r, 0):,}", f"{injected.expected(r):,}") for r in reasons)
    blocks.append(Table(("Reason", "Count", "Expected from the injected faults"), rows))
    differ = [f"`{r}`" for r in reasons if seen.get(r, 0) != injected.expected(r)]
    if differ:
        blocks.append(Para(_why_counts_differ(differ)))
    return blocks


def _why_counts_differ(reasons: list[str]) -> str:
    return (
        f"Where the counts differ ({', '.join(reasons)}): a ticket expires only once the "
        "stream passes its deadline, so the lost or late feedback of the last requests "
        "leaves tickets still open when the stream ends (fewer `ticket_expired`); a feedback "
        "later than its ticket is a `late_feedback` only within the retry window; anything "
        "else is a dead letter nobody put in on purpose."
    )
