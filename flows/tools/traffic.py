"""Realistic synthetic traffic for ``tsi demo``, with the ground truth kept for the report.

Three experiments share one stream of events (the service's combined ``events`` format):

* ``checkout`` — one shared bandit, 3 arms, reward in dollars (a purchase of 20-80 $ or
  nothing); the best arm changes 60% of the way through, so it competes with switching
  sequences.
* ``homepage`` — one bandit per user (per-unit), 4 arms, loss = seconds to the first click;
  each user has a favourite layout, which is why every user gets a bandit of their own.
* ``push`` — one shared contextual bandit, 3 arms, 3 contexts (morning, afternoon,
  evening) with a different best arm in each; loss 1 when the notification is ignored.

Feedback comes after an exponential delay; some never comes (the ticket expires); a few
messages are broken on purpose (bad JSON, unknown experiment, a duplicate feedback, a
NaN reward) so the dead-letter path shows up in the report.

>>> demo = generate(n_requests=200, seed=1)
>>> sum(1 for e in demo.events if b'"request"' in e) >= 200
True
>>> first = orjson.loads(demo.events[0])
>>> len(demo.respond({"request_id": first["request_id"], "arm": 0})) <= 2
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import orjson

START_TS = 1_767_225_600.0  # 2026-01-01 00:00 UTC


@dataclass(frozen=True)
class Scenario:
    """One experiment of the demo: how its requests arrive and what each arm costs."""

    name: str
    arms: tuple[str, ...]
    registry: str  # the experiment's TOML table body
    share: float  # fraction of the requests
    delay_mean: float  # seconds between a selection and its feedback
    missing: float  # fraction of requests that never get feedback
    n_contexts: int = 1
    units: int = 0  # > 0: per-unit, requests spread over this many users

    def expected_losses(self, progress: float, context: int, user: int = 0) -> np.ndarray:
        """Mean loss of every arm at ``progress`` in [0, 1] of the stream."""
        if self.name == "checkout":  # loss = -revenue; E[revenue] = p(buy)·50 $
            p_buy = [0.08, 0.20, 0.06] if progress < 0.6 else [0.08, 0.05, 0.22]
            return -50.0 * np.array(p_buy)
        if self.name == "homepage":  # seconds to the first click; each user has a favourite
            seconds = np.array([6.5, 6.0, 7.0, 6.2])
            seconds[user % len(seconds)] = 3.5
            return seconds
        best = (0, 2, 1)[context]  # push: each part of the day has its own best message
        means = np.full(3, 0.9)
        means[best] = 0.7
        return means

    def draw_loss(self, means: np.ndarray, arm: int, rng: np.random.Generator) -> float:
        if self.name == "checkout":
            return -float(rng.uniform(20.0, 80.0)) if rng.random() < -means[arm] / 50.0 else 0.0
        if self.name == "homepage":
            return float(means[arm] * rng.gamma(4.0, 0.25))
        return float(rng.random() < means[arm])


SCENARIOS = (
    Scenario(
        "checkout",
        ("control", "green", "blue"),
        'competition = { kind = "switching", rate = 0.001 }\nfeedback_ttl = 1800',
        share=0.5,
        delay_mean=120.0,
        missing=0.05,
    ),
    Scenario(
        "homepage",
        ("hero", "grid", "list", "carousel"),
        "per_unit = true\nfeedback_ttl = 600",
        share=0.3,
        delay_mean=8.0,
        missing=0.10,
        units=40,
    ),
    Scenario(
        "push",
        ("short", "emoji", "question"),
        'competition = { kind = "contextual", n_contexts = 3 }\nfeedback_ttl = 3600',
        share=0.2,
        delay_mean=900.0,
        missing=0.02,
        n_contexts=3,
    ),
)


def registry_toml(scenarios: tuple[Scenario, ...] = SCENARIOS, seed: int = 0) -> str:
    """The experiments registry the demo runs with (written next to the report)."""
    parts = []
    for s in scenarios:
        arms = ", ".join(f'"{a}"' for a in s.arms)
        parts.append(f"[experiments.{s.name}]\narms = [{arms}]\n{s.registry}\nseed = {seed}\n")
    return "\n".join(parts)


@dataclass
class Demo:
    """The generated requests and what the report needs to judge the service's answers."""

    events: list[bytes]  # requests and broken messages, in time order
    truth: dict[str, tuple[str, float, np.ndarray]] = field(default_factory=dict)
    # request_id -> (experiment, ts, expected loss of every arm)
    span: float = 0.0
    seed: int = 0
    scenarios: tuple[Scenario, ...] = SCENARIOS

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed + 1)
        self._by_name = {s.name: s for s in self.scenarios}
        self._answered = 0

    def respond(self, selection: dict) -> list[bytes]:
        """The feedback for a served selection: none (lost), one, or now and then two
        (a duplicate delivery), each with its own delay."""
        experiment, ts, means = self.truth[selection["request_id"]]
        s = self._by_name[experiment]
        self._answered += 1
        if self._rng.random() < s.missing:
            return []
        loss = s.draw_loss(means, selection["arm"], self._rng)
        message = {
            "type": "feedback",
            "experiment": experiment,
            "request_id": selection["request_id"],
            "ts": ts + float(self._rng.exponential(s.delay_mean)),
        }
        if selection.get("unit") is not None:
            message["unit"] = selection["unit"]
        if experiment == "checkout":
            message["reward"] = -loss  # revenue in dollars: the service negates it
        else:
            message["loss"] = loss
        raw = orjson.dumps(message)
        return [raw, raw] if self._answered % 2000 == 1000 else [raw]


def generate(
    n_requests: int = 20_000,
    seed: int = 0,
    hours: float = 6.0,
    scenarios: tuple[Scenario, ...] = SCENARIOS,
) -> Demo:
    """Requests at random times over ``hours`` (and a few broken messages); feedback is
    made by ``Demo.respond`` once the service has answered."""
    if isinstance(n_requests, bool) or not isinstance(n_requests, int) or n_requests < 1:
        raise ValueError(f"n_requests must be an integer >= 1, got {n_requests!r}")
    rng = np.random.default_rng(seed)
    span = hours * 3600.0
    times = np.sort(rng.uniform(0.0, span, n_requests))
    kinds = rng.choice(len(scenarios), size=n_requests, p=[s.share for s in scenarios])
    demo = Demo(events=[], span=span, seed=seed, scenarios=scenarios)
    for i, (t, k) in enumerate(zip(times, kinds, strict=True)):
        s = scenarios[k]
        rid = f"{s.name[0]}{i:06d}"
        ts = START_TS + float(t)
        context = int(t / span * 3) % 3 if s.n_contexts > 1 else None
        message = {"type": "request", "experiment": s.name, "request_id": rid, "ts": ts}
        user = int(rng.integers(s.units)) if s.units else 0
        if s.units:
            message["unit"] = f"user{user:04d}"
        if context is not None:
            message["context"] = context
        demo.events.append(orjson.dumps(message))
        demo.truth[rid] = (s.name, ts, s.expected_losses(t / span, context or 0, user))
    demo.events += _broken(rng, span)
    demo.events.sort(key=_ts)
    return demo


def _broken(rng: np.random.Generator, span: float) -> list[bytes]:
    """A handful of messages that must end as dead letters, spread over the stream."""
    at = [START_TS + float(x) for x in np.sort(rng.uniform(0.0, span, 4))]
    return [
        b'{"type": "request", "experiment": "checkout", "request_id": "x1", "ts": %r' % at[0],
        orjson.dumps({"type": "request", "experiment": "pricing", "request_id": "x2", "ts": at[1]}),
        b'{"type": "feedback", "experiment": "push", "request_id": "x3", "reward": NaN, "ts": %r}'
        % at[2],
        orjson.dumps(
            {"type": "request", "experiment": "homepage", "request_id": "x4", "ts": at[3]}
        ),
    ]


def _ts(raw: bytes) -> float:
    """The ``ts`` of a message, also of a broken one (for ordering only)."""
    try:
        return float(orjson.loads(raw)["ts"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        text = raw.decode("utf-8", "replace")
        digits = text.rsplit('"ts": ', 1)[-1].rstrip("}")
        return float(digits) if digits.replace(".", "", 1).isdigit() else math.inf
