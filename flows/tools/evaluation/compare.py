"""Several registry configurations evaluated on one log, side by side.

A configuration is a registry as written, traffic allocations included, or with every
experiment's ``variant`` replaced (``--variant``): the counterfactual value of each on
the same logged events, and, on a served log, the served policy's own value (the
mean loss it got, with its interval).

>>> import json
>>> from flows.service.instances.registry import Registry
>>> from flows.tools.evaluation import read_log
>>> base = Registry.from_toml('[experiments.home]\\narms = ["a", "b"]')
>>> rows = [json.dumps({"experiment": "home", "arm": t % 2, "prob": 0.5, "loss": t % 2})
...         for t in range(200)]
>>> result = compare(read_log(rows), configurations([("reg.toml", base)], ["paper"]))
>>> [label for label, _ in result.evaluations]
['reg.toml', 'reg.toml, variant paper']
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from flows.service.instances.registry import Registry
from flows.tools.evaluation.estimators import MIN_ESS, Estimate
from flows.tools.evaluation.logs import EvaluationError, Log
from flows.tools.evaluation.policy import evaluate
from flows.tools.evaluation.results import (
    BanditLogResult,
    Evaluation,
    ess_note,
    fmt_ess,
    fmt_estimate,
    markdown_table,
)
from flows.tools.evaluation.served import Served
from tsi_core.variant import variant_of


@dataclass(frozen=True)
class Configuration:
    """A registry to evaluate, and how the report names it."""

    label: str
    registry: Registry


def configurations(
    registries: list[tuple[str, Registry]], variants: list[str] | None = None
) -> list[Configuration]:
    """Each registry as written, then with each of ``variants`` in every experiment."""
    out = []
    for label, registry in registries:
        out.append(Configuration(label, registry))
        for name in variants or []:
            try:
                variant_of(name)
            except ValueError as exc:
                raise EvaluationError(str(exc)) from None
            changed = {
                n: dataclasses.replace(e, variant=name) for n, e in registry.experiments.items()
            }
            out.append(Configuration(f"{label}, variant {name}", Registry(changed)))
    return out


@dataclass(frozen=True)
class Comparison:
    """Every configuration's evaluation of one log (and the join it came from, if any)."""

    source: str
    evaluations: list[tuple[str, Evaluation]]
    served: Served | None = None

    def experiments(self) -> list[str]:
        return list(self.evaluations[0][1].results)

    def to_dict(self) -> dict[str, Any]:
        served = None if self.served is None else dataclasses.asdict(self.served)
        if served is not None:
            del served["log"]
        return {
            "source": self.source,
            "served": served,
            "configurations": {label: e.to_dict() for label, e in self.evaluations},
        }

    def to_markdown(self) -> str:
        lines = [f"# Counterfactual evaluation of {self.source}", ""]
        if self.served is not None:
            lines += ["What was served: " + self.served.summary(), ""]
        for name in self.experiments():
            lines += [self._summary(name), ""]
        for label, evaluation in self.evaluations:
            lines += [f"# Configuration: {label}", ""]
            for result in evaluation:
                lines += [result.to_markdown(), ""]
        return "\n".join(lines)

    def _summary(self, experiment: str) -> str:
        """One table per experiment: each configuration's estimates, the served value."""
        results = [(label, e[experiment]) for label, e in self.evaluations]
        if not isinstance(results[0][1], BanditLogResult):
            rows = [
                (label, f"{r.regret_fixed:.6g}", f"{r.expected_loss:.6g}") for label, r in results
            ]
            head = ("configuration", "regret vs best fixed arm", "expected loss")
            return f"## {experiment}: exact replay on full information\n\n" + markdown_table(
                head, rows
            )
        first = results[0][1]
        rows = [_bandit_row(label, r) for label, r in results]
        served = ("served policy (what it got)", *fmt_estimate(first.logged))
        rows.append((*served, str(first.rounds), fmt_ess(first.logged), "", "", ""))
        head = (
            "configuration",
            "per-round loss",
            f"{first.policy.level:.0%} CI",
            "n",
            "ESS",
            "IPS",
            "SNIPS",
            "IPS/SNIPS ESS",
        )
        return (
            f"## {experiment}: per-round loss, lower is better\n\n"
            + markdown_table(head, rows)
            + "\n\nThe first column is the replay estimate of each configuration learning "
            "online on these events; IPS and SNIPS weight every event. The served policy's "
            f"row is the mean loss the service got, with its interval. {ess_note(first.min_ess)}"
            + _forced_note(first)
        )


def _forced_note(r: BanditLogResult) -> str:
    """The rows served a forced arm, left out of every figure of the table."""
    if not r.forced:
        return ""
    return (
        f" {r.forced:,} rows served a forced arm (why = forced) are excluded from every "
        "figure here, the served policy's included: no other arm could be served there."
    )


def _bandit_row(label: str, r: BanditLogResult) -> tuple[str, ...]:
    value, interval = fmt_estimate(r.policy, r.min_ess)
    ips, snips = (_short(e, r.min_ess) for e in (r.ips, r.snips))
    return (label, value, interval, str(r.policy.n), fmt_ess(r.policy), ips, snips, fmt_ess(r.ips))


def _short(e: Estimate, min_ess: float) -> str:
    value, interval = fmt_estimate(e, min_ess)
    return value if not e.enough(min_ess) else f"{value} {interval}"


def compare(
    log: Log,
    chosen: list[Configuration],
    experiment: str | None = None,
    switches: int | None = None,
    level: float = 0.95,
    seed: int = 0,
    served: Served | None = None,
    min_ess: float = MIN_ESS,
) -> Comparison:
    """Evaluate ``log`` under each configuration (see ``evaluate``)."""
    if not chosen:
        raise EvaluationError("no configuration to evaluate: give --registry")
    evaluations = [
        (c.label, evaluate(log, c.registry, experiment, switches, level, seed, min_ess))
        for c in chosen
    ]
    return Comparison(log.source, evaluations, served)
