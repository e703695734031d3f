"""Counterfactual evaluation of a registry configuration on logged data (``tsi evaluate``).

A log is JSON Lines, one object per line, of one of two kinds (all lines the same kind):

* **full information**: ``{"experiment", "unit"?, "context"?, "losses": [l_0, …, l_{M-1}]}``,
  every arm's loss known (simulations, supervised data). The configuration's bandit is
  replayed over the rows and its regret against the best fixed arm and the best switching
  sequence in hindsight is exact (``evaluate_full_information``).
* **bandit feedback**: ``{"experiment", "unit"?, "context"?, "arm", "prob", "loss",
  "why"?, "eligible"?}``, the loss of the logged arm only, with its logged propensity
  ``prob`` (what the service's own selections and feedback give), what served it (``why``:
  ``bandit``, the default, ``holdout``, ``burn_in`` or ``forced``) and the arms the request
  allowed (``eligible``: arm names or indices; default all); ``context`` is an index or,
  for an experiment with named ``contexts``, its attributes' values. The configuration's policy,
  learning online and serving as its registry allocates traffic, is evaluated by replay /
  rejection sampling and by inverse propensity scoring (``evaluate_bandit_log``); rows
  served a forced arm are counted, not evaluated; holdout traffic is compared with the
  bandit's.

Other fields (``request_id``, ``ts``, …) are ignored; blank lines are skipped; line numbers
are the file's, from 1. Every malformed line raises ``EvaluationError`` naming
``source:line`` and the bad value. What the service itself writes (selections, and the
feedback and requests it was sent) is joined into a bandit log by ``served``.

Modules: ``logs`` (reading and checking logs), ``served`` (joining the service's logs),
``windows`` (the loss the service applied: its window, aggregate and default),
``inputs`` (which sources and registries a command names), ``estimators`` (IPS and
friends), ``policy`` (replaying the configuration), ``results`` (what comes back, as JSON
figures and Markdown), ``compare`` (several configurations on one log).

>>> import json
>>> from flows.service.instances.registry import Registry
>>> registry = Registry.from_toml('[experiments.home]\\narms = ["a", "b"]')
>>> rows = [json.dumps({"experiment": "home", "losses": [0.25, 0.75]})] * 40
>>> result = evaluate(read_log(rows), registry)["home"]
>>> result.rounds, result.best_arm, result.best_fixed_loss
(40, 'a', 10.0)
>>> 0 < result.regret_fixed < 40 * 0.5
True
"""

from __future__ import annotations

from flows.tools.evaluation.estimators import (
    Estimate,
    effective_sample_size,
    ips_estimate,
    mean_estimate,
    snips_estimate,
)
from flows.tools.evaluation.logs import (
    BANDIT,
    FULL_INFORMATION,
    BanditRecord,
    EvaluationError,
    FullRecord,
    Log,
    load_log,
    read_log,
)
from flows.tools.evaluation.policy import (
    DEFAULT_SWITCHES,
    UNIFORM_TOLERANCE,
    evaluate,
    evaluate_bandit_log,
    evaluate_full_information,
    request_id,
)
from flows.tools.evaluation.results import (
    BanditLogResult,
    Evaluation,
    ExperimentResult,
    FullInformationResult,
    InstanceRegret,
)

__all__ = [
    "BANDIT",
    "DEFAULT_SWITCHES",
    "FULL_INFORMATION",
    "UNIFORM_TOLERANCE",
    "BanditLogResult",
    "BanditRecord",
    "Estimate",
    "Evaluation",
    "EvaluationError",
    "ExperimentResult",
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
