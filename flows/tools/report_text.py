"""The words of a report: what ran, the summary table and how to read it, the dead letters
beside the faults put in on purpose, how feedback windows ended and the bandit against
its holdout, and a caption for each plot. Every sentence is computed from the stream (and
the registry and the injected faults, when given); one that explains a number appears only
when it applies.

>>> from flows.tools.report_data import ServedLog
>>> sel = [{"experiment": "e", "unit": None, "request_id": "r1", "arm": 0, "arm_name": "a"}]
>>> text = [b.text for b in results(ServedLog(sel, [], [])) if hasattr(b, "text")]
>>> any("best fixed arm is negative" in t for t in text)  # no truth, no such number
False
"""

from __future__ import annotations

import math
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
from flows.tools.report_windows import (
    DEFAULTED,
    FEEDBACK,
    OPEN,
    HoldoutFigures,
    arm_windows,
    holdout_figures,
)
from tsi_core.variant import DEFAULT_VARIANT

#: how many named contexts a report's sentence lists
NAMED_SHOWN = 6


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


def _named(contexts: set[int | str]) -> str:
    """The named contexts among ``contexts``, the first few, for a sentence ("" if none).

    >>> _named({"device=ios", "device=android", 2})
    ' (device=android; device=ios)'
    """
    named = sorted(c for c in contexts if isinstance(c, str))
    if not named:
        return ""
    more = f"; and {len(named) - NAMED_SHOWN} more" if len(named) > NAMED_SHOWN else ""
    return f" ({'; '.join(named[:NAMED_SHOWN])}{more})"


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
    named = _named(contexts)
    if named or (contexts and getattr(experiment, "n_contexts", 0) != len(contexts)):
        parts.append(f"{len(contexts)} contexts seen in the requests{named}")
    if experiment is not None:
        default = " (the default)" if experiment.variant == DEFAULT_VARIANT else ""
        parts += [
            _competition(experiment.competition.to_dict()),
            f"algorithm variant `{experiment.variant}`{default}",
            f"feedback TTL {experiment.feedback_ttl:,g} s",
            *_serving(experiment),
        ]
    s = summarise(stream, name)
    answered = s.with_feedback / s.requests if s.requests else 0.0
    feedback = f"{s.requests:,} requests, feedback for {s.with_feedback:,} ({answered:.1%})"
    delays = stream.delays(name)
    if len(delays):
        feedback += f" after a median {np.median(delays):,.0f} s"
    if injected is not None and name in injected.feedback:
        delay, lost = injected.feedback[name]
        feedback += f" (generated: mean delay {delay:,g} s, {lost:.0%} of the feedback lost)"
    return "; ".join([*parts, feedback]) + "."


def _serving(experiment: Any) -> list[str]:
    """The serving settings an experiment sets (``default_loss``, ``min_share``,
    ``holdout``), each in words."""
    parts = []
    if experiment.default_loss is not None:
        parts.append(
            f"`default_loss` {experiment.default_loss:g}: a window that ends without feedback "
            "counts as that loss"
        )
    if experiment.min_share > 0:
        parts.append(f"every arm served at least {experiment.min_share:.0%} (`min_share`)")
    if experiment.holdout is not None:
        arm, share = experiment.holdout
        parts.append(f"{share:.0%} of the requests held out on `{arm}` (`holdout`)")
    return parts


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
        mean = _fmt(s.mean_observed_loss, 3) + (" (all equal)" if s.feedback_all_equal else "")
        row = [name, f"{s.requests:,}", f"{s.with_feedback:,}", mean]
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


def equal_feedback(stream: ServedLog, name: str) -> str | None:
    """What a mean observed loss means when every feedback had the same loss (conversions
    reported alone): nothing about the arms, which the feedback cannot tell apart."""
    s = summarise(stream, name)
    if not s.feedback_all_equal:
        return None
    return (
        f"`{name}`: every feedback it got had the loss {_fmt(s.mean_observed_loss, 3)} (all "
        "equal: a conversion reported alone), so its mean observed loss says nothing of its "
        "arms, not that they are perfect; what it learns from is which requests got "
        "feedback and which did not (its section below)."
    )


def results(stream: ServedLog) -> list[Block]:
    """The summary table, how to read it, and what explains its unusual numbers."""
    blocks: list[Block] = [Heading("Results"), summary_table(stream)]
    blocks.append(Para(HOW_TO_READ_TRUTH if stream.truth is not None else HOW_TO_READ_OBSERVED))
    for name in stream.experiments():
        said = (negative_regret(stream, name), best_arm_share(stream, name))
        for sentence in (*said, equal_feedback(stream, name)):
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


def windows_and_holdouts(stream: ServedLog, registry: Any = None) -> list[Block]:
    """For each served experiment with a ``default_loss``, how its windows ended, arm by
    arm; for each with a ``holdout``, the bandit against its holdout. Nothing without a
    registry (the settings are not known) or without such an experiment."""
    if registry is None:
        return []
    names = [n for n in stream.experiments() if n in registry.experiments]
    blocks: list[Block] = []
    for name in names:
        experiment = registry.experiments[name]
        if experiment.default_loss is None and experiment.holdout is None:
            continue
        if experiment.aggregate != "first":
            blocks.append(Para(_combined(name, experiment.aggregate)))
            continue
        if experiment.default_loss is not None:
            blocks += _windows(stream, experiment)
        if experiment.holdout is not None:
            blocks += _holdout(holdout_figures(stream, experiment))
    return [Heading("Conversions and holdouts"), *blocks] if blocks else []


def _combined(name: str, aggregate: str) -> str:
    return (
        f'`{name}` combines the feedback of each window (`aggregate = "{aggregate}"`): '
        "its windows and holdout are not shown here (the report reads the first feedback "
        "only); `tsi evaluate` compares its holdout with its bandit."
    )


def _windows(stream: ServedLog, experiment: Any) -> list[Block]:
    """How the windows of an experiment with a ``default_loss`` ended, arm by arm."""
    name, default = experiment.name, experiment.default_loss
    arms = arm_windows(stream, experiment)
    total = {how: sum(a.ended[how] for a in arms) for how in (FEEDBACK, DEFAULTED, OPEN)}
    requests = sum(a.requests for a in arms)
    closed = total[FEEDBACK] + total[DEFAULTED]
    rows = tuple(
        (
            f"`{a.arm}`",
            f"{a.requests:,}",
            f"{a.requests / requests:.1%}",
            f"{a.ended[FEEDBACK]:,}",
            f"{a.ended[DEFAULTED]:,}",
            f"{a.ended[OPEN]:,}",
            _pct(a.rate.value),
            _interval(a.rate, _pct, (0.0, 1.0)),
        )
        for a in arms
    )
    header = (
        "Arm",
        "Requests",
        "Share of requests",
        "Closed by feedback",
        "Closed by default",
        "Still open at the end",
        "Feedback rate",
        "95% interval",
    )
    top = max(arms, key=lambda a: a.requests)
    text = (
        f"`{name}` learns from every decision, not only from those that got feedback: a "
        f"window of {experiment.feedback_ttl:,g} s that ends without feedback counts as a "
        f"loss of {default:g} (`default_loss`). Where an application reports conversions "
        "only, feedback *is* a conversion, and the feedback rate below is the conversion "
        f"rate. Of its {requests:,} requests, {total[FEEDBACK]:,} windows closed with "
        f"feedback and {total[DEFAULTED]:,} by default (the service counts these as "
        f"`defaulted`, not as dead letters); {total[OPEN]:,} were still open when the "
        "stream ended. Without `default_loss` those windows would expire unapplied "
        "(`ticket_expired`) and the bandit would learn from the feedback alone: if every "
        "feedback is a conversion, every loss it sees is the same and it cannot tell the "
        "arms apart."
    )
    share = (
        f"The bandit sent most of the traffic to `{top.arm}` ({top.requests / requests:.0%} "
        f"of the requests), whose feedback rate was {_pct(top.rate.value)} against "
        f"{_pct(total[FEEDBACK] / closed if closed else math.nan)} over all arms."
    )
    return [
        Heading(f"`{name}`: windows closed by feedback and by default", 3),
        Para(text),
        Table(header, rows),
        Para(share),
    ]


def _holdout(h: HoldoutFigures) -> list[Block]:
    """The bandit against its holdout, in words a product team reads."""
    c, se = h.comparison, h.share_stderr
    z = (h.observed_share - h.share) / se
    verdict = (
        "the configured share, within sampling error"
        if abs(z) <= 2
        else f"{abs(z):.1f} standard errors from the configured share"
    )
    share = (
        f"`{h.experiment}` serves `{h.arm}` to {h.share:.0%} of its requests, drawn at random "
        "for each request whatever the bandit has learned, to measure the bandit against. "
        f"Held out: {h.held_out:,} of its {h.requests:,} requests ({h.observed_share:.1%}); "
        f"at a share of {h.share:.0%} that varies by ± {100 * se:.1f} percentage points (one "
        f"standard error) from run to run, so this is {verdict}."
    )
    rows = tuple(
        (what, f"{e.n:,}", _loss(e.value), _interval(e, _loss))
        for what, e in (
            (f"held out on `{h.arm}`", c.holdout),
            ("served by the bandit", c.bandit),
        )
    )
    rows += (("bandit − holdout", "", _loss(c.difference.value), _interval(c.difference, _loss)),)
    header = ("Requests", "With an outcome", "Mean loss", f"{c.holdout.level:.0%} interval")
    left_out = (
        f" {h.unknown:,} of them have no outcome (no feedback within the window and no "
        "`default_loss`, or still open at the end) and are left out."
        if h.unknown
        else ""
    )
    others = ", ".join(f"{n:,} by `{why}`" for why, n in h.others.items())
    others = f" Requests served otherwise ({others}) are in neither group." if others else ""
    notes = (
        "Each mean is the loss the requests of that group got as served (lower is better, "
        f"in `{h.experiment}`'s own units). The holdout is drawn at random, so the two "
        f"groups are alike but for what served them.{left_out}{others}"
    )
    return [
        Heading(f"`{h.experiment}`: the bandit against its holdout", 3),
        Para(share),
        Table(header, rows),
        Para(_difference(h)),
        Para(notes),
    ]


def _difference(h: HoldoutFigures) -> str:
    """What the difference bandit − holdout says, in words."""
    d, level = h.comparison.difference, f"{h.comparison.difference.level:.0%}"
    if math.isnan(d.value) or not math.isfinite(d.stderr):
        return "Too few requests with an outcome in one of the groups to compare them yet."
    if d.high < 0:
        return (
            f"Per request, the bandit's traffic lost {-d.value:.3f} less than the holdout's "
            f"({level} interval: {-d.high:.3f} to {-d.low:.3f} less): serving "
            f"`{h.experiment}` with the bandit does better than serving `{h.arm}` to everyone."
        )
    if d.low > 0:
        return (
            f"Per request, the bandit's traffic lost {d.value:.3f} more than the holdout's "
            f"({level} interval: {d.low:.3f} to {d.high:.3f} more): so far the bandit does "
            f"worse than serving `{h.arm}` to everyone."
        )
    return (
        f"The difference, {d.value:+.3f} per request ({level} interval {d.low:+.3f} to "
        f"{d.high:+.3f}), includes 0: the bandit cannot be told from serving `{h.arm}` to "
        "everyone yet; more requests narrow the interval."
    )


def _pct(x: float) -> str:
    return "–" if math.isnan(x) else f"{x:.1%}"


def _loss(x: float) -> str:
    return "–" if math.isnan(x) else f"{x:.3f}"


def _interval(e: Any, fmt: Any, within: tuple[float, float] = (-math.inf, math.inf)) -> str:
    """``[low, high]`` of an estimate, each written by ``fmt`` and kept ``within`` the
    values it can take (a rate's normal interval can reach below 0); a dash when
    unbounded."""
    if not (math.isfinite(e.low) and math.isfinite(e.high)):
        return "–"
    low, high = max(e.low, within[0]), min(e.high, within[1])
    return f"[{fmt(low)}, {fmt(high)}]"
