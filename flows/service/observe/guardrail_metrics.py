"""The guardrail metrics (``tsi_guardrail_*``): per experiment, guardrail metric and group
(what served the selection a feedback scored: its ``why``, ``bandit`` or ``holdout``, also
``burn_in`` and ``forced``), the count, sum and sum of squares of the values feedback sent
in its ``guardrails`` object, summed over the worker threads' tallies when Prometheus
scrapes. As the arms' loss sums, the sums are gauges (values have any sign).

Only what an experiment's registry names in its ``guardrails`` is counted (a client cannot
add series), and only experiments with guardrails pay: the shard's loop calls
``count_guardrails`` for a feedback that matched its selection and sent some.

>>> from flows.service.instances.registry import Registry
>>> e = Registry.from_toml('[experiments.e]\\narms = ["c", "b"]\\n'
...     'holdout = {arm = "c", share = 0.1}\\nguardrails = [{metric = "ms"}]')["e"]
>>> class Tally: guardrails = {}
>>> count_guardrails(Tally, e, ((("ms", 3.0), ("other", 1.0)), "bandit"))
>>> Tally.guardrails
{('e', 'ms', 'bandit'): [1.0, 3.0, 9.0]}
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

__all__ = ["count_guardrails", "guardrail_families"]

LABELS = ["experiment", "metric", "group"]

log = logging.getLogger(__name__)


def count_guardrails(tally: Any, experiment: Any, guarded: tuple) -> None:
    """Add (values, why) of a matched feedback to ``tally.guardrails``: (experiment,
    metric, group) -> [n, sum, sum of squares], for the metrics ``experiment`` guards.
    Never raises into the flow: a failure is logged and skipped."""
    if not experiment.guardrails:
        return
    try:
        values, why = guarded
        watched = {g.metric for g in experiment.guardrails}
        for name, value in values:
            if name in watched:
                slots = tally.guardrails.get((experiment.name, name, why))
                if slots is None:
                    slots = tally.guardrails[experiment.name, name, why] = [0.0, 0.0, 0.0]
                slots[0] += 1.0
                slots[1] += value
                slots[2] += value * value
    except Exception:
        log.warning("metrics: count_guardrails failed", exc_info=True)


def guardrail_families(tallies: Iterable[Any]) -> Iterator[Metric]:
    """The ``tsi_guardrail_*`` families, summed over ``tallies``."""
    total: dict[tuple[str, str, str], list[float]] = {}
    for tally in tallies:
        for labels, slots in list(tally.guardrails.items()):
            into = total.setdefault(labels, [0.0, 0.0, 0.0])
            for i, x in enumerate(list(slots)):
                into[i] += x
    for kind, name, doc, slot in _FAMILIES:
        metric = kind(name, doc, labels=LABELS)
        for labels, slots in sorted(total.items()):
            metric.add_metric(list(labels), slots[slot])
        yield metric


_FAMILIES = (
    (CounterMetricFamily, "tsi_guardrail_samples",
     "Guardrail values sent with feedback, by experiment, metric and group (why served).", 0),
    (GaugeMetricFamily, "tsi_guardrail_sum", "Sum of those guardrail values.", 1),
    (GaugeMetricFamily, "tsi_guardrail_squares_sum", "Sum of their squares.", 2),
)  # fmt: skip
