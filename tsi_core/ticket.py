"""A selection, kept until its feedback arrives (feedback may come late and out of order).

>>> t = Ticket(instance="a1", round=3, arm=2, prob=0.25, weight_share=0.2, context=None)
>>> Ticket.from_dict(t.to_dict()) == t
True
"""

from __future__ import annotations

from typing import Any, NamedTuple


class TicketError(ValueError):
    """A ticket that an instance cannot settle (foreign, settled, discarded or forged)."""


class Ticket(NamedTuple):
    """What a selection was made with: the update needs these values, not current ones.

    ``prob`` is q of the chosen arm (the propensity the selection is logged with);
    ``weight_share`` is the paper's p of that arm: its share w/Σw of the weights before
    the uniform ε-mixing (q = (1 - ε)·p + ε/M); ``round`` counts selections of this
    instance from 1.
    """

    instance: str
    round: int
    arm: int
    prob: float
    weight_share: float
    context: int | None = None

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
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a ticket: {data!r} ({exc})") from exc
