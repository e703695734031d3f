"""A selection, kept until its feedback arrives (feedback may come late and out of order).

>>> t = Ticket(instance="a1", round=3, arm=2, prob=0.25, weight_share=0.2, context=None)
>>> Ticket.from_dict(t.to_dict()) == t
True
"""

from __future__ import annotations

from typing import Any, NamedTuple

from tsi_core._kernel import WHYS


class TicketError(ValueError):
    """A ticket that an instance cannot settle (foreign, settled, discarded or forged)."""


class Ticket(NamedTuple):
    """What a selection was made with: the update needs these values, not current ones.

    ``prob`` is the probability the arm was served with (the propensity the selection is
    logged with, and the q its update uses): the learner's q of the arm, or under an
    allocation or eligible arms (``tsi_core.allocation``) the marginal P of the arm;
    ``weight_share`` is the learner's p of that arm: its share w/Σw of the weights before
    the uniform ε-mixing (q = (1 - ε)·p + ε/M); ``round`` counts selections of this
    instance from 1; ``why`` is one of ``WHYS``: "bandit" (drawn from the learner's
    distribution), "holdout", "burn_in" or "forced".
    """

    instance: str
    round: int
    arm: int
    prob: float
    weight_share: float
    context: int | None = None
    why: str = "bandit"

    def to_dict(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Ticket:
        try:
            return cls(
                instance=str(data["instance"]),
                round=int(data["round"]),
                arm=int(data["arm"]),
                prob=float(data["prob"]),
                # snapshots written before the field was renamed call it "p"
                weight_share=float(data["weight_share"] if "weight_share" in data else data["p"]),
                context=None if data.get("context") is None else int(data["context"]),
                why=_why(data.get("why", "bandit")),  # tickets before the field: the bandit's
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a ticket: {data!r} ({exc})") from exc


def _why(value: Any) -> str:
    """The ``WHYS`` entry equal to ``value`` (the module's own string object)."""
    if value not in WHYS:
        raise ValueError(f"why must be one of {WHYS}, got {value!r}")
    return WHYS[WHYS.index(value)]
