"""What a report is made of: the served stream (``ServedLog``), what was injected into it
on purpose (``Injected``), and the figures computed from them (``summarise``,
``best_arm_hits``, ``why_best_arm_varies``). No text, no plots: ``report_text`` and
``report_plots`` turn these into words and pictures.

>>> sel = [{"experiment": "e", "unit": None, "request_id": "r1", "arm": 0, "arm_name": "a"}]
>>> stream = ServedLog(sel, [], [], request_ts={("e", None, "r1"): 0.0})
>>> stream.experiments(), stream.arm_names("e")
(['e'], ['a'])
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from flows.service.wire.events import DeadLetter, Feedback, Request, parse_event
from flows.tools.context_label import context_label

Key = tuple[str, str | None, str]  # experiment, unit, request_id


def _key(event: dict[str, Any]) -> Key:
    return (event["experiment"], event.get("unit"), event["request_id"])


@dataclass
class ServedLog:
    """What went through the service, as JSON objects."""

    selections: list[dict[str, Any]]
    feedback: list[dict[str, Any]]  # as sent (with ``ts``, and ``loss`` or ``reward``)
    dead_letters: list[dict[str, Any]]
    request_ts: dict[Key, float] = field(default_factory=dict)
    truth: dict[str, np.ndarray] | None = None  # request_id -> expected loss of every arm
    # of the requests that had one: its index, or its named values (``context_label``)
    contexts: dict[Key, int | str] = field(default_factory=dict)
    _served: dict[tuple[str, int, int], list[dict[str, Any]]] = field(
        default_factory=dict, repr=False, compare=False
    )

    def experiments(self) -> list[str]:
        return sorted({s["experiment"] for s in self.selections})

    def served(self, experiment: str) -> list[dict[str, Any]]:
        """Selections of one experiment in request-time order (first answer per request)."""
        cache = (experiment, len(self.selections), len(self.request_ts))
        if cache not in self._served:
            seen, out = set(), []
            for s in self.selections:
                k = _key(s)
                if s["experiment"] == experiment and k not in seen:
                    seen.add(k)
                    out.append(s)
            self._served[cache] = sorted(out, key=lambda s: self.request_ts.get(_key(s), 0.0))
        return self._served[cache]

    def arm_names(self, experiment: str) -> list[str]:
        """Names of arms 0..K-1 as the selections give them (K: the largest arm seen + 1)."""
        names = {s["arm"]: s["arm_name"] for s in self.selections if s["experiment"] == experiment}
        return [names.get(a, str(a)) for a in range(max(names, default=-1) + 1)]

    def units(self, experiment: str) -> list[str]:
        """The units (users) of a per-unit experiment, sorted; empty for a shared one."""
        return sorted({s["unit"] for s in self.served(experiment) if s.get("unit") is not None})

    def delays(self, experiment: str) -> np.ndarray:
        """Seconds from request to feedback, for feedback that names a known request."""
        out = []
        for f in self.feedback:
            t0 = self.request_ts.get(_key(f))
            if f["experiment"] == experiment and t0 is not None and "ts" in f:
                out.append(f["ts"] - t0)
        return np.array(out)

    def observed_losses(self, experiment: str) -> dict[Key, float]:
        """Loss of each request that got feedback (first delivery; reward = -loss)."""
        return {k: loss_of(f) for k, f in self.first_feedback(experiment).items()}

    def first_feedback(self, experiment: str) -> dict[Key, dict[str, Any]]:
        """The first feedback delivered for each request of ``experiment``, as sent."""
        out: dict[Key, dict[str, Any]] = {}
        for f in self.feedback:
            if f["experiment"] == experiment:
                out.setdefault(_key(f), f)
        return out

    def end(self) -> float:
        """The time the stream reached: the latest ``ts`` of its requests and feedback."""
        times = [*self.request_ts.values(), *(f["ts"] for f in self.feedback if "ts" in f)]
        return max(times, default=-math.inf)


def loss_of(feedback: dict[str, Any]) -> Any:
    """A feedback's loss as the service reads it: ``loss``, or the negated ``reward``.

    >>> loss_of({"reward": 3.0}), loss_of({"loss": 0.5})
    (-3.0, 0.5)
    """
    reward = feedback.get("reward")
    return feedback.get("loss", -reward if reward is not None else None)


def log_events(
    messages: Iterable[tuple[bytes, Any]],
) -> tuple[dict[Key, float], list[dict[str, Any]]]:
    """(request times, feedback sent) of a served log of (raw bytes, origin) messages with
    ``"type"`` fields: what the service's parser accepts (any finite ``ts``), the feedback
    as it was sent. A line the service refuses is its dead letter, not an event here."""
    request_ts: dict[Key, float] = {}
    feedback: list[dict[str, Any]] = []
    for event in _events(messages):
        if isinstance(event, Feedback):
            feedback.append(orjson.loads(event.raw))
        elif event.ts is not None:
            request_ts[(event.experiment, event.unit, event.request_id)] = event.ts
    return request_ts, feedback


def request_contexts(messages: Iterable[tuple[bytes, Any]]) -> dict[Key, int | str]:
    """The context of every request of a log that names one (for ``ServedLog.contexts``),
    as its ``context_label``.

    >>> from flows.service.wire.events import Origin
    >>> raw = b'{"type":"request","experiment":"p","request_id":"r","context":2}'
    >>> request_contexts([(raw, Origin("f"))])
    {('p', None, 'r'): 2}
    """
    return {
        (e.experiment, e.unit, e.request_id): context_label(e.context)
        for e in _events(messages)
        if isinstance(e, Request) and e.context is not None
    }


def _events(messages: Iterable[tuple[bytes, Any]]) -> Iterator[Request | Feedback]:
    """The requests and feedback of a combined log, through the service's own parser."""
    for raw, origin in messages:
        event = parse_event(raw, origin, ts_window=math.inf)
        if not isinstance(event, DeadLetter):
            yield event


@dataclass(frozen=True)
class Fault:
    """A fault put into a stream on purpose, as its generator counted it.

    ``reasons``: the dead-letter reasons each occurrence should end as (a feedback that
    comes after its ticket expired gives a ``ticket_expired`` and a ``late_feedback``).
    """

    what: str
    count: int
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class Injected:
    """What a traffic generator put into the stream: its faults, and per experiment the
    feedback it meant to send (mean delay in seconds, share of requests never answered)."""

    faults: tuple[Fault, ...] = ()
    feedback: dict[str, tuple[float, float]] = field(default_factory=dict)

    def expected(self, reason: str) -> int:
        """Dead letters with ``reason`` the faults should give."""
        return sum(f.count for f in self.faults if reason in f.reasons)


def dead_letter_counts(stream: ServedLog) -> list[tuple[str, int]]:
    """(reason, count) of the dead letters, most frequent first, ties by name."""
    counts = Counter(d["reason"] for d in stream.dead_letters)
    return sorted(counts.items(), key=lambda rc: (-rc[1], rc[0]))


def truth_of(stream: ServedLog, experiment: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(expected loss of every arm, arm served) per served request, in time order."""
    served = stream.served(experiment)
    if stream.truth is None or not served:
        return None
    mu = np.array([stream.truth[s["request_id"]] for s in served], dtype=float)
    return mu, np.array([s["arm"] for s in served])


@dataclass(frozen=True)
class Summary:
    experiment: str
    requests: int
    with_feedback: int
    regret_vs_best_arm_each_time: float | None
    regret_vs_best_fixed_arm: float | None
    uniform_regret_vs_best_arm_each_time: float | None
    best_share_last_fifth: float | None
    mean_observed_loss: float | None
    feedback_all_equal: bool = False  # every observed loss the same value (two or more)


def summarise(stream: ServedLog, experiment: str) -> Summary:
    """The figures of one experiment's row of the report's summary table."""
    served = stream.served(experiment)
    observed = stream.observed_losses(experiment)
    losses = [v for v in observed.values() if v is not None]
    dynamic = fixed = uniform = share = None
    truth = truth_of(stream, experiment)
    if truth is not None:
        mu, arms = truth
        got = mu[np.arange(len(arms)), arms]
        dynamic = float((got - mu.min(axis=1)).sum())
        fixed = float((got - mu[:, int(np.argmin(mu.sum(axis=0)))]).sum())  # 0 when equal
        uniform = float((mu.mean(axis=1) - mu.min(axis=1)).sum())
        tail = slice(len(arms) * 4 // 5, None)
        share = float((got[tail] == mu[tail].min(axis=1)).mean())
    return Summary(
        experiment,
        len(served),
        sum(1 for s in served if _key(s) in observed),
        dynamic,
        fixed,
        uniform,
        share,
        float(np.mean(losses)) if losses else None,
        len(losses) > 1 and len(set(losses)) == 1,
    )


def best_arm_hits(stream: ServedLog, experiment: str, min_feedback: int = 3) -> np.ndarray:
    """Per served request (time order): 1.0 if it went to the best arm for that request,
    0.0 if not, NaN when unknown.

    With the truth, the best arm is the one of lowest expected loss for that request (a
    user's favourite, a context's best). Without it, for a per-unit experiment: the arm of
    lowest mean observed loss for that unit over the whole log, among the arms with at
    least ``min_feedback`` observed losses (an estimate); otherwise unknown.
    """
    truth = truth_of(stream, experiment)
    if truth is not None:
        mu, arms = truth
        return (mu[np.arange(len(arms)), arms] == mu.min(axis=1)).astype(float)
    served = stream.served(experiment)
    observed = stream.observed_losses(experiment)
    sums: dict[str | None, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for s in served:
        loss = observed.get(_key(s))
        if loss is not None:
            sums[s.get("unit")][s["arm"]].append(loss)
    best = {}
    for unit, by_arm in sums.items():
        means = {a: float(np.mean(v)) for a, v in by_arm.items() if len(v) >= min_feedback}
        if means:
            best[unit] = min(sorted(means), key=means.__getitem__)
    return np.array(
        [
            float(s["arm"] == best[s.get("unit")]) if s.get("unit") in best else np.nan
            for s in served
        ]
    )


def why_best_arm_varies(stream: ServedLog, experiment: str) -> str | None:
    """Why no single arm is the best for every request, from the truth (None: it is, or
    the truth is not known).

    Users first (a per-unit experiment), then contexts (when the requests' contexts are
    known), then time (where the best arm changes, as fractions of the stream).
    """
    truth = truth_of(stream, experiment)
    if truth is None:
        return None
    mu, _ = truth
    best = mu.argmin(axis=1)
    if len(set(best.tolist())) < 2:
        return None
    served = stream.served(experiment)
    names = stream.arm_names(experiment)
    by = "user" if any(s.get("unit") is not None for s in served) else None
    groups = [s.get("unit") for s in served]
    if by is None and stream.contexts:
        by, groups = "context", [stream.contexts.get(_key(s)) for s in served]
    if by is not None:
        own: dict[Any, Counter[int]] = defaultdict(Counter)
        for group, b in zip(groups, best.tolist(), strict=True):
            own[group][b] += 1
        favourites = sorted({names[c.most_common(1)[0][0]] for c in own.values()})
        if len(favourites) > 1:
            shown = ", ".join(f"`{n}`" for n in favourites)
            return (
                f"the {by}s have different best arms ({shown} are each the best for some of "
                f"the {len(own):,} {by}s)"
            )
    changes = np.flatnonzero(best[1:] != best[:-1]) + 1
    at = ", ".join(f"{c / len(best):.0%}" for c in changes[:5]) + (
        ", ..." if len(changes) > 5 else ""
    )
    times = "once" if len(changes) == 1 else f"{len(changes)} times"
    return f"the best arm changes {times} during the stream (at {at} of its requests)"


def windowed(values: np.ndarray, windows: int) -> tuple[np.ndarray, np.ndarray]:
    """(window centres as fractions of the stream, mean of each window, NaN ignored).

    >>> windowed(np.array([1.0, 0.0, 1.0, 1.0]), 2)
    (array([0.25, 0.75]), array([0.5, 1. ]))
    """
    n = max(1, min(windows, len(values)))
    chunks = np.array_split(np.asarray(values, dtype=float), n)
    means = np.array([np.nanmean(c) if np.isfinite(c).any() else np.nan for c in chunks])
    sizes = np.array([len(c) for c in chunks])
    ends = np.cumsum(sizes)
    return (ends - sizes / 2) / max(len(values), 1), means
