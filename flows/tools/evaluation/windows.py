"""The loss the service applied to one served request, from the feedback it was sent and
the experiment's serving settings: its window (``feedback_ttl``), ``aggregate`` and
``default_loss``. The window and the combination are the service's own rules
(``flows.service.instances.instance.in_window`` and ``aggregate_losses``, compiled with
the instance that applies them), not copies of them.

Times are the events' own (see ``flows.tools.evaluation.served``). A time that is
missing (the request's or a feedback's) leaves the window unchecked: every feedback of
the request counts, a request without feedback gets the default, and the row is counted
as ``untimed``. A window still open at ``end`` (the newest time in the log) is counted as
``open`` and not evaluated, unless its loss was already final: the first feedback of an
experiment with ``aggregate = "first"`` and no ``default_loss``, applied at once.

>>> rules = Rules("sum", ttl=600.0, default_loss=1.0)
>>> tally = Tally()
>>> applied_loss(rules, 0.0, [(0.5, 10.0), (0.25, 20.0), (9.0, 600.0)], 5000.0, tally)
0.75
>>> applied_loss(rules, 100.0, [], 5000.0, tally), applied_loss(rules, 4900.0, [], 5000.0, tally)
(1.0, None)
>>> tally
Tally(defaulted=1, combined=1, late=1, untimed=0, open=1)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from flows.service.instances.instance import aggregate_losses, in_window
from flows.service.instances.registry import Experiment

Timed = tuple[float, float | None]  # a feedback's loss, and its time if known


@dataclass(frozen=True)
class Rules:
    """How the service turned an experiment's feedback into the loss it applied (the
    defaults: a join without the served registry, the first feedback and no window)."""

    aggregate: str = "first"
    ttl: float | None = None  # feedback_ttl; None: no window is checked
    default_loss: float | None = None

    @classmethod
    def of(cls, experiment: Experiment) -> Rules:
        """The rules of an experiment of the served registry."""
        return cls(experiment.aggregate, experiment.feedback_ttl, experiment.default_loss)


@dataclass
class Tally:
    """What the rules did over a join."""

    defaulted: int = 0  # requests given default_loss: no feedback in their window
    combined: int = 0  # requests whose loss combines several feedback (aggregate)
    late: int = 0  # feedback events after their window (the service's late_feedback)
    untimed: int = 0  # requests whose window could not be checked: a time is missing
    open: int = 0  # requests whose window was still open at the end of the log


def applied_loss(
    rules: Rules,
    served_at: float | None,
    feedback: Sequence[Timed],
    end: float | None,
    tally: Tally,
) -> float | None:
    """The loss applied to a request served at ``served_at`` with ``feedback`` in the order
    it came; None when none was (no feedback in the window and no default, or the window
    open at ``end``). Counts what it did in ``tally``."""
    ttl = rules.ttl
    if ttl is not None and (served_at is None or any(at is None for _, at in feedback)):
        tally.untimed += 1
    timed = ttl is not None and served_at is not None
    losses = []
    for loss, at in feedback:
        if timed and at is not None and not in_window(served_at, at, ttl):
            tally.late += 1
        else:
            losses.append(loss)
    final_at_first = rules.aggregate == "first" and rules.default_loss is None and losses
    if timed and end is not None and not final_at_first and in_window(served_at, end, ttl):
        tally.open += 1
        return None
    if losses:
        if len(losses) > 1 and rules.aggregate != "first":
            tally.combined += 1
        return aggregate_losses(rules.aggregate, losses)
    if rules.default_loss is not None:
        tally.defaulted += 1
        return rules.default_loss
    return None
