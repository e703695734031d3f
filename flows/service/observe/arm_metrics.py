"""The metrics by arm (``tsi_arm_*``): what each arm was served and scored, and the q of
shared instances, summed over the worker threads' tallies (``metrics._Tally``) when
Prometheus scrapes.

The labels are an experiment and an arm (and a context for ``tsi_arm_context_share``),
never a unit. The loss sums are gauges (losses have any sign) and count since the process
started. Per arm, with ``n`` = ``tsi_arm_feedback_total + tsi_arm_defaulted_total``: the
mean loss is ``tsi_arm_loss_sum / n``, its normal interval ± ``1.96 *
sqrt((tsi_arm_loss_squares_sum / n - mean ^ 2) / n)``; the IPS estimate of the arm's mean
loss (were it served always) is::

    sum by (experiment, arm) (tsi_arm_ips_loss_sum)
      / ignoring(arm) group_left
    sum by (experiment) (tsi_decisions_total - tsi_retries_total)

(``prob``: the probability the arm was served with, the selection's ``prob``).

The q of a shared (not per-unit) instance is read from it at most every ``SHARE_EVERY``
seconds, after an event, by the worker holding it: ``tsi_arm_share`` for a context-free
one (and ``tsi_arm_served_share``, its P: the chance each arm is served, q under the
allocation: a ``min_share`` floor serves an arm whose q reads 0), ``tsi_arm_context_share``
(one series per context and arm) for a contextual one while its contexts × arms are at
most ``CONTEXT_SHARE_LIMIT``; above the limit it exports none (``tsi inspect
--leaderboard`` shows the mean q), nor do per-unit experiments. A context is labelled
by its named combination (``context_labels``), or its index.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

__all__ = [
    "ARM_DEFAULTED",
    "ARM_FEEDBACK",
    "ARM_IPS",
    "ARM_LOSS",
    "ARM_LOSS_SQUARES",
    "ARM_SELECTIONS",
    "ARM_SLOTS",
    "CONTEXT_SHARE_LIMIT",
    "SHARE_EVERY",
    "arm_families",
    "context_labels",
]

# slots of an arm's tally (``_Tally.arms``): selections (retries not), losses applied from
# feedback and by default, then over all applied losses: sum, sum of squares, sum of loss/prob
ARM_SELECTIONS, ARM_FEEDBACK, ARM_DEFAULTED, ARM_LOSS, ARM_LOSS_SQUARES, ARM_IPS = range(6)
ARM_SLOTS = 6
#: seconds between two readings of a shared instance's q (``tsi_arm_share``,
#: ``tsi_arm_context_share``)
SHARE_EVERY = 1.0
#: the most series (contexts × arms) ``tsi_arm_context_share`` exports for one experiment
CONTEXT_SHARE_LIMIT = 1000

#: A reading of a shared instance's q: (time read, arms, context labels or None when
#: context-free, one row of q per context, the served P of a context-free one else None).
Share = tuple[float, tuple[str, ...], tuple[str, ...] | None, list[list[float]], list[float] | None]


def context_labels(experiment: Any) -> tuple[str, ...] | None:
    """The label of each context (by index) of a shared contextual experiment whose q is
    exported; None when none is: context-free, per-unit, or contexts × arms above
    ``CONTEXT_SHARE_LIMIT``. Named contexts are labelled by their combination, others (and
    named ones whose labels would collide) by their index.

    >>> from flows.service.instances.registry import Registry
    >>> r = Registry.from_toml('[experiments.e]\\narms = ["a", "b"]\\n'
    ...                        'contexts = {device = ["ios"], plan = ["pro"]}')
    >>> context_labels(r["e"])
    ('device=ios,plan=pro', 'device=ios,plan=other', 'device=other,plan=pro', \
'device=other,plan=other')
    """
    n = experiment.n_contexts
    if experiment.per_unit or n == 1 or n * len(experiment.arms) > CONTEXT_SHARE_LIMIT:
        return None
    named = experiment.contexts
    labels = tuple(named.labels()) if named is not None else ()
    if len(set(labels)) != n:
        labels = tuple(str(i) for i in range(n))
    return labels


def arm_families(tallies: Iterable[Any]) -> Iterator[Metric]:
    """The ``tsi_arm_*`` families, summed over ``tallies`` (the q: the latest reading)."""
    arms: dict[tuple[str, str], list[float]] = {}
    shares: dict[str, Share] = {}
    for tally in tallies:
        for labels, slots in list(tally.arms.items()):
            total = arms.setdefault(labels, [0.0] * ARM_SLOTS)
            for i, x in enumerate(list(slots)):
                total[i] += x
        for experiment, read in list(tally.shares.items()):
            if experiment not in shares or read[0] > shares[experiment][0]:
                shares[experiment] = read
    labels = ["experiment", "arm"]
    for kind, name, doc, slot in _ARM_FAMILIES:
        metric = kind(name, doc, labels=labels)
        for (experiment, arm), slots in sorted(arms.items()):
            metric.add_metric([experiment, arm], slots[slot])
        yield metric
    share = GaugeMetricFamily(
        "tsi_arm_share",
        "q of each arm of a shared (not per-unit, context-free) instance, as last read.",
        labels=labels,
    )
    by_context = GaugeMetricFamily(
        "tsi_arm_context_share",
        "q of each arm in each context of a shared (not per-unit) contextual instance, as "
        f"last read; none above {CONTEXT_SHARE_LIMIT} contexts x arms.",
        labels=["experiment", "context", "arm"],
    )
    served = GaugeMetricFamily(
        "tsi_arm_served_share",
        "P of each arm of a shared (not per-unit, context-free) instance: the chance it is "
        "served at the next decision, q under the allocation (min_share, holdout, burn_in, "
        "force_arm), as last read.",
        labels=labels,
    )
    for experiment, (_, names, contexts, rows, p) in sorted(shares.items()):
        if contexts is None:
            for arm, x, y in zip(names, rows[0], p, strict=True):
                share.add_metric([experiment, arm], x)
                served.add_metric([experiment, arm], y)
            continue
        for context, q in zip(contexts, rows, strict=True):
            for arm, x in zip(names, q, strict=True):
                by_context.add_metric([experiment, context, arm], x)
    yield share
    yield served
    yield by_context


_ARM_FAMILIES = (
    (CounterMetricFamily, "tsi_arm_selections",
     "Selections by arm, answers to retries not included.", ARM_SELECTIONS),
    (CounterMetricFamily, "tsi_arm_feedback",
     "Losses applied from feedback by arm (a window's combined loss once).", ARM_FEEDBACK),
    (CounterMetricFamily, "tsi_arm_defaulted",
     "Default losses applied by arm (no feedback in the window).", ARM_DEFAULTED),
    (GaugeMetricFamily, "tsi_arm_loss_sum",
     "Sum of the losses applied by arm, defaults included (losses have any sign).", ARM_LOSS),
    (GaugeMetricFamily, "tsi_arm_loss_squares_sum",
     "Sum of the squares of the losses applied by arm, defaults included.", ARM_LOSS_SQUARES),
    (GaugeMetricFamily, "tsi_arm_ips_loss_sum",
     "Sum over the losses applied by arm of loss / prob (prob: the probability the arm was "
     "served with); divided by the experiment's selections, the IPS estimate of the arm's "
     "mean loss.", ARM_IPS),
)  # fmt: skip
