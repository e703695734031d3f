"""Counterfactual evaluation of a registry configuration on logged data (``tsi evaluate``).

A log is JSON Lines, one object per line, of one of two kinds (all lines the same kind):

* **full information**: ``{"experiment", "unit"?, "context"?, "losses": [l_0, …, l_{M-1}]}``,
  every arm's loss known (simulations, supervised data). The configuration's bandit is
  replayed over the rows and its regret against the best fixed arm and the best switching
  sequence in hindsight is exact (``evaluate_full_information``).
* **bandit feedback**: ``{"experiment", "unit"?, "context"?, "arm", "prob", "loss"}``, the
  loss of the logged arm only, with its logged propensity ``prob`` (what the service's own
  selections and feedback give). The configuration's policy, learning online, is evaluated
  by replay / rejection sampling and by inverse propensity scoring
  (``evaluate_bandit_log``).

Other fields (``request_id``, ``ts``, …) are ignored; blank lines are skipped; line numbers
are the file's, from 1. Every malformed line raises ``EvaluationError`` naming
``source:line`` and the bad value.

The policy's draws are reproducible: the arm drawn at the row of line ``n`` by instance
``key`` uses ``u = uniform_draw(experiment.seed, key, str(n))`` (``f"{n}#{seed}"`` for an
evaluation ``seed`` > 0), the request id being the line number (see ``request_id``).

>>> import json
>>> from flows.service.registry import Registry
>>> registry = Registry.from_toml('[experiments.home]\\narms = ["a", "b"]')
>>> rows = [json.dumps({"experiment": "home", "losses": [0.25, 0.75]})] * 40
>>> result = evaluate(read_log(rows), registry)["home"]
>>> result.rounds, result.best_arm, result.best_fixed_loss
(40, 'a', 10.0)
>>> 0 < result.regret_fixed < 40 * 0.5
True
>>> read_log(['{"experiment": "home", "arm": 0, "prob": 1.5, "loss": 0}'])
Traceback (most recent call last):
flows.tools.evaluation.EvaluationError: <log>:1: prob must be in (0, 1], got 1.5
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Any, NamedTuple

import numpy as np
import orjson

from flows.service.events import MAX_ABS_LOSS, MAX_ID_LENGTH
from flows.service.instance import uniform_draw
from flows.service.registry import Experiment, Registry
from flows.tools.loss_table import LossTable
from tsi_core import Bandit, Switching

__all__ = [
    "BANDIT",
    "FULL_INFORMATION",
    "BanditLogResult",
    "BanditRecord",
    "Estimate",
    "Evaluation",
    "EvaluationError",
    "FullInformationResult",
    "FullRecord",
    "InstanceRegret",
    "Log",
    "effective_sample_size",
    "evaluate",
    "evaluate_bandit_log",
    "evaluate_full_information",
    "ips_estimate",
    "load_log",
    "mean_estimate",
    "read_log",
    "request_id",
    "snips_estimate",
]

FULL_INFORMATION = "full-information"
BANDIT = "bandit"
DEFAULT_SWITCHES = 3  # competitor switches when the competition class names none
UNIFORM_TOLERANCE = 1e-9  # |prob - 1/M| below which logging counts as uniform


class EvaluationError(ValueError):
    """A log or an evaluation request that cannot be evaluated; one line of text."""


# --------------------------------------------------------------------------- records


class FullRecord(NamedTuple):
    """One full-information row: every arm's loss."""

    line: int
    experiment: str
    unit: str | None
    context: int | None
    losses: tuple[float, ...]


class BanditRecord(NamedTuple):
    """One bandit-feedback row: the logged arm, its logged propensity and its loss."""

    line: int
    experiment: str
    unit: str | None
    context: int | None
    arm: int
    prob: float
    loss: float


@dataclass(frozen=True)
class Log:
    """A parsed log: its ``kind`` (``FULL_INFORMATION`` or ``BANDIT``) and its records."""

    source: str
    kind: str
    records: tuple[FullRecord, ...] | tuple[BanditRecord, ...]

    @property
    def experiments(self) -> list[str]:
        """Experiment names in the order of their first record."""
        return list(dict.fromkeys(r.experiment for r in self.records))

    def __len__(self) -> int:
        return len(self.records)


def load_log(path: str | Path) -> Log:
    """Read and validate a JSON Lines log file (see ``read_log``)."""
    try:
        with open(path, "rb") as handle:
            return read_log(handle, str(path))
    except OSError as exc:
        raise EvaluationError(f"cannot read log {path}: {exc.strerror}") from None


def read_log(lines: Iterable[str | bytes], source: str = "<log>") -> Log:
    """Parse and validate log lines (a file object or a list of strings).

    Checks each line on its own (JSON object, field types, ``prob`` in (0, 1], finite
    losses with |loss| <= 1e300, like the service's feedback) and that all lines are of one
    kind. Checks that need the registry (arm counts, contexts, units) are made by
    ``evaluate``.
    """
    records: list[Any] = []
    kind: str | None = None
    first_line = 0
    for number, raw in enumerate(lines, start=1):
        text = raw.strip()
        if not text:
            continue
        data = _json_object(text, source, number)
        this_kind = _kind_of(data, source, number)
        if kind is None:
            kind, first_line = this_kind, number
        elif this_kind != kind:
            raise EvaluationError(
                f"{source}:{number}: a {this_kind} record, but line {first_line} is a {kind} "
                "record: a log holds one kind"
            )
        records.append(_record(data, this_kind, source, number))
    if kind is None:
        raise EvaluationError(f"{source}: the log has no records")
    return Log(source, kind, tuple(records))


def _json_object(text: str | bytes, source: str, number: int) -> dict[str, Any]:
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise EvaluationError(f"{source}:{number}: not valid JSON ({exc}): {_clip(text)}") from None
    if not isinstance(data, dict):
        raise EvaluationError(f"{source}:{number}: expected a JSON object, got {_clip(data)}")
    return data


def _kind_of(data: dict[str, Any], source: str, number: int) -> str:
    full = "losses" in data
    bandit = [k for k in ("arm", "prob", "loss") if k in data]
    if full and bandit:
        raise EvaluationError(
            f"{source}:{number}: both 'losses' (full information) and {bandit} "
            "(bandit feedback): a record is one or the other"
        )
    if not full and not bandit:
        raise EvaluationError(
            f"{source}:{number}: neither 'losses' (full information) nor 'arm', 'prob', "
            f"'loss' (bandit feedback) in {_clip(data)}"
        )
    return FULL_INFORMATION if full else BANDIT


def _record(data: dict[str, Any], kind: str, source: str, number: int) -> Any:
    where = f"{source}:{number}"
    experiment = _identifier(data, "experiment", where, required=True)
    unit = _identifier(data, "unit", where, required=False)
    context = data.get("context")
    if context is not None and not _is_int(context, 0):
        raise EvaluationError(f"{where}: context must be an integer >= 0, got {context!r}")
    if kind == FULL_INFORMATION:
        losses = data["losses"]
        if not isinstance(losses, list) or not losses:
            raise EvaluationError(
                f"{where}: losses must be a non-empty list of numbers, got {_clip(losses)}"
            )
        for m, value in enumerate(losses):
            _check_loss(value, f"losses[{m}]", where)
        return FullRecord(number, experiment, unit, context, tuple(float(x) for x in losses))
    for name in ("arm", "prob", "loss"):
        if data.get(name) is None:
            raise EvaluationError(f"{where}: field {name!r} is required in a bandit record")
    arm, prob = data["arm"], data["prob"]
    if not _is_int(arm, 0):
        raise EvaluationError(f"{where}: arm must be an integer >= 0, got {arm!r}")
    if not _is_real(prob) or not 0.0 < prob <= 1.0:
        raise EvaluationError(f"{where}: prob must be in (0, 1], got {prob!r}")
    loss = _check_loss(data["loss"], "loss", where)
    return BanditRecord(number, experiment, unit, context, arm, float(prob), loss)


def _identifier(data: dict[str, Any], name: str, where: str, required: bool) -> str | None:
    value = data.get(name)
    if value is None:
        if required:
            raise EvaluationError(f"{where}: field {name!r} is required")
        return None
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_LENGTH:
        raise EvaluationError(
            f"{where}: {name} must be a string of 1 to {MAX_ID_LENGTH} characters, "
            f"got {_clip(value)}"
        )
    return value


def _check_loss(value: Any, name: str, where: str) -> float:
    if not _is_real(value) or not abs(value) <= MAX_ABS_LOSS:
        raise EvaluationError(
            f"{where}: {name} must be a finite number with |{name}| <= {MAX_ABS_LOSS:g}, "
            f"got {_clip(value)}"
        )
    return float(value)


def _is_int(value: Any, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _is_real(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _clip(value: Any) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# --------------------------------------------------------------------------- estimates


def _z(level: float) -> float:
    if isinstance(level, bool) or not isinstance(level, int | float) or not 0 < level < 1:
        raise EvaluationError(f"level must be a number in (0, 1), got {level!r}")
    return NormalDist().inv_cdf(0.5 + level / 2)


@dataclass(frozen=True)
class Estimate:
    """An estimated per-round loss with a normal-approximation confidence interval.

    ``low, high = value ∓ z·stderr`` with z the two-sided normal quantile of ``level``;
    ``n`` is the number of terms averaged. ``value`` is NaN when ``n`` is 0, the interval
    unbounded when ``n`` is 1.
    """

    value: float
    stderr: float
    n: int
    level: float

    @property
    def low(self) -> float:
        return self.value - _z(self.level) * self.stderr

    @property
    def high(self) -> float:
        return self.value + _z(self.level) * self.stderr

    def contains(self, x: float) -> bool:
        """Whether ``x`` lies in the confidence interval."""
        return bool(self.low <= x <= self.high)

    def __str__(self) -> str:
        if math.isnan(self.value):
            return "n/a"
        return f"{self.value:.6g} [{self.low:.6g}, {self.high:.6g}]"

    def to_dict(self) -> dict[str, float | int | None]:
        """The figures, JSON-serialisable (None where a figure is NaN or infinite)."""
        figures = {"value": self.value, "stderr": self.stderr, "low": self.low, "high": self.high}
        out: dict[str, float | int | None] = {
            k: v if math.isfinite(v) else None for k, v in figures.items()
        }
        return {**out, "n": self.n, "level": self.level}


def mean_estimate(values: Any, level: float = 0.95) -> Estimate:
    """Sample mean ± z·sd/sqrt(n) (sd with n − 1): assumes roughly independent terms.

    >>> e = mean_estimate([1.0, 2.0, 3.0])
    >>> e.value, round(e.stderr, 6)
    (2.0, 0.57735)
    """
    _z(level)
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n == 0:
        return Estimate(math.nan, math.nan, 0, level)
    if n == 1:
        return Estimate(float(x[0]), math.inf, 1, level)
    return Estimate(float(x.mean()), float(x.std(ddof=1) / math.sqrt(n)), n, level)


def ips_estimate(weights: Any, losses: Any, level: float = 0.95) -> Estimate:
    """Inverse propensity scoring: V̂ = (1/T) Σ w_t·l_t with w_t = q_t(a_t) / prob_t.

    ``q_t`` is the target policy's probability of the logged arm a_t and ``prob_t`` the
    logging policy's. Unbiased for the target's expected per-round loss (1/T) Σ_t Σ_a
    q_t(a)·l_t(a) when the propensities are right, every arm the target can play had
    prob > 0, a_t was drawn independently of the losses given the context, and q_t is
    fixed before round t's loss is seen (a fixed policy, or one that learns only from
    earlier rounds). The CI uses the empirical variance of the terms w_t·l_t (normal
    approximation, martingale CLT). That variance grows with max w ≤ max q/prob, and with
    the losses' offset: IPS is not translation-invariant (adding c to every loss adds
    c·mean(w), not c), so large offsets inflate it; see ``snips_estimate``.

    >>> ips_estimate([2.0, 0.0, 2.0, 0.0], [1.0, 5.0, 0.0, 5.0]).value
    0.5
    """
    w, loss = _pair(weights, losses)
    return mean_estimate(w * loss, level)


def snips_estimate(weights: Any, losses: Any, level: float = 0.95) -> Estimate:
    """Self-normalised IPS: Σ w_t·l_t / Σ w_t, CI by the delta method.

    Consistent under the same assumptions as ``ips_estimate`` but biased at O(1/T); it is
    translation- and scale-equivariant (losses a·l + c give a·V̂ + c), so an offset in the
    losses does not inflate its variance. Terms for the CI: w_t·(l_t − V̂)/mean(w).

    >>> snips_estimate([2.0, 0.0, 2.0, 0.0], [1.0, 5.0, 0.0, 5.0]).value
    0.5
    """
    w, loss = _pair(weights, losses)
    _z(level)
    if len(w) == 0 or not w.sum() > 0:
        return Estimate(math.nan, math.nan, len(w), level)
    value = float((w * loss).sum() / w.sum())
    influence = w * (loss - value) / w.mean()
    stderr = float(influence.std(ddof=1) / math.sqrt(len(w))) if len(w) > 1 else math.inf
    return Estimate(value, stderr, len(w), level)


def effective_sample_size(weights: Any) -> float:
    """Kish's (Σ w)² / Σ w²: how many equally weighted rounds the weights are worth."""
    w = np.asarray(weights, dtype=float)
    square = float((w * w).sum())
    return float(w.sum()) ** 2 / square if square > 0 else 0.0


def _pair(weights: Any, losses: Any) -> tuple[np.ndarray, np.ndarray]:
    w, loss = np.asarray(weights, dtype=float), np.asarray(losses, dtype=float)
    if w.shape != loss.shape or w.ndim != 1:
        raise ValueError(f"weights and losses must be 1-D of one length: {w.shape}, {loss.shape}")
    if (w < 0).any() or not np.isfinite(w).all():
        raise ValueError("weights must be finite and >= 0")
    return w, loss


# --------------------------------------------------------------------------- results


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
                _table(("quantity", "value"), rows),
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

    The confidence intervals (normal approximation) account for the noise of the logged
    losses and of the acceptances given the policy's own draws: they cover the value
    along the path the policy took in this replay. A learning policy's path is itself
    random (another ``seed`` gives another path); over such replications its average
    loss varies a little more than the intervals say (in simulations, z-scores against the
    across-run mean had sd ≈ 1.1-1.4 instead of 1). The spread of the estimates over a
    few evaluation seeds shows that part.

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
    effective_sample_size: float
    max_weight: float
    logged: Estimate
    accepted_losses: np.ndarray = field(repr=False)
    accepted_rows: np.ndarray = field(repr=False)
    weights: np.ndarray = field(repr=False)
    logged_losses: np.ndarray = field(repr=False)
    probabilities: np.ndarray = field(repr=False)

    kind = BANDIT

    @property
    def method(self) -> str:
        if self.uniform:
            return "replay (Li et al. 2011)"
        return "rejection-sampling replay (Dudík et al. 2012)"

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
            "policy": self.policy.to_dict(),
            "expected_accepted": self.expected_accepted,
            "accepted_sd": self.accepted_sd,
            "ips": self.ips.to_dict(),
            "snips": self.snips.to_dict(),
            "effective_sample_size": self.effective_sample_size,
            "max_weight": self.max_weight,
            "logged": self.logged.to_dict(),
        }

    def to_markdown(self) -> str:
        level = f"{self.policy.level:.0%}"
        logging = "uniform" if self.uniform else f"not uniform, min prob {self.min_prob:.4g}"
        accepted = (
            f"{self.policy.n} accepted (expected {self.expected_accepted:.1f} "
            f"± {self.accepted_sd:.1f})"
        )
        ess = f"{self.rounds} (effective {self.effective_sample_size:.1f})"
        rows = [
            (
                self.method,
                _fmt(self.policy),
                accepted,
                "mean loss over the configuration's first n online rounds",
            ),
            (
                "IPS",
                _fmt(self.ips),
                ess,
                "unbiased; variance grows with max q/prob and the losses' offset",
            ),
            ("self-normalised IPS", _fmt(self.snips), ess, "translation-invariant, O(1/T) bias"),
            (
                "logged policy",
                _fmt(self.logged),
                f"{self.rounds}",
                "the baseline: mean logged loss",
            ),
        ]
        return "\n".join(
            [
                f"## {self.experiment}: bandit log ({self.rounds} events, {len(self.arms)} "
                f"arms, {self.n_instances} instance{'s' if self.n_instances > 1 else ''}, "
                f"logging {logging})",
                "",
                _table(
                    ("estimate", "per-round loss", f"{level} CI", "n", "meaning"),
                    [(a, b[0], b[1], c, d) for a, b, c, d in rows],
                ),
                "",
                f"Max weight q/prob seen {self.max_weight:.4g} (bound 1/min prob = "
                f"{self.weight_bound:.4g}). Assumptions: events i.i.d. given the context, "
                "logged arms drawn with the logged propensities independently of the losses, "
                "every propensity ≥ the smallest logged one (rejection sampling). CIs: "
                "normal approximation, for the path the learning policy took in this replay "
                "(another --seed gives another path). Lower is better.",
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


def _fmt(e: Estimate) -> tuple[str, str]:
    if math.isnan(e.value):
        return "n/a", "n/a"
    return f"{e.value:.6g}", f"[{e.low:.6g}, {e.high:.6g}]"


def _table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _ratio(regret: float, scale: float) -> float:
    return regret / scale if scale > 0 else 0.0


# --------------------------------------------------------------------------- evaluation


def request_id(line: int, seed: int = 0) -> str:
    """The request id a row's draws are hashed with: the line number (``#seed`` if > 0)."""
    return str(line) if seed == 0 else f"{line}#{seed}"


def evaluate(
    log: Log,
    registry: Registry,
    experiment: str | None = None,
    switches: int | None = None,
    level: float = 0.95,
    seed: int = 0,
) -> Evaluation:
    """Evaluate each experiment of the log (or only ``experiment``) as the registry
    configures it; full-information and bandit logs as described in the module.

    ``switches``: the competitor's switches in full-information replays (default the
    competition's ``switches`` for a Switching class, else 3; unused for bandit logs).
    ``level``: of the confidence intervals. ``seed``: 0 reproduces the hashed draws of
    ``request_id``; other values give independent replications.
    """
    _z(level)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise EvaluationError(f"seed must be an integer >= 0, got {seed!r}")
    if switches is not None and (not _is_int(switches, 0)):
        raise EvaluationError(f"switches must be an integer >= 0, got {switches!r}")
    names = log.experiments
    if experiment is not None:
        if experiment not in names:
            raise EvaluationError(
                f"{log.source}: no record of experiment {experiment!r} (the log has {names})"
            )
        names = [experiment]
    groups: dict[str, list[Any]] = {name: [] for name in names}
    for record in log.records:
        if record.experiment in groups:
            groups[record.experiment].append(record)
    results: dict[str, ExperimentResult] = {}
    for name, records in groups.items():
        exp = registry.get(name)
        if exp is None:
            known = sorted(registry.experiments)
            raise EvaluationError(
                f"{log.source}:{records[0].line}: experiment {name!r} is not in the registry "
                f"(it has {known})"
            )
        keys = [_check(exp, r, log.source) for r in records]
        if log.kind == FULL_INFORMATION:
            results[name] = evaluate_full_information(exp, records, keys, switches, seed)
        else:
            results[name] = evaluate_bandit_log(exp, records, keys, level, seed)
    return Evaluation(log.source, log.kind, results)


def _check(exp: Experiment, record: Any, source: str) -> str:
    """The record's instance key, after the checks that need the experiment."""
    where = f"{source}:{record.line}"
    m = len(exp.arms)
    if isinstance(record, FullRecord) and len(record.losses) != m:
        raise EvaluationError(
            f"{where}: {len(record.losses)} losses, but experiment {exp.name!r} has {m} arms"
        )
    if isinstance(record, BanditRecord) and record.arm >= m:
        raise EvaluationError(
            f"{where}: arm {record.arm} is out of range: experiment {exp.name!r} has arms "
            f"0 to {m - 1}"
        )
    k, context = exp.n_contexts, record.context
    if k == 1 and context is not None:
        raise EvaluationError(
            f"{where}: context {context} given, but experiment {exp.name!r} takes no context"
        )
    if k > 1 and context is None:
        raise EvaluationError(
            f"{where}: experiment {exp.name!r} needs a context in [0, {k - 1}], got none"
        )
    if k > 1 and context >= k:
        raise EvaluationError(f"{where}: context {context} is not in [0, {k - 1}]")
    if exp.per_unit and record.unit is None:
        raise EvaluationError(
            f"{where}: experiment {exp.name!r} keeps one bandit per unit: 'unit' is required"
        )
    return exp.instance_key(record.unit)


def _default_switches(exp: Experiment) -> int:
    if isinstance(exp.competition, Switching):
        return math.floor(exp.competition.switches)
    return DEFAULT_SWITCHES


def evaluate_full_information(
    exp: Experiment,
    records: list[FullRecord],
    keys: list[str],
    switches: int | None = None,
    seed: int = 0,
) -> FullInformationResult:
    """Replay ``exp``'s bandits over validated rows (``keys``: each row's instance).

    Each row: q_t = the instance's distribution, the expected loss q_t·l_t is counted, the
    arm is drawn with u = uniform_draw(exp.seed, key, request_id(line, seed)) and the
    bandit updated with that arm's loss. Competitor losses come from
    ``flows.tools.loss_table.LossTable`` on each instance's table (exact DP for the
    switching sequence). Sums are taken on losses minus each instance's minimum, so large
    offsets do not cancel the regret away.
    """
    s = _default_switches(exp) if switches is None else switches
    m, n = len(exp.arms), len(records)
    table = np.array([r.losses for r in records], dtype=float)
    rows_of: dict[str, list[int]] = {}
    for t, key in enumerate(keys):
        rows_of.setdefault(key, []).append(t)
    curve_centred = np.empty(n)  # q_t·(l_t − floor of its instance)
    floors = np.empty(n)
    curve_regret = np.empty(n)
    realised = 0.0
    totals = np.zeros(4)  # expected, fixed, switching, contextual (centred)
    absolute = np.zeros(4)
    instances = []
    scale = 0.0
    contextual = exp.n_contexts > 1
    for key, rows in rows_of.items():
        losses = table[rows]
        floor = float(losses.min())
        centred = losses - floor
        bandit = exp.new_bandit(key)
        for i, t in enumerate(rows):
            r = records[t]
            q = bandit.probabilities(r.context)
            curve_centred[t] = float(q @ centred[i])
            ticket = bandit.select(r.context, uniform_draw(exp.seed, key, request_id(r.line, seed)))
            realised += r.losses[ticket.arm]
            bandit.update(ticket, r.losses[ticket.arm])
        floors[rows] = floor
        contexts = np.array([records[t].context for t in rows]) if contextual else None
        env = LossTable(key, centred, contexts, exp.n_contexts)
        best_arm = int(np.argmin(centred.sum(axis=0)))
        curve_regret[rows] = curve_centred[rows] - centred[:, best_arm]
        own = np.array(
            [
                float(curve_centred[rows].sum()),
                env.best_fixed_loss(),
                env.best_switching_loss(s),
                env.best_contextual_loss(),
            ]
        )
        totals += own
        absolute += own + len(rows) * floor
        d = float(losses.max() - floor)
        scale += d * math.sqrt(m * len(rows))
        instances.append(
            InstanceRegret(
                key,
                records[rows[0]].unit if exp.per_unit else None,
                len(rows),
                float(own[0] + len(rows) * floor),
                exp.arms[best_arm],
                float(own[1] + len(rows) * floor),
                float(own[2] + len(rows) * floor),
                float(own[0] - own[1]),
                float(own[0] - own[2]),
                d,
            )
        )
    best_arms = {i.best_arm for i in instances}
    return FullInformationResult(
        experiment=exp.name,
        arms=exp.arms,
        rounds=n,
        switches=s,
        expected_loss=float(absolute[0]),
        realised_loss=realised,
        best_fixed_loss=float(absolute[1]),
        best_arm=best_arms.pop() if len(best_arms) == 1 else None,
        best_switching_loss=float(absolute[2]),
        best_contextual_loss=float(absolute[3]) if contextual else None,
        regret_fixed=float(totals[0] - totals[1]),
        regret_switching=float(totals[0] - totals[2]),
        regret_contextual=float(totals[0] - totals[3]) if contextual else None,
        range=float(table.max() - table.min()),
        scale=scale,
        instances=tuple(instances),
        curve_expected_loss=curve_centred + floors,
        curve_regret_fixed=curve_regret,
    )


def evaluate_bandit_log(
    exp: Experiment,
    records: list[BanditRecord],
    keys: list[str],
    level: float = 0.95,
    seed: int = 0,
) -> BanditLogResult:
    """Replay ``exp``'s policy on validated bandit-feedback rows and estimate its loss.

    Logging is uniform when every prob is 1/M within 1e-9; then p_min = 1/M, else p_min
    is the smallest logged prob. At each row t (logged arm a_t, propensity prob_t, loss
    l_t), the row's instance has distribution q_t; the IPS weight is q_t(a_t)/prob_t. The
    policy draws its arm with u = uniform_draw(exp.seed, key, request_id(line, seed)) and
    the event is accepted when that arm is a_t and, unless logging is uniform, a second
    draw v (request id + "/accept") is below p_min/prob_t. An accepted event updates the
    policy with the loss (with its own ticket); a rejected one is discarded and leaves its
    learning state unchanged.

    Why this works: P(accept, arm a | history, context) = prob(a)·q_t(a)·p_min/prob(a)
    = p_min·q_t(a). So an event is accepted with probability p_min whatever the context,
    and the accepted arm is distributed as q_t: the accepted events are a sample of the
    policy's own online interaction (Li et al. 2011 for uniform logging, where the
    second draw is not needed; rejection sampling with constant c = 1/p_min as in Dudík,
    Erhan, Langford, Li 2012). c = 1/p_min is the smallest constant that keeps the
    acceptance probability q/(c·prob) ≤ 1 for every arm whatever the learning policy's q
    (q can approach 1 on any arm), provided no propensity of the logging policy is below
    the smallest one in the log; the expected number accepted is T·p_min.
    """
    m, n = len(exp.arms), len(records)
    probs = np.array([r.prob for r in records])
    uniform = bool(np.all(np.abs(probs - 1.0 / m) <= UNIFORM_TOLERANCE))
    p_min = 1.0 / m if uniform else float(probs.min())
    weights = np.empty(n)
    distributions = np.empty((n, m))
    logged = np.array([r.loss for r in records])
    accepted: list[int] = []
    bandits: dict[str, Bandit] = {}
    for t, (r, key) in enumerate(zip(records, keys, strict=True)):
        bandit = bandits.get(key)
        if bandit is None:
            bandit = bandits[key] = exp.new_bandit(key)
        q = distributions[t] = bandit.probabilities(r.context)
        weights[t] = q[r.arm] / r.prob
        rid = request_id(r.line, seed)
        ticket = bandit.select(r.context, uniform_draw(exp.seed, key, rid))
        keep = ticket.arm == r.arm
        if keep and not uniform and r.prob > p_min:
            keep = uniform_draw(exp.seed, key, rid + "/accept") < p_min / r.prob
        if keep:
            bandit.update(ticket, r.loss)
            accepted.append(t)
        else:
            bandit.discard(ticket)
    rows = np.array(accepted, dtype=np.int64)
    return BanditLogResult(
        experiment=exp.name,
        arms=exp.arms,
        rounds=n,
        n_instances=len(bandits),
        uniform=uniform,
        min_prob=p_min,
        policy=mean_estimate(logged[rows], level),
        expected_accepted=n * p_min,
        accepted_sd=math.sqrt(n * p_min * (1.0 - p_min)),
        ips=ips_estimate(weights, logged, level),
        snips=snips_estimate(weights, logged, level),
        effective_sample_size=effective_sample_size(weights),
        max_weight=float(weights.max()),
        logged=mean_estimate(logged, level),
        accepted_losses=logged[rows],
        accepted_rows=rows,
        weights=weights,
        logged_losses=logged,
        probabilities=distributions,
    )
