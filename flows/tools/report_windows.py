"""How the feedback window of each served request ended, read from the stream, and the
figures a report shows from that: per arm, the windows closed by feedback and by
``default_loss``; for an experiment with a ``holdout``, the holdout's share of the traffic
and its outcome against the bandit's (``HoldoutComparison``, the evaluation's own).

The service's rule on event time (``Instance.expire``; ``instance.in_window``, its one
body, decides here too): a request served at ``ts`` has its window until
``ts + feedback_ttl``. The first feedback delivered before that closes it with
its loss; else, once the stream reaches the window's end, it closes with the experiment's
``default_loss`` (``defaulted``) or, without one, expires unapplied (``ticket_expired``);
a window whose end the stream never reached is still open. Only the first feedback counts
(``aggregate = "first"``, the default): ``outcomes`` refuses an experiment that combines
its feedback.

>>> from flows.tools.report_data import ServedLog
>>> from flows.service.instances.registry import Registry
>>> exp = Registry.from_toml('[experiments.e]\\narms = ["a"]\\nfeedback_ttl = 10\\n'
...                          'default_loss = 1.0')["e"]
>>> sel = [{"experiment": "e", "unit": None, "request_id": r, "arm": 0, "arm_name": "a"}
...        for r in ("r1", "r2", "r3")]
>>> fb = [{"experiment": "e", "request_id": "r1", "loss": 0.0, "ts": 5.0}]
>>> ts = {("e", None, "r1"): 0.0, ("e", None, "r2"): 1.0, ("e", None, "r3"): 20.0}
>>> [(o.how, o.loss) for o in outcomes(ServedLog(sel, fb, [], ts), exp)]
[('feedback', 0.0), ('defaulted', 1.0), ('open', None)]
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

from flows.service.instances.instance import in_window
from flows.tools.evaluation.estimators import Estimate, mean_estimate
from flows.tools.evaluation.results import HoldoutComparison
from flows.tools.report_data import ServedLog, _key, loss_of

FEEDBACK, DEFAULTED, EXPIRED, OPEN = "feedback", "defaulted", "expired", "open"
HOW = (FEEDBACK, DEFAULTED, EXPIRED, OPEN)


@dataclass(frozen=True)
class Outcome:
    """One served request: its selection, how its window ended, its loss (None: unknown,
    the window expired or is still open)."""

    selection: dict[str, Any]
    how: str
    loss: float | None


def outcomes(stream: ServedLog, experiment: Any) -> list[Outcome]:
    """How the window of each served request of ``experiment`` (a registry
    ``Experiment``) ended, in request-time order (see the module)."""
    if experiment.aggregate != "first":
        raise ValueError(
            f"experiment {experiment.name!r} combines its feedback (aggregate = "
            f"{experiment.aggregate!r}): its outcomes are not the first feedback's loss"
        )
    first = stream.first_feedback(experiment.name)
    end = stream.end()
    out = []
    ttl = experiment.feedback_ttl
    for s in stream.served(experiment.name):
        served_at = stream.request_ts[_key(s)]
        f = first.get(_key(s))
        if f is not None and in_window(served_at, f["ts"], ttl):
            out.append(Outcome(s, FEEDBACK, float(loss_of(f))))
        elif in_window(served_at, end, ttl):
            out.append(Outcome(s, OPEN, None))
        elif experiment.default_loss is not None:
            out.append(Outcome(s, DEFAULTED, experiment.default_loss))
        else:
            out.append(Outcome(s, EXPIRED, None))
    return out


@dataclass(frozen=True)
class ArmWindows:
    """One arm's requests and how their windows ended; ``rate``: the share of its closed
    windows (feedback or default) that closed with feedback, a conversion rate where only
    conversions send feedback."""

    arm: str
    requests: int
    ended: dict[str, int]  # by ``HOW``
    rate: Estimate


def arm_windows(stream: ServedLog, experiment: Any) -> list[ArmWindows]:
    """Per arm of ``experiment``, in the registry's order."""
    found = outcomes(stream, experiment)
    counts = Counter((o.selection["arm"], o.how) for o in found)
    out = []
    for a, name in enumerate(experiment.arms):
        ended = {how: counts[(a, how)] for how in HOW}
        closed = [1.0] * ended[FEEDBACK] + [0.0] * ended[DEFAULTED]
        out.append(ArmWindows(name, sum(ended.values()), ended, mean_estimate(closed)))
    return out


@dataclass(frozen=True)
class HoldoutFigures:
    """An experiment's holdout as served: its configured and observed share of the
    requests, and the outcomes of the held-out requests against the bandit's."""

    experiment: str
    arm: str
    share: float  # as configured
    requests: int  # served requests (first answers)
    held_out: int  # served by the holdout (``why`` holdout)
    comparison: HoldoutComparison  # over the requests whose outcome is known
    unknown: int  # holdout or bandit requests without a known outcome (expired, open)
    others: dict[str, int]  # requests served otherwise (``burn_in``, ``forced``)

    @property
    def observed_share(self) -> float:
        return self.held_out / self.requests

    @property
    def share_stderr(self) -> float:
        """The standard error of the observed share when each request is held out with
        probability ``share``."""
        return math.sqrt(self.share * (1.0 - self.share) / self.requests)


def holdout_figures(stream: ServedLog, experiment: Any, level: float = 0.95) -> HoldoutFigures:
    """``experiment``'s holdout (it must have one and served requests): the share, and
    the mean loss of the held-out and the bandit's requests whose outcome is known."""
    if experiment.holdout is None:
        raise ValueError(f"experiment {experiment.name!r} has no holdout")
    found = outcomes(stream, experiment)
    if not found:
        raise ValueError(f"experiment {experiment.name!r} served no request")
    arm, share = experiment.holdout
    groups: dict[str, list[float]] = {"holdout": [], "bandit": []}
    whys = Counter(o.selection.get("why", "bandit") for o in found)
    for o in found:
        group = groups.get(o.selection.get("why", "bandit"))
        if group is not None and o.loss is not None:
            group.append(o.loss)
    comparison = HoldoutComparison.of(
        arm, mean_estimate(groups["holdout"], level), mean_estimate(groups["bandit"], level)
    )
    compared = whys["holdout"] + whys["bandit"]
    return HoldoutFigures(
        experiment.name,
        arm,
        share,
        len(found),
        whys["holdout"],
        comparison,
        compared - len(groups["holdout"]) - len(groups["bandit"]),
        {why: n for why, n in sorted(whys.items()) if why not in groups},
    )
