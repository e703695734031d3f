"""``tsi inspect``: the allocation and counters of instances, read from a recovery directory.

The flow does not need to run: the latest committed snapshot of each instance is read
(``flows.service.runtime.recovery``) and its bandit rebuilt from its own JSON state.

>>> from tsi_core import Bandit
>>> b = Bandit(2, instance_id="home")
>>> b.update(b.select(u=0.1), 1.0)
>>> view = describe("home", {"experiment": "home", "bandit": b.to_dict(), "open": [],
...                          "settled": [], "early": []})
>>> view.rounds, view.updates, [round(sum(q), 9) for q in view.q]
(1, 1, [1.0])
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from flows.service.instances.registry import Registry
from flows.service.wire.keys import shown_key, split_key
from tsi_core import Bandit


@dataclass(frozen=True)
class InstanceView:
    """What a person asks about an instance: who it is, how it allocates, what it saw."""

    instance: str
    experiment: str
    unit: str | None
    arms: list[str]  # as the snapshot knows them (a changed registry applies on restart)
    q: list[list[float]]  # one row per context (one row without contexts)
    rounds: int  # selections made
    updates: int  # feedback applied
    open_tickets: int
    answers_kept: int  # settled requests still remembered for retries
    early_feedback: int
    psi: float | None  # smallest loss seen
    range_d: float  # D, the range estimate (0 before the first loss above ψ)
    eta: float  # current learning rate (inf before)
    archived: bool = False  # its experiment is not in the registry given: state kept as is

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for name in ("psi", "range_d", "eta"):
            value = data[name]
            data[name] = None if value is None or math.isinf(value) else value
        return data


class InspectError(ValueError):
    """No instance matches, or a snapshot cannot be read."""


def describe(key: str, state: dict[str, Any], registry: Registry | None = None) -> InstanceView:
    """The view of one instance from its snapshot (``Instance.to_dict``)."""
    try:
        bandit = Bandit.from_dict(state["bandit"])
        experiment = state["experiment"]
    except (KeyError, TypeError, ValueError) as exc:
        raise InspectError(f"instance {key!r}: unreadable snapshot ({exc})") from None
    spec = registry.get(experiment) if registry is not None else None
    arms = _arm_names(state, spec, bandit.n_arms)
    contexts = bandit.structure.n_contexts
    rows = [None] if contexts == 1 else list(range(contexts))
    q = [bandit.probabilities(context=c).tolist() for c in rows]
    unit = split_key(key)[1]
    return InstanceView(
        shown_key(key),
        experiment,
        unit,
        arms,
        q,
        bandit.n_rounds,
        bandit.n_updates,
        len(state.get("open", [])),
        len(state.get("settled", [])),
        len(state.get("early", [])),
        None if math.isinf(bandit.psi) else bandit.psi,
        bandit.D,
        bandit.eta,
        registry is not None and spec is None,
    )


def _arm_names(state: dict[str, Any], spec: Any, n_arms: int) -> list[str]:
    """The arms a snapshot was taken with: its own names; for snapshots that kept none, the
    registry's when their number matches, else positions."""
    names = state.get("arms")
    if isinstance(names, list) and len(names) == n_arms:
        return [str(n) for n in names]
    if spec is not None and len(spec.arms) == n_arms:
        return list(spec.arms)
    return [f"#{i}" for i in range(n_arms)]


def select_instances(
    states: dict[str, dict[str, Any]], patterns: Iterable[str] = ("*",)
) -> list[str]:
    """Instance keys matching any pattern (``experiment`` or ``experiment/unit``, with
    shell wildcards), sorted."""
    patterns = list(patterns)
    chosen = [
        key for key in states if any(fnmatch.fnmatchcase(shown_key(key), p) for p in patterns)
    ]
    if not chosen:
        known = ", ".join(sorted(shown_key(k) for k in states)[:10])
        raise InspectError(f"no instance matches {patterns}; some that exist: {known or 'none'}")
    return sorted(chosen)


def render(views: list[InstanceView]) -> str:
    """A table a person reads: one block per instance."""
    lines = []
    for v in views:
        lines.append(
            f"{v.instance}  rounds {v.rounds:,}  feedback {v.updates:,}  open {v.open_tickets:,}"
            f"  early {v.early_feedback:,}  ψ {_num(v.psi)}  D {_num(v.range_d)}  η {_num(v.eta)}"
            + ("  (archived: its experiment is not in the registry)" if v.archived else "")
        )
        for c, row in enumerate(v.q):
            label = "  q" if len(v.q) == 1 else f"  q[context {c}]"
            cells = "  ".join(f"{arm}={p:.4f}" for arm, p in zip(v.arms, row, strict=True))
            lines.append(f"{label}: {cells}")
    return "\n".join(lines)


def _num(x: float | None) -> str:
    return "–" if x is None or math.isinf(x) else f"{x:.6g}"


#: what the leaderboard shows instead of a mean loss: the snapshots keep no loss sums
NO_LOSS = (
    "the snapshots keep no per-arm loss sums: mean loss by arm, its interval and the IPS "
    "estimate are in the metrics (tsi_arm_loss_sum, tsi_arm_loss_squares_sum, "
    "tsi_arm_ips_loss_sum; deploy/grafana)"
)


@dataclass(frozen=True)
class Board:
    """An experiment's arms as its instances allocate them now.

    ``share`` is the current q of a shared instance, or for an experiment with one
    instance per unit the mean of their q (``basis`` says which); rows are averaged over
    contexts. ``decisions`` and ``feedback`` are the instances' selections made and
    feedback applied.
    """

    experiment: str
    basis: str
    instances: int
    arms: list[str]
    share: list[float]
    decisions: int
    feedback: int
    open_tickets: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def leaderboard(views: list[InstanceView]) -> list[Board]:
    """One ``Board`` per experiment of ``views``, in name order.

    >>> a = describe("e", {"experiment": "e", "bandit": Bandit(2).to_dict()})
    >>> [board] = leaderboard([a])
    >>> board.basis, board.share
    ('current q of the shared instance', [0.5, 0.5])
    """
    by_experiment: dict[str, list[InstanceView]] = {}
    for v in views:
        by_experiment.setdefault(v.experiment, []).append(v)
    boards = []
    for experiment, group in sorted(by_experiment.items()):
        arms = group[0].arms
        if any(v.arms != arms for v in group):
            raise InspectError(f"experiment {experiment!r}: its instances name other arms")
        shared = len(group) == 1 and group[0].unit is None
        basis = (
            "current q of the shared instance"
            if shared
            else f"mean q over {len(group)} instances (one per unit)"
        )
        rows = [[sum(col) / len(v.q) for col in zip(*v.q, strict=True)] for v in group]
        share = [sum(col) / len(rows) for col in zip(*rows, strict=True)]
        boards.append(
            Board(
                experiment,
                basis + (", averaged over contexts" if len(group[0].q) > 1 else ""),
                len(group),
                arms,
                share,
                sum(v.rounds for v in group),
                sum(v.updates for v in group),
                sum(v.open_tickets for v in group),
            )
        )
    return boards


def render_leaderboard(boards: list[Board]) -> str:
    """The leaderboard a person reads: per experiment its arms by share, highest first."""
    lines = []
    for b in boards:
        lines.append(
            f"{b.experiment}  decisions {b.decisions:,}  feedback {b.feedback:,}"
            f"  open {b.open_tickets:,}  share: {b.basis}"
        )
        width = max(len(a) for a in b.arms)
        for arm, share in sorted(zip(b.arms, b.share, strict=True), key=lambda x: -x[1]):
            lines.append(f"  {arm:<{width}}  {share:7.2%}  {'█' * round(share * 40)}")
    lines.append(f"mean loss: {NO_LOSS}")
    return "\n".join(lines)
