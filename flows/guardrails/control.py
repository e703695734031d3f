"""The guardrails' controller: from the service's metrics (``tsi_guardrail_*``, summed over
its processes), each guardrail of each experiment is tested (``sequential``) comparing the
bandit's selections with the holdout; on a breach it says so once (a log line, the counter
``tsi_guardrail_breaches_total{experiment,metric}``) and calls ``pause(experiment, arm,
reason)`` with the holdout's arm, until a call succeeds. Deciding what pausing does is the
action's job (``file_action``: ``force_arm`` written into the registry file).

>>> from flows.service.instances.registry import Registry
>>> registry = Registry.from_toml('[experiments.e]\\narms = ["c", "b"]\\n'
...     'holdout = {arm = "c", share = 0.5}\\nguardrails = [{metric = "ms", min_samples = 2}]')
>>> def sums(group, n, total, squares):
...     at = (("experiment", "e"), ("group", group), ("metric", "ms"))
...     return {"tsi_guardrail_samples_total": {at: n}, "tsi_guardrail_sum": {at: total},
...             "tsi_guardrail_squares_sum": {at: squares}}
>>> samples = {k: {**a, **b} for (k, a), b in zip(sums("bandit", 400, 800.0, 2000.0).items(),
...     sums("holdout", 400, 400.0, 800.0).values())}
>>> calls = []
>>> controller = Controller(lambda: registry, lambda *call: calls.append(call))
>>> [(c.metric, c.state) for c in controller.observe(samples)["e"]]
[('ms', 'breached')]
>>> calls[0][:2]
('e', 'c')
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter

from flows.guardrails.sequential import Sums, breached, confidence_sequence
from flows.guardrails.spec import Guardrail

__all__ = ["BREACHES", "METRICS", "Check", "Controller", "Pause", "check"]

log = logging.getLogger(__name__)

#: the gateway's own metrics (``GET /metrics`` beside the live page)
METRICS = CollectorRegistry()
BREACHES = Counter(
    "tsi_guardrail_breaches",
    "Guardrails found breached (the bandit worse than the holdout), once per breach.",
    ["experiment", "metric"],
    registry=METRICS,
)

Samples = Mapping[str, Mapping[tuple[tuple[str, str], ...], float]]


class Pause(Protocol):
    """What acting on a breach does: serve ``arm`` (the holdout's) to everyone in
    ``experiment``; ``reason`` says why, in one line. Raising means it did not happen."""

    def __call__(self, experiment: str, arm: str, reason: str) -> None: ...


@dataclass(frozen=True)
class Check:
    """One guardrail's state: ``waiting`` (too few samples), ``ok`` or ``breached``; the
    estimate of bandit - holdout and its anytime-valid interval once there are enough."""

    experiment: str
    metric: str
    worse: str
    margin: float
    n_bandit: float
    n_holdout: float
    estimate: float | None
    low: float | None
    high: float | None
    state: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def reason(self) -> str:
        """The breach in one line."""
        return (
            f"guardrail {self.metric!r} of experiment {self.experiment!r} breached: bandit - "
            f"holdout = {self.estimate:.6g}, interval [{self.low:.6g}, {self.high:.6g}] wholly "
            f"{'above' if self.worse == 'higher' else 'below'} the margin {self.margin:g} "
            f"({self.n_bandit:g} bandit, {self.n_holdout:g} holdout samples)"
        )


def _sums(samples: Samples, experiment: str, metric: str, group: str) -> Sums:
    at = (("experiment", experiment), ("group", group), ("metric", metric))
    n, total, squares = (
        samples.get(name, {}).get(at, 0.0)
        for name in (
            "tsi_guardrail_samples_total",
            "tsi_guardrail_sum",
            "tsi_guardrail_squares_sum",
        )
    )
    return Sums(n, total, squares)


def check(samples: Samples, experiment: str, guardrail: Guardrail) -> Check:
    """The state of ``guardrail`` of ``experiment`` in the summed metrics ``samples``."""
    bandit = _sums(samples, experiment, guardrail.metric, "bandit")
    holdout = _sums(samples, experiment, guardrail.metric, "holdout")
    interval = confidence_sequence(bandit, holdout, guardrail.alpha, guardrail.min_samples)
    if interval is None:
        state = "waiting"
    else:
        state = "breached" if breached(interval, guardrail.worse, guardrail.margin) else "ok"
    return Check(
        experiment,
        guardrail.metric,
        guardrail.worse,
        guardrail.margin,
        bandit.n,
        holdout.n,
        None if interval is None else interval.estimate,
        None if interval is None else interval.low,
        None if interval is None else interval.high,
        state,
    )


class Controller:
    """Tests every guardrail of the registry ``registry()`` gives (None: none) at each
    ``observe`` and acts on breaches with ``pause`` (None: only says them); ``checks``
    holds the last states."""

    def __init__(self, registry: Callable[[], Any], pause: Pause | None) -> None:
        self.registry = registry
        self.pause = pause
        self.checks: dict[str, list[Check]] = {}
        self._said: set[tuple[str, str]] = set()  # breaches logged and counted
        self._done: set[str] = set()  # experiments paused

    def observe(self, samples: Samples) -> dict[str, list[Check]]:
        """Test the guardrails on ``samples``; act on the breached ones."""
        registry = self.registry()
        experiments = {} if registry is None else registry.experiments
        checks = {
            name: [check(samples, name, g) for g in e.guardrails]
            for name, e in sorted(experiments.items())
            if e.guardrails
        }
        self.checks = checks
        for name, found in checks.items():
            for c in found:
                if c.state == "breached":
                    self._act(experiments[name], c)
        return checks

    def _act(self, experiment: Any, c: Check) -> None:
        reason = c.reason()
        if (c.experiment, c.metric) not in self._said:
            self._said.add((c.experiment, c.metric))
            BREACHES.labels(c.experiment, c.metric).inc()
            log.warning("%s", reason)
        arm = experiment.holdout[0]
        if self.pause is None or c.experiment in self._done or experiment.force_arm == arm:
            return
        try:
            self.pause(c.experiment, arm, reason)
        except Exception as exc:  # the action failed: said, and tried again next time
            log.error("pausing experiment %r failed, tried again: %s", c.experiment, exc)
            return
        self._done.add(c.experiment)
        log.warning("experiment %r paused to arm %r: %s", c.experiment, arm, reason)
