"""Replaying a registry configuration on a log: the checks that need the experiment, the
exact full-information replay and the replay / rejection-sampling run on a bandit log.

The policy's draws are reproducible: the arm drawn at the row of line ``n`` by instance
``key`` uses ``u = uniform_draw(experiment.seed, key, request_id(n, seed))``.

>>> request_id(12), request_id(12, seed=3)
('12', '12#3')
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np

from flows.service.instances.instance import uniform_draw
from flows.service.instances.registry import Experiment, Registry, unit_required
from flows.service.instances.serving import arm_indices
from flows.tools.evaluation.estimators import (
    MIN_ESS,
    ips_estimate,
    mean_estimate,
    snips_estimate,
    z_of,
)
from flows.tools.evaluation.logs import (
    BANDIT,
    FULL_INFORMATION,
    BanditRecord,
    EvaluationError,
    FullRecord,
    Log,
    is_int,
)
from flows.tools.evaluation.results import (
    BanditLogResult,
    Evaluation,
    ExperimentResult,
    FullInformationResult,
    HoldoutComparison,
    InstanceRegret,
)
from flows.tools.loss_table import LossTable
from tsi_core import Bandit, Switching
from tsi_core.bandit import check_context
from tsi_core.structures import Structure

DEFAULT_SWITCHES = 3  # competitor switches when the competition class names none
UNIFORM_TOLERANCE = 1e-9  # |prob - 1/M| below which logging counts as uniform


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
    min_ess: float = MIN_ESS,
) -> Evaluation:
    """Evaluate each experiment of the log (or only ``experiment``) as the registry
    configures it, serving as it would (its ``allocation``: floor, holdout, burn-in,
    forced arm): full-information logs with ``evaluate_full_information``, bandit logs
    with ``evaluate_bandit_log``.

    ``switches``: the competitor's switches in full-information replays (default the
    competition's ``switches`` for a Switching class, else 3; unused for bandit logs).
    ``level``: of the confidence intervals. ``seed``: 0 reproduces the hashed draws of
    ``request_id``; other values give independent replications. ``min_ess``: the
    effective sample size below which a bandit log's estimate is insufficient data.
    """
    z_of(level)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise EvaluationError(f"seed must be an integer >= 0, got {seed!r}")
    if isinstance(min_ess, bool) or not isinstance(min_ess, int | float) or not min_ess >= 0:
        raise EvaluationError(f"min_ess (--min-ess) must be a number >= 0, got {min_ess!r}")
    if switches is not None and (not is_int(switches, 0)):
        raise EvaluationError(f"switches must be an integer >= 0, got {switches!r}")
    results: dict[str, ExperimentResult] = {}
    for name, records in _groups(log, experiment).items():
        exp = registry.get(name)
        if exp is None:
            known = sorted(registry.experiments)
            raise EvaluationError(
                f"{log.source}:{records[0].line}: experiment {name!r} is not in the registry "
                f"(it has {known})"
            )
        structure = _structure(exp)
        if log.kind == BANDIT:
            records = [served_arms(exp, r, log.source) for r in records]
        keys = [record_key(exp, structure, r, log.source) for r in records]
        if log.kind == FULL_INFORMATION:
            results[name] = evaluate_full_information(exp, records, keys, switches, seed)
        else:
            results[name] = evaluate_bandit_log(exp, records, keys, level, seed, min_ess)
    return Evaluation(log.source, log.kind, results)


def _groups(log: Log, experiment: str | None) -> dict[str, list[Any]]:
    """The log's records by experiment (only ``experiment``'s if given), in log order."""
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
    return groups


# --------------------------------------------------------------------------- per-record checks


def _structure(exp: Experiment) -> Structure:
    """The bound competition class of ``exp``'s bandits (what ``check_context`` takes)."""
    return exp.new_bandit(exp.name).structure


def record_key(exp: Experiment, structure: Structure, record: Any, source: str) -> str:
    """The record's instance key, after the checks that need the experiment: its losses or
    arm against the experiment's arms, its context (``tsi_core.bandit.check_context``), its
    unit."""
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
    try:
        check_context(structure, record.context)
    except ValueError:
        raise EvaluationError(_context_refused(exp, structure, record.context, where)) from None
    if exp.per_unit and record.unit is None:
        raise EvaluationError(f"{where}: {unit_required(exp.name)}")
    return exp.instance_key(record.unit)


def served_arms(exp: Experiment, record: BanditRecord, source: str) -> BanditRecord:
    """The record with its named context as the experiment's index (``contexts``), and
    its eligible arms as sorted indices of ``exp``'s arms (None: all), after the checks
    that need them: every named arm is one of the experiment's, the logged arm is
    eligible, an only eligible arm was served with prob 1, and the experiment's forced
    arm, if any, is eligible."""
    where, arms = f"{source}:{record.line}", exp.arms
    if isinstance(record.context, dict):
        record = record._replace(context=_named_context(exp, record.context, where))
    if record.eligible is None:
        return record
    arm_index = {name: i for i, name in enumerate(arms)}
    indices, unknown = arm_indices(arm_index, len(arms), record.eligible)
    if unknown:
        raise EvaluationError(
            f"{where}: eligible arm {unknown[0]!r} is not one of experiment {exp.name!r}'s "
            f"arms {list(arms)} (or an index 0 to {len(arms) - 1})"
        )
    if len(set(indices)) != len(indices):
        raise EvaluationError(f"{where}: eligible arms repeat: {list(record.eligible)}")
    if record.arm not in indices:
        raise EvaluationError(
            f"{where}: arm {record.arm} was served, but it is not eligible "
            f"({list(record.eligible)})"
        )
    if len(indices) == 1 and record.prob != 1.0:
        raise EvaluationError(
            f"{where}: the only eligible arm is served with prob 1, got prob {record.prob!r}"
        )
    forced = exp.allocation.force_arm
    if forced is not None and forced not in indices:
        raise EvaluationError(
            f"{where}: the evaluated configuration forces arm {arms[forced]!r}, which this "
            f"request does not allow ({list(record.eligible)})"
        )
    return record._replace(eligible=None if len(indices) == len(arms) else tuple(sorted(indices)))


def _named_context(exp: Experiment, context: dict[str, str], where: str) -> int:
    """The index of a named context in ``exp``'s ``contexts`` (a value not listed: its
    attribute's ``other`` slot, as the service serves it)."""
    if exp.contexts is None:
        raise EvaluationError(
            f"{where}: named context {context!r}, but experiment {exp.name!r} has no contexts"
        )
    try:
        return exp.contexts.index(context)[0]
    except KeyError as exc:
        raise EvaluationError(f"{where}: context attribute {exc.args[0]!r} is missing") from None
    except ValueError as exc:
        raise EvaluationError(f"{where}: {exc}") from None


def _context_refused(exp: Experiment, structure: Structure, context: Any, where: str) -> str:
    """The evaluation's words for a context that ``check_context`` refuses."""
    k = structure.n_contexts
    if context is None:
        return f"{where}: experiment {exp.name!r} needs a context in [0, {k - 1}], got none"
    if k == 1:
        return f"{where}: context {context} given, but experiment {exp.name!r} takes no context"
    return f"{where}: context {context} is not in [0, {k - 1}]"


# --------------------------------------------------------------------------- full information


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
    """Replay ``exp``'s bandits, serving with its allocation, over validated rows
    (``keys``: each row's instance).

    Each row: q_t = the instance's serving distribution P (``probabilities``), the
    expected loss q_t·l_t is counted, the arm is drawn with u = uniform_draw(exp.seed,
    key, request_id(line, seed)) and the bandit updated with that arm's loss. Competitor
    losses come from ``flows.tools.loss_table.LossTable`` on each instance's table (exact
    DP for the switching sequence). Sums are taken on losses minus each instance's
    minimum, so large offsets do not cancel the regret away.
    """
    s = _default_switches(exp) if switches is None else switches
    replay = _FullReplay(exp, records, s, seed)
    rows_of: dict[str, list[int]] = {}
    for t, key in enumerate(keys):
        rows_of.setdefault(key, []).append(t)
    for key, rows in rows_of.items():
        replay.instance(key, rows)
    return replay.result()


class _FullReplay:
    """The running sums of a full-information replay, one instance after the other."""

    def __init__(self, exp: Experiment, records: list[FullRecord], switches: int, seed: int):
        self.exp, self.records, self.switches, self.seed = exp, records, switches, seed
        n = len(records)
        self.table = np.array([r.losses for r in records], dtype=float)
        self.curve_centred = np.empty(n)  # q_t·(l_t − floor of its instance)
        self.floors = np.empty(n)
        self.curve_regret = np.empty(n)
        self.realised = 0.0
        self.totals = np.zeros(4)  # expected, fixed, switching, contextual (centred)
        self.absolute = np.zeros(4)
        self.instances: list[InstanceRegret] = []
        self.scale = 0.0
        self.contextual = exp.n_contexts > 1

    def _play(self, key: str, rows: list[int], centred: np.ndarray) -> None:
        """Run instance ``key``'s bandit over its rows: q_t·l_t and the realised loss."""
        exp, records = self.exp, self.records
        bandit = exp.new_bandit(key)
        for i, t in enumerate(rows):
            r = records[t]
            q = bandit.probabilities(r.context)
            self.curve_centred[t] = float(q @ centred[i])
            u = uniform_draw(exp.seed, key, request_id(r.line, self.seed))
            ticket = bandit.select(r.context, u)
            self.realised += r.losses[ticket.arm]
            bandit.update(ticket, r.losses[ticket.arm])

    def instance(self, key: str, rows: list[int]) -> None:
        """Replay one instance and add its losses and competitors to the sums."""
        exp, m = self.exp, len(self.exp.arms)
        losses = self.table[rows]
        floor = float(losses.min())
        centred = losses - floor
        self._play(key, rows, centred)
        self.floors[rows] = floor
        contexts = np.array([self.records[t].context for t in rows]) if self.contextual else None
        env = LossTable(key, centred, contexts, exp.n_contexts)
        best_arm = int(np.argmin(centred.sum(axis=0)))
        self.curve_regret[rows] = self.curve_centred[rows] - centred[:, best_arm]
        own = np.array(
            [
                float(self.curve_centred[rows].sum()),
                env.best_fixed_loss(),
                env.best_switching_loss(self.switches),
                env.best_contextual_loss(),
            ]
        )
        self.totals += own
        self.absolute += own + len(rows) * floor
        d = float(losses.max() - floor)
        self.scale += d * math.sqrt(m * len(rows))
        unit = self.records[rows[0]].unit if exp.per_unit else None
        self.instances.append(_instance_regret(exp, key, unit, len(rows), floor, own, best_arm, d))

    def result(self) -> FullInformationResult:
        exp, totals, absolute, contextual = self.exp, self.totals, self.absolute, self.contextual
        best_arms = {i.best_arm for i in self.instances}
        return FullInformationResult(
            experiment=exp.name,
            arms=exp.arms,
            rounds=len(self.records),
            switches=self.switches,
            expected_loss=float(absolute[0]),
            realised_loss=self.realised,
            best_fixed_loss=float(absolute[1]),
            best_arm=best_arms.pop() if len(best_arms) == 1 else None,
            best_switching_loss=float(absolute[2]),
            best_contextual_loss=float(absolute[3]) if contextual else None,
            regret_fixed=float(totals[0] - totals[1]),
            regret_switching=float(totals[0] - totals[2]),
            regret_contextual=float(totals[0] - totals[3]) if contextual else None,
            range=float(self.table.max() - self.table.min()),
            scale=self.scale,
            instances=tuple(self.instances),
            curve_expected_loss=self.curve_centred + self.floors,
            curve_regret_fixed=self.curve_regret,
        )


def _instance_regret(
    exp: Experiment,
    key: str,
    unit: str | None,
    rounds: int,
    floor: float,
    own: np.ndarray,
    best_arm: int,
    d: float,
) -> InstanceRegret:
    """One instance's figures from its centred sums ``own`` (expected, fixed, switching)."""
    return InstanceRegret(
        key,
        unit,
        rounds,
        float(own[0] + rounds * floor),
        exp.arms[best_arm],
        float(own[1] + rounds * floor),
        float(own[2] + rounds * floor),
        float(own[0] - own[1]),
        float(own[0] - own[2]),
        d,
    )


# --------------------------------------------------------------------------- bandit feedback


def evaluate_bandit_log(
    exp: Experiment,
    records: list[BanditRecord],
    keys: list[str],
    level: float = 0.95,
    seed: int = 0,
    min_ess: float = MIN_ESS,
) -> BanditLogResult:
    """Replay ``exp``'s policy, serving with its allocation, on validated bandit-feedback
    rows and estimate its loss (``min_ess``: see ``BanditLogResult``).

    Rows served a forced arm (``why`` "forced", prob 1: no other arm could have been
    served) carry nothing about another policy: they are counted and left out, and the
    estimates are over the other rows. The policy is evaluated as it would serve: its
    probability of an arm at row t is P_t = ``bandit.probabilities(context, eligible)``
    of the row's instance, with the allocation (floor, holdout, burn-in, forced arm) and
    the row's eligible arms; its draws and updates are its tickets' (``select`` with the
    row's eligible arms), as in the service.

    Logging is uniform when every prob is 1/M within 1e-9; then p_min = 1/M, else p_min
    is the smallest logged prob. At each row t (logged arm a_t, propensity prob_t, loss
    l_t) the IPS weight is P_t(a_t)/prob_t. The policy draws its arm with u =
    uniform_draw(exp.seed, key, request_id(line, seed)) and the event is accepted when
    that arm is a_t and, unless logging is uniform, a second draw v (request id +
    "/accept") is below p_min/prob_t. An accepted event updates the policy with the loss
    (with its own ticket); a rejected one is discarded and leaves its learning state
    unchanged.

    Why this works: P(accept, arm a | history, context, eligible) = prob(a)·P_t(a)·p_min/
    prob(a) = p_min·P_t(a). So an event is accepted with probability p_min whatever the
    context and the eligible arms, and the accepted arm is distributed as P_t: the
    accepted events are a sample of the policy's own online interaction (Li et al. 2011
    for uniform logging, where the second draw is not needed; rejection sampling with
    constant c = 1/p_min as in Dudík, Erhan, Langford, Li 2012). c = 1/p_min is the
    smallest constant that keeps the acceptance probability P/(c·prob) ≤ 1 for every arm
    whatever the learning policy's P (P can approach 1 on any arm), provided no
    propensity of the logging policy is below the smallest one in the log; the expected
    number accepted is T·p_min.

    The holdout: when rows were served by the holdout (``why`` "holdout"), the mean loss
    of that traffic is compared with the bandit's (``why`` "bandit"), as logged.
    """
    served_by = dict(Counter(r.why for r in records))
    holdout = _holdout(exp, records, level)
    kept = [t for t, r in enumerate(records) if r.why != "forced"]
    if not kept:
        raise EvaluationError(
            f"experiment {exp.name!r}: every one of its {len(records)} rows was served a "
            "forced arm (why = forced): no other arm could be served, nothing to evaluate"
        )
    records, keys = [records[t] for t in kept], [keys[t] for t in kept]
    m = len(exp.arms)
    probs = np.array([r.prob for r in records])
    uniform = bool(np.all(np.abs(probs - 1.0 / m) <= UNIFORM_TOLERANCE))
    p_min = 1.0 / m if uniform else float(probs.min())
    run = _rejection_replay(exp, records, keys, uniform, p_min, seed)
    return _bandit_result(
        exp, records, uniform, p_min, level, min_ess, *run, served_by=served_by, holdout=holdout
    )


def _rejection_replay(
    exp: Experiment,
    records: list[BanditRecord],
    keys: list[str],
    uniform: bool,
    p_min: float,
    seed: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Run the policy over the rows: (IPS weights, P_t of every row, accepted rows, number
    of instances)."""
    n = len(records)
    weights = np.empty(n)
    distributions = np.empty((n, len(exp.arms)))
    accepted: list[int] = []
    bandits: dict[str, Bandit] = {}
    for t, (r, key) in enumerate(zip(records, keys, strict=True)):
        bandit = bandits.get(key)
        if bandit is None:
            bandit = bandits[key] = exp.new_bandit(key)
        rid = request_id(r.line, seed)
        p = distributions[t] = bandit.probabilities(r.context, r.eligible)
        ticket = bandit.select(r.context, uniform_draw(exp.seed, key, rid), r.eligible)
        weights[t] = p[r.arm] / r.prob
        keep = ticket.arm == r.arm
        if keep and not uniform and r.prob > p_min:
            keep = uniform_draw(exp.seed, key, rid + "/accept") < p_min / r.prob
        if keep:
            bandit.update(ticket, r.loss)
            accepted.append(t)
        else:
            bandit.discard(ticket)
    return weights, distributions, np.array(accepted, dtype=np.int64), len(bandits)


def _holdout(
    exp: Experiment, records: list[BanditRecord], level: float
) -> HoldoutComparison | None:
    """Holdout traffic against the bandit's, as logged (None without holdout rows)."""
    held = [r for r in records if r.why == "holdout"]
    if not held:
        return None
    arm = Counter(r.arm for r in held).most_common(1)[0][0]
    bandit = [r.loss for r in records if r.why == "bandit"]
    return HoldoutComparison.of(
        exp.arms[arm], mean_estimate([r.loss for r in held], level), mean_estimate(bandit, level)
    )


def _bandit_result(
    exp: Experiment,
    records: list[BanditRecord],
    uniform: bool,
    p_min: float,
    level: float,
    min_ess: float,
    weights: np.ndarray,
    distributions: np.ndarray,
    rows: np.ndarray,
    n_instances: int,
    served_by: dict[str, int],
    holdout: HoldoutComparison | None,
) -> BanditLogResult:
    """The estimates from a replay's weights and accepted rows."""
    n = len(records)
    logged = np.array([r.loss for r in records])
    return BanditLogResult(
        experiment=exp.name,
        arms=exp.arms,
        rounds=n,
        n_instances=n_instances,
        uniform=uniform,
        min_prob=p_min,
        policy=mean_estimate(logged[rows], level),
        expected_accepted=n * p_min,
        accepted_sd=math.sqrt(n * p_min * (1.0 - p_min)),
        ips=ips_estimate(weights, logged, level),
        snips=snips_estimate(weights, logged, level),
        max_weight=float(weights.max()),
        logged=mean_estimate(logged, level),
        min_ess=min_ess,
        accepted_losses=logged[rows],
        accepted_rows=rows,
        weights=weights,
        logged_losses=logged,
        probabilities=distributions,
        served_by=served_by,
        holdout=holdout,
    )
