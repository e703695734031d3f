"""What an evaluation returns: per-experiment results (exact regret of a full-information
replay, off-policy estimates from a bandit log), their JSON figures and their Markdown.

>>> e = Evaluation("<log>", "bandit", {})
>>> len(e), e.to_markdown()
(0, '# Counterfactual evaluation of <log> (bandit log)\\n')
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flows.tools.evaluation.estimators import Estimate
from flows.tools.evaluation.logs import BANDIT, FULL_INFORMATION


@dataclass(frozen=True)
class InstanceRegret:
    """One bandit instance of a full-information replay (the experiment, or one unit)."""

    key: str
    unit: str | None
    rounds: int
    expected_loss: float  # Σ q_t·l_t
    best_arm: str
    best_fixed_loss: float
    best_switching_loss: float
    regret_fixed: float
    regret_switching: float
    range: float  # D of this instance's loss table


@dataclass(frozen=True, eq=False)
class FullInformationResult:
    """Exact regret of the configuration replayed on a full-information log.

    ``expected_loss`` is Σ_t q_t·l_t, the loss the configuration expects given its draws
    (q_t is its distribution before round t; it learns only from its drawn arm's loss,
    as in the service). The competitors are the best in hindsight, per instance when the
    experiment keeps one bandit per unit (each unit against its own competitors; the
    figures here are sums over instances). ``normalised_*`` divide by
    ``scale`` = Σ_i D_i·sqrt(M·T_i) (= D·sqrt(M·T) for one instance), the paper's scale.

    Curves (one entry per round, log order): ``curve_expected_loss`` q_t·l_t, and
    ``curve_regret_fixed`` q_t·l_t − l_t(best fixed arm of the round's instance);
    ``np.cumsum`` of the latter is the cumulative regret over time.
    """

    experiment: str
    arms: tuple[str, ...]
    rounds: int
    switches: int
    expected_loss: float
    realised_loss: float  # Σ l_t(a_t) of the draws made
    best_fixed_loss: float
    best_arm: str | None  # None when instances have different best arms
    best_switching_loss: float
    best_contextual_loss: float | None  # contextual experiments only
    regret_fixed: float
    regret_switching: float
    regret_contextual: float | None
    range: float  # D of the whole log (max − min loss)
    scale: float
    instances: tuple[InstanceRegret, ...]
    curve_expected_loss: np.ndarray = field(repr=False)
    curve_regret_fixed: np.ndarray = field(repr=False)

    kind = FULL_INFORMATION

    @property
    def normalised_fixed(self) -> float:
        return _ratio(self.regret_fixed, self.scale)

    @property
    def normalised_switching(self) -> float:
        return _ratio(self.regret_switching, self.scale)

    def to_dict(self) -> dict[str, Any]:
        """The scalar figures (no curves, no per-instance detail), JSON-serialisable."""
        return {
            "experiment": self.experiment,
            "kind": self.kind,
            "rounds": self.rounds,
            "arms": len(self.arms),
            "instances": len(self.instances),
            "expected_loss": self.expected_loss,
            "realised_loss": self.realised_loss,
            "best_fixed_loss": self.best_fixed_loss,
            "best_arm": self.best_arm,
            "switches": self.switches,
            "best_switching_loss": self.best_switching_loss,
            "best_contextual_loss": self.best_contextual_loss,
            "regret_fixed": self.regret_fixed,
            "regret_switching": self.regret_switching,
            "regret_contextual": self.regret_contextual,
            "normalised_fixed": self.normalised_fixed,
            "normalised_switching": self.normalised_switching,
            "range": self.range,
        }

    def to_markdown(self) -> str:
        n = len(self.instances)
        m = len(self.arms)
        per = f"{n} instances (one per unit)" if n > 1 else "1 instance"
        if self.best_arm is not None:
            best = f"{self.best_arm!r}: {self.best_fixed_loss:.6g}"
        else:
            counts = Counter(i.best_arm for i in self.instances).most_common(1)[0]
            best = (
                f"{self.best_fixed_loss:.6g} (each unit's own arm; most often "
                f"{counts[0]!r}, in {counts[1]} of {n})"
            )
        s = self.switches
        rows = [
            ("rounds T", f"{self.rounds}"),
            ("expected cumulative loss Σ q·l of the configuration", f"{self.expected_loss:.6g}"),
            ("realised loss of its draws", f"{self.realised_loss:.6g}"),
            ("best fixed arm in hindsight", best),
            (f"best sequence with ≤ {s} switches", f"{self.best_switching_loss:.6g}"),
            ("regret vs best fixed arm", f"{self.regret_fixed:.6g}"),
            ("normalised: ÷ D·sqrt(M·T)", f"{self.normalised_fixed:.4f}"),
            (f"regret vs best {s}-switch sequence", f"{self.regret_switching:.6g}"),
            ("normalised: ÷ D·sqrt(M·T)", f"{self.normalised_switching:.4f}"),
        ]
        if self.best_contextual_loss is not None and self.regret_contextual is not None:
            rows += [
                ("best map context → arm", f"{self.best_contextual_loss:.6g}"),
                ("regret vs best map context → arm", f"{self.regret_contextual:.6g}"),
            ]
        rows.append(("loss range D", f"{self.range:.6g}"))
        return "\n".join(
            [
                f"## {self.experiment}: full-information replay "
                f"({self.rounds} rounds, {m} arms, {per})",
                "",
                markdown_table(("quantity", "value"), rows),
                "",
                "Exact: every arm's loss is in the log, the competitors are the best in "
                "hindsight (per unit when the experiment keeps one bandit per unit), and "
                "the configuration's expected loss is given its own draws. "
                "D·sqrt(M·T) is summed over instances.",
            ]
        )


@dataclass(frozen=True, eq=False)
class BanditLogResult:
    """Off-policy estimates of the configuration's per-round loss from a bandit log.

    ``policy`` is the replay estimate (Li, Chu, Langford, Wang, WSDM 2011) when logging
    was uniform, else its rejection-sampling generalisation (Dudík, Erhan, Langford, Li,
    UAI 2012 / Statistical Science 2014): the mean loss of the accepted events, on which
    the configuration learns as it would online. Under i.i.d. events it is the
    configuration's average per-round loss over its first ``policy.n`` rounds of online
    play (≈ T·min prob), learning curve included. ``ips`` and ``snips`` weight every
    event by q_t(a_t)/prob_t, q_t being the same learning policy's distribution at event
    t; they estimate the average over t of the value of that snapshot, the same quantity
    as ``policy`` under i.i.d. events (snapshot t has learned from ≈ t·min prob events),
    and for a fixed policy its value even when losses are not i.i.d. ``logged`` is the
    logging policy's own average loss, the baseline.

    Each estimate carries Kish's effective sample size of its weights (``Estimate.ess``):
    the replay's accepted events weigh 1 each (its ESS is ``policy.n``), IPS and SNIPS
    weigh every event by q/prob. An off-policy estimate whose ESS is below ``min_ess`` is
    shown as insufficient data, not as a figure to compare with the logged policy's.

    The confidence intervals (normal approximation) account for the noise of the logged
    losses and of the acceptances given the policy's own draws: they cover the value
    along the path the policy took in this replay. A learning policy's path is itself
    random (another ``seed`` gives another path); over such replications its average
    loss varies more than the intervals say. The spread of the estimates over a few
    evaluation seeds shows that part.

    Rows served a forced arm (``forced``) are not among the ``rounds`` evaluated: every
    other arm had probability 0 there. ``served_by`` counts every row by what served it
    (``why``); ``holdout``, when the log has holdout traffic, compares its mean loss with
    the bandit traffic's (``HoldoutComparison``).

    Curves: ``accepted_losses`` (in acceptance order; the running mean is the replay
    curve), ``accepted_rows`` (their row indices), ``weights`` and ``logged_losses`` (one
    per row; ``weights * logged_losses`` are the IPS terms), ``probabilities`` (T×M: the
    policy's distribution q_t at each row, before the row is replayed).
    """

    experiment: str
    arms: tuple[str, ...]
    rounds: int
    n_instances: int
    uniform: bool
    min_prob: float
    policy: Estimate
    expected_accepted: float
    accepted_sd: float
    ips: Estimate
    snips: Estimate
    max_weight: float
    logged: Estimate
    min_ess: float  # below it an off-policy estimate is "insufficient data"
    accepted_losses: np.ndarray = field(repr=False)
    accepted_rows: np.ndarray = field(repr=False)
    weights: np.ndarray = field(repr=False)
    logged_losses: np.ndarray = field(repr=False)
    probabilities: np.ndarray = field(repr=False)
    served_by: dict[str, int] = field(default_factory=dict)  # rows by ``why``, forced included
    holdout: HoldoutComparison | None = None

    kind = BANDIT

    @property
    def forced(self) -> int:
        """Rows served a forced arm: counted, not evaluated (no other arm could be served)."""
        return self.served_by.get("forced", 0)

    @property
    def method(self) -> str:
        if self.uniform:
            return "replay (Li et al. 2011)"
        return "rejection-sampling replay (Dudík et al. 2012)"

    @property
    def effective_sample_size(self) -> float:
        """Kish's effective sample size of the IPS weights q/prob (IPS's and SNIPS's)."""
        return self.ips.ess

    @property
    def weight_bound(self) -> float:
        """1 / min prob: no weight q/prob can exceed it."""
        return 1.0 / self.min_prob

    def to_dict(self) -> dict[str, Any]:
        """The scalar figures (no curves), JSON-serialisable."""
        return {
            "experiment": self.experiment,
            "kind": self.kind,
            "rounds": self.rounds,
            "arms": len(self.arms),
            "instances": self.n_instances,
            "uniform_logging": self.uniform,
            "method": self.method,
            "min_prob": self.min_prob,
            "policy": self._figures(self.policy),
            "expected_accepted": self.expected_accepted,
            "accepted_sd": self.accepted_sd,
            "ips": self._figures(self.ips),
            "snips": self._figures(self.snips),
            "effective_sample_size": self.effective_sample_size,
            "max_weight": self.max_weight,
            "logged": self.logged.to_dict(),
            "min_ess": self.min_ess,
            "forced_excluded": self.forced,
            "served_by": dict(self.served_by),
            "holdout": None if self.holdout is None else self.holdout.to_dict(),
        }

    def _figures(self, e: Estimate) -> dict[str, Any]:
        """An off-policy estimate's figures, and whether its ESS reaches ``min_ess``."""
        return {**e.to_dict(), "sufficient": e.enough(self.min_ess)}

    def to_markdown(self) -> str:
        level = f"{self.policy.level:.0%}"
        logging = "uniform" if self.uniform else f"not uniform, min prob {self.min_prob:.4g}"
        accepted = (
            f"{self.policy.n} accepted (expected {self.expected_accepted:.1f} "
            f"± {self.accepted_sd:.1f})"
        )
        least = self.min_ess
        rows = [
            (
                self.method,
                fmt_estimate(self.policy, least),
                accepted,
                fmt_ess(self.policy),
                "mean loss over the configuration's first n online rounds",
            ),
            (
                "IPS",
                fmt_estimate(self.ips, least),
                f"{self.rounds}",
                fmt_ess(self.ips),
                "unbiased; variance grows with max q/prob and the losses' offset",
            ),
            (
                "self-normalised IPS",
                fmt_estimate(self.snips, least),
                f"{self.rounds}",
                fmt_ess(self.snips),
                "translation-invariant, O(1/T) bias",
            ),
            (
                "logged policy",
                fmt_estimate(self.logged),
                f"{self.rounds}",
                fmt_ess(self.logged),
                "the baseline: mean logged loss",
            ),
        ]
        return "\n".join(
            [
                f"## {self.experiment}: bandit log ({self.rounds} events, {len(self.arms)} "
                f"arms, {self.n_instances} instance{'s' if self.n_instances > 1 else ''}, "
                f"logging {logging})",
                "",
                markdown_table(
                    ("estimate", "per-round loss", f"{level} CI", "n", "ESS", "meaning"),
                    [(a, b[0], b[1], c, e, d) for a, b, c, e, d in rows],
                ),
                "",
                ess_note(least),
                "",
                f"Max weight q/prob seen {self.max_weight:.4g} (bound 1/min prob = "
                f"{self.weight_bound:.4g}). Assumptions: events i.i.d. given the context, "
                "logged arms drawn with the logged propensities independently of the losses, "
                "every propensity ≥ the smallest logged one (rejection sampling). CIs: "
                "normal approximation, for the path the learning policy took in this replay "
                "(another --seed gives another path). Lower is better.",
                *self._served_markdown(),
            ]
        )

    def _served_markdown(self) -> list[str]:
        """What served the rows, the forced rows left out, and the holdout comparison."""
        if set(self.served_by) <= {"bandit"}:
            return []
        counts = ", ".join(f"{why} {n:,}" for why, n in self.served_by.items())
        lines = ["", f"Rows by what served them (why): {counts}."]
        if self.forced:
            lines[-1] += (
                f" The {self.forced:,} rows served a forced arm are excluded from every "
                "estimate above (no other arm could be served there: no overlap)."
            )
        if self.holdout is not None:
            lines += ["", self.holdout.to_markdown()]
        return lines


@dataclass(frozen=True)
class HoldoutComparison:
    """Holdout traffic against bandit traffic, as logged: the mean observed loss of the
    rows served by the holdout (``why`` "holdout", arm ``arm``) and by the bandit (``why``
    "bandit"), each with its interval, and their difference bandit − holdout (normal
    approximation, the two groups independent; negative: the bandit's traffic lost
    less).

    >>> from flows.tools.evaluation.estimators import mean_estimate
    >>> c = HoldoutComparison.of("control", mean_estimate([1.0, 0.0] * 50),
    ...                          mean_estimate([0.0, 0.0, 0.0, 1.0] * 50))
    >>> round(c.difference.value, 2), c.difference.high < 0
    (-0.25, True)
    """

    arm: str
    holdout: Estimate
    bandit: Estimate
    difference: Estimate

    @classmethod
    def of(cls, arm: str, holdout: Estimate, bandit: Estimate) -> HoldoutComparison:
        """The comparison of two groups' estimates."""
        stderr = math.hypot(holdout.stderr, bandit.stderr)
        value = bandit.value - holdout.value
        n = holdout.n + bandit.n
        return cls(arm, holdout, bandit, Estimate(value, stderr, n, holdout.level))

    def to_dict(self) -> dict[str, Any]:
        return {
            "arm": self.arm,
            "holdout": self.holdout.to_dict(),
            "bandit": self.bandit.to_dict(),
            "difference": self.difference.to_dict(),
        }

    def to_markdown(self) -> str:
        level = f"{self.holdout.level:.0%}"
        rows = [
            (f"holdout (arm {self.arm!r})", *fmt_estimate(self.holdout), str(self.holdout.n)),
            ("bandit", *fmt_estimate(self.bandit), str(self.bandit.n)),
            ("bandit − holdout", *fmt_estimate(self.difference), ""),
        ]
        return "\n".join(
            [
                markdown_table(("traffic", "mean observed loss", f"{level} CI", "rows"), rows),
                "",
                "Observed, not counterfactual: the mean loss each group of requests got as "
                "served (the holdout's share was drawn at random for each request). "
                "Lower is better.",
            ]
        )


ExperimentResult = FullInformationResult | BanditLogResult


@dataclass(frozen=True)
class Evaluation:
    """Results by experiment, in the log's order; ``evaluation["name"]`` is one of them."""

    source: str
    kind: str
    results: dict[str, ExperimentResult]

    def __getitem__(self, experiment: str) -> ExperimentResult:
        return self.results[experiment]

    def __iter__(self) -> Iterator[ExperimentResult]:
        return iter(self.results.values())

    def __len__(self) -> int:
        return len(self.results)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "kind": self.kind,
            "experiments": {name: r.to_dict() for name, r in self.results.items()},
        }

    def to_markdown(self) -> str:
        head = f"# Counterfactual evaluation of {self.source} ({self.kind} log)"
        return "\n\n".join([head, *(r.to_markdown() for r in self)]) + "\n"


def ess_note(min_ess: float) -> str:
    """What the ESS columns are, and what ``min_ess`` does to the estimates."""
    return (
        "ESS: Kish's effective sample size (Σw)²/Σw² of the estimate's weights (1 per "
        "accepted event for the replay, so its n; q/prob per event for IPS and SNIPS; 1 per "
        f"event for the logged policy). Below --min-ess {min_ess:g} an off-policy estimate "
        "is insufficient data: no figure, not ranked against the served policy."
    )


def fmt_estimate(e: Estimate, min_ess: float = 0.0) -> tuple[str, str]:
    """(value, interval) as the tables show them: "insufficient data" and the ESS that
    falls short when ``e`` rests on an effective sample below ``min_ess``.

    >>> fmt_estimate(Estimate(0.5, 0.1, 6, 0.95), min_ess=100)
    ('insufficient data', 'ESS 6 < 100')
    >>> fmt_estimate(Estimate(0.5, 0.1, 600, 0.95), min_ess=100)
    ('0.5', '[0.304004, 0.695996]')
    """
    if math.isnan(e.value):
        return "n/a", "n/a"
    if not e.enough(min_ess):
        return "insufficient data", f"ESS {fmt_ess(e)} < {min_ess:g}"
    return f"{e.value:.6g}", f"[{e.low:.6g}, {e.high:.6g}]"


def fmt_ess(e: Estimate) -> str:
    """An estimate's ESS as the tables show it: to one decimal, whole numbers as such.

    >>> fmt_ess(Estimate(0.5, 0.1, 6, 0.95)), fmt_ess(Estimate(0.5, 0.1, 6, 0.95, 3.26))
    ('6', '3.3')
    """
    return f"{e.ess:.0f}" if e.ess == int(e.ess) else f"{e.ess:.1f}"


def markdown_table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _ratio(regret: float, scale: float) -> float:
    return regret / scale if scale > 0 else 0.0
