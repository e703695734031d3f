"""The numbers of the live page (``GET /experiments``): the service's Prometheus text,
sampled every few seconds from each process (``tsi serve --metrics-url``), summed, kept
for a while, and summarised per experiment. Pure: no network here (``flows.gateway.live``
fetches).

Per arm of an experiment: its share of the selections (since the processes started, and
over the last ``RECENT`` seconds of samples), its outcome (mean loss ± the half-width of
its normal interval at ``Z95``, from ``tsi_arm_loss_sum``, ``tsi_arm_loss_squares_sum`` and n =
feedback + defaulted; the IPS estimate), the current q of a shared instance and its
history (by context for a contextual one: the latest only), and the chance it is served
now (``served``: q under the allocation, a ``min_share`` floor included); per experiment
the feedback by outcome, and whether it is fed rewards rather than losses (``rewards``:
most feedback came as ``reward``, then the outcomes read as rewards, the mean reward =
minus the mean loss); for the service the dead letters by reason (see
``flows.service.observe.metrics`` and ``arm_metrics`` for what each metric counts).

>>> text = '''# TYPE tsi_arm_selections counter
... tsi_arm_selections_total{experiment="e",arm="a"} 3.0
... tsi_arm_selections_total{experiment="e",arm="b"} 1.0
... '''
>>> history = History(every=10.0)
>>> history.add(Sample.of(100.0, [("http://x/metrics", text)]))
>>> [(a["arm"], a["selections"], a["share"]) for a in summary(history)["experiments"][0]["arms"]]
[('a', 3.0, 0.75), ('b', 1.0, 0.25)]
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["KEEP", "RECENT", "Endpoint", "History", "Sample", "parse_metrics", "summary"]

#: seconds of samples the history keeps (the span of the q charts)
KEEP = 6 * 3600.0
#: seconds of samples the recent share of selections is taken over
RECENT = 300.0
#: the normal quantile of a two-sided interval at ninety-five percent
Z95 = 1.96
#: gauges that are readings of one instance: the highest over the endpoints, not the sum
_READINGS = frozenset({"tsi_arm_share", "tsi_arm_served_share", "tsi_arm_context_share"})

Labels = tuple[tuple[str, str], ...]
Samples = dict[str, dict[Labels, float]]  # metric -> sorted labels -> value


def parse_metrics(text: str) -> Samples:
    """The ``tsi_*`` samples of one endpoint's Prometheus text, by name and sorted labels;
    ``ValueError`` when the text is not Prometheus' format.

    >>> parse_metrics('tsi_decisions_total{experiment="e"} 2\\nother 1\\n')
    {'tsi_decisions_total': {(('experiment', 'e'),): 2.0}}
    """
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("tsi_"):
                labels = tuple(sorted(sample.labels.items()))
                out.setdefault(sample.name, {})[labels] = float(sample.value)
    return out


def combine(scrapes: Iterable[Samples]) -> Samples:
    """The samples of a cluster's processes: counters and sums added, q readings the
    highest (an instance lives in one process).

    >>> one = {"tsi_decisions_total": {(("experiment", "e"),): 2.0}}
    >>> combine([one, one])
    {'tsi_decisions_total': {(('experiment', 'e'),): 4.0}}
    """
    out: Samples = {}
    for samples in scrapes:
        for name, values in samples.items():
            into = out.setdefault(name, {})
            for labels, value in values.items():
                if labels not in into:
                    into[labels] = value
                elif name in _READINGS:
                    into[labels] = max(into[labels], value)
                else:
                    into[labels] += value
    return out


@dataclass(frozen=True)
class Endpoint:
    """One metrics endpoint as last sampled: up, or down and why."""

    url: str
    up: bool
    error: str = ""


@dataclass(frozen=True)
class Sample:
    """One sampling of every endpoint at ``at`` (Unix s): their samples summed."""

    at: float
    endpoints: tuple[Endpoint, ...]
    samples: Samples

    @classmethod
    def of(cls, at: float, texts: Iterable[tuple[str, str | Exception]]) -> Sample:
        """The sample of each endpoint's (url, text, or the error fetching it)."""
        endpoints, scrapes = [], []
        for url, text in texts:
            if isinstance(text, Exception):
                endpoints.append(Endpoint(url, False, _reason(text)))
                continue
            try:
                scrapes.append(parse_metrics(text))
            except ValueError as exc:
                endpoints.append(Endpoint(url, False, f"not Prometheus text: {_reason(exc)}"))
                continue
            endpoints.append(Endpoint(url, True))
        return cls(at, tuple(endpoints), combine(scrapes))


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:200]


@dataclass(frozen=True)
class Point:
    """What the history keeps of a sample: the selections and the q by (experiment, arm)."""

    at: float
    selections: dict[tuple[str, ...], float]
    q: dict[tuple[str, ...], float]


class History:
    """The latest sample, and a point of each sample of the last ``keep`` seconds, one
    every ``every`` seconds (a bounded ring)."""

    def __init__(self, every: float, keep: float = KEEP) -> None:
        if not every > 0 or not keep >= every:
            raise ValueError(f"every must be > 0 and keep >= every, got {every!r}, {keep!r}")
        self.every = every
        self.latest: Sample | None = None
        self.points: deque[Point] = deque(maxlen=math.ceil(keep / every) + 1)

    def add(self, sample: Sample) -> None:
        self.latest = sample
        by_arm = ("experiment", "arm")
        self.points.append(Point(
            sample.at,
            _by(sample.samples, "tsi_arm_selections_total", *by_arm),
            _by(sample.samples, "tsi_arm_share", *by_arm),
        ))  # fmt: skip

    def base(self, span: float) -> Point | None:
        """The newest point at least ``span`` s older than the latest, else the oldest."""
        if not self.points:
            return None
        last = self.points[-1].at
        for point in reversed(self.points):
            if last - point.at >= span:
                return point
        return self.points[0]

    def q_history(self) -> dict[str, dict[str, list[tuple[float, float]]]]:
        """Each shared instance's q over the kept points: experiment -> arm -> (Unix s, q)."""
        out: dict[str, dict[str, list[tuple[float, float]]]] = {}
        for point in self.points:
            for (experiment, arm), q in point.q.items():
                out.setdefault(experiment, {}).setdefault(arm, []).append((point.at, q))
        return out


def _by(samples: Samples, name: str, *keys: str) -> dict[tuple[str, ...], float]:
    """The values of metric ``name`` by the values of labels ``keys``."""
    out: dict[tuple[str, ...], float] = {}
    for labels, value in samples.get(name, {}).items():
        found = dict(labels)
        at = tuple(found.get(key, "") for key in keys)
        out[at] = out.get(at, 0.0) + value
    return out


def _ratio(part: float, whole: float) -> float | None:
    return part / whole if whole > 0 else None


def _outcome(loss: float, squares: float, n: float) -> tuple[float | None, float | None]:
    """(mean, half-width of its normal interval at ``Z95``) of n losses from their sums."""
    if n <= 0:
        return None, None
    mean = loss / n
    return mean, Z95 * math.sqrt(max(squares / n - mean * mean, 0.0) / n)


def summary(history: History) -> dict[str, Any]:
    """What the page shows, as JSON-ready data (``GET /experiments.json``)."""
    latest, base = history.latest, history.base(RECENT)
    if latest is None or base is None:
        return {"sampled_at": None, "every": history.every, "recent_seconds": 0.0,
                "endpoints": [], "experiments": [], "dead_letters": {}}  # fmt: skip
    if base is history.points[-1]:  # one sample: recent is since the start
        base = Point(base.at, {}, {})
    now = latest.samples
    names = sorted(
        {e for e, _ in _by(now, "tsi_arm_selections_total", "experiment", "arm")}
        | {e for (e,) in _by(now, "tsi_decisions_total", "experiment")}
    )
    q_history = history.q_history()
    dead = _by(now, "tsi_dead_letters_total", "reason")
    return {
        "sampled_at": latest.at,
        "every": history.every,
        "recent_seconds": latest.at - base.at,
        "endpoints": [e.__dict__ for e in latest.endpoints],
        "experiments": [_experiment(name, now, base, q_history.get(name, {})) for name in names],
        "dead_letters": {reason: n for (reason,), n in sorted(dead.items())},
    }


def _experiment(
    name: str, now: Samples, base: Point, q_history: dict[str, list[tuple[float, float]]]
) -> dict[str, Any]:
    def of(metric: str) -> dict[str, float]:
        found = _by(now, metric, "experiment", "arm")
        return {arm: v for (e, arm), v in found.items() if e == name}

    def one(metric: str) -> float:
        return _by(now, metric, "experiment").get((name,), 0.0)

    selections, share = of("tsi_arm_selections_total"), of("tsi_arm_share")
    served = of("tsi_arm_served_share")
    recent = {}
    for arm, n in selections.items():
        before = base.selections.get((name, arm), 0.0)
        recent[arm] = n - before if n >= before else n  # a restart counts again from 0
    fed, defaulted = of("tsi_arm_feedback_total"), of("tsi_arm_defaulted_total")
    loss, squares = of("tsi_arm_loss_sum"), of("tsi_arm_loss_squares_sum")
    ips = of("tsi_arm_ips_loss_sum")
    decisions, retries = one("tsi_decisions_total"), one("tsi_retries_total")
    total, total_recent = sum(selections.values()), sum(recent.values())
    rows = []
    for arm in sorted(set(selections) | set(share) | set(fed) | set(defaulted)):
        n = fed.get(arm, 0.0) + defaulted.get(arm, 0.0)
        mean, half = _outcome(loss.get(arm, 0.0), squares.get(arm, 0.0), n)
        rows.append({
            "arm": arm,
            "selections": selections.get(arm, 0.0),
            "share": _ratio(selections.get(arm, 0.0), total),
            "recent_share": _ratio(recent.get(arm, 0.0), total_recent),
            "feedback": fed.get(arm, 0.0),
            "defaulted": defaulted.get(arm, 0.0),
            "mean_loss": mean,
            "interval": half,
            "ips_loss": _ratio(ips.get(arm, 0.0), decisions - retries),
            "q": share.get(arm),
            "served": served.get(arm),
        })  # fmt: skip
    contexts: dict[str, dict[str, float]] = {}
    by_context = _by(now, "tsi_arm_context_share", "experiment", "context", "arm")
    for (e, context, arm), q in sorted(by_context.items()):
        if e == name:
            contexts.setdefault(context, {})[arm] = q
    outcomes = _by(now, "tsi_feedback_total", "experiment", "outcome")
    given = _by(now, "tsi_feedback_given_total", "experiment", "field")
    rewards = given.get((name, "reward"), 0.0) > given.get((name, "loss"), 0.0)
    return {
        "experiment": name,
        "decisions": decisions,
        "retries": retries,
        "pending": one("tsi_pending_tickets"),
        "arms": rows,
        "q_history": q_history,
        "context_q": contexts,
        "feedback": {o: n for (e, o), n in sorted(outcomes.items()) if e == name},
        "rewards": rewards,
    }
