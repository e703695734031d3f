"""Realistic synthetic traffic for ``tsi demo``, with the ground truth kept for the report.

Five experiments share one stream of events (the service's combined ``events`` format):

* ``checkout`` — one shared bandit, 3 arms, reward in dollars (a purchase of 20-80 $ or
  nothing); the best arm changes 60% of the way through, so it competes with switching
  sequences.
* ``homepage`` — one bandit per user (per-unit), 4 arms, loss = seconds to the first click;
  each user has a favourite layout, which is why every user gets a bandit of their own.
* ``push`` — one shared contextual bandit, 3 arms, 3 contexts (morning, afternoon,
  evening) with a different best arm in each; loss 1 when the notification is ignored.
* ``promo`` — one shared bandit, 3 banners, loss 1 when the banner is not clicked; a
  tenth of the requests are held out on ``control`` (``holdout``) to measure the bandit
  against, and every banner keeps a floor of the traffic (``min_share``).
* ``signup`` — one shared bandit, 4 sign-up flows; feedback comes only for a conversion
  (``{"loss": 0}``), and a window that ends without one counts as a loss of 1
  (``default_loss``): what an application that reports conversions only sends. A floor
  (``min_share``) keeps an early run of luck from locking it onto a worse flow.

The first three draw their requests and feedback from one generator; each experiment
after them (``own_stream``) from generators of its own, so adding one changes no other
experiment's traffic: a seed gives the first three the same stream it always gave.

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
import zlib
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
    means: tuple[float, ...] = ()  # fixed expected loss of every arm (losses 0 or 1)
    conversions: bool = False  # feedback only for a loss of 0 (a conversion), none for 1
    own_stream: bool = False  # requests and feedback from generators of its own

    def expected_losses(self, progress: float, context: int, user: int = 0) -> np.ndarray:
        """Mean loss of every arm at ``progress`` in [0, 1] of the stream."""
        if self.means:
            return np.array(self.means)
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
    Scenario(
        "promo",
        ("control", "seasonal", "discount"),
        'holdout = { arm = "control", share = 0.1 }\nmin_share = 0.02\nfeedback_ttl = 300',
        share=0.25,
        delay_mean=30.0,
        missing=0.02,
        means=(0.90, 0.94, 0.82),  # 1 − the click rate of each banner
        own_stream=True,
    ),
    Scenario(
        "signup",
        ("control", "one_step", "social", "long_form"),
        "default_loss = 1.0\nmin_share = 0.02\nfeedback_ttl = 600",
        share=0.25,
        delay_mean=60.0,
        missing=0.0,
        means=(0.94, 0.90, 0.84, 0.96),  # 1 − the conversion rate of each flow
        conversions=True,
        own_stream=True,
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
        self._own = {
            s.name: _own_rng(self.seed, s.name, "feedback") for s in self.scenarios if s.own_stream
        }
        self._answered = 0

    def respond(self, selection: dict) -> list[bytes]:
        """The feedback for a served selection: none (lost, or no conversion), one, or
        now and then two (a duplicate delivery, in the first three experiments), each
        with its own delay."""
        experiment, ts, means = self.truth[selection["request_id"]]
        s = self._by_name[experiment]
        rng = self._own[experiment] if s.own_stream else self._rng
        if not s.own_stream:
            self._answered += 1
        if rng.random() < s.missing:
            return []
        loss = s.draw_loss(means, selection["arm"], rng)
        if s.conversions and loss != 0.0:
            return []
        message = {
            "type": "feedback",
            "experiment": experiment,
            "request_id": selection["request_id"],
            "ts": ts + float(rng.exponential(s.delay_mean)),
        }
        if selection.get("unit") is not None:
            message["unit"] = selection["unit"]
        if experiment == "checkout":
            message["reward"] = -loss  # revenue in dollars: the service negates it
        else:
            message["loss"] = loss
        raw = orjson.dumps(message)
        twice = not s.own_stream and self._answered % 2000 == 1000
        return [raw, raw] if twice else [raw]


def generate(
    n_requests: int = 20_000,
    seed: int = 0,
    hours: float = 6.0,
    scenarios: tuple[Scenario, ...] = SCENARIOS,
) -> Demo:
    """Requests at random times over ``hours`` (and a few broken messages); feedback is
    made by ``Demo.respond`` once the service has answered.

    ``n_requests`` are shared by the experiments of one stream in proportion to their
    ``share``; an ``own_stream`` experiment adds ``share · n_requests`` requests of its own.
    """
    if isinstance(n_requests, bool) or not isinstance(n_requests, int) or n_requests < 1:
        raise ValueError(f"n_requests must be an integer >= 1, got {n_requests!r}")
    rng = np.random.default_rng(seed)
    span = hours * 3600.0
    demo = Demo(events=[], span=span, seed=seed, scenarios=scenarios)
    shared = [s for s in scenarios if not s.own_stream]
    if shared:
        times = np.sort(rng.uniform(0.0, span, n_requests))
        kinds = rng.choice(len(shared), size=n_requests, p=[s.share for s in shared])
        for i, (t, k) in enumerate(zip(times, kinds, strict=True)):
            _request(demo, shared[k], f"{shared[k].name[0]}{i:06d}", float(t), rng)
    for s in scenarios:
        if s.own_stream:
            own = _own_rng(seed, s.name, "requests")
            times = np.sort(own.uniform(0.0, span, round(s.share * n_requests)))
            for i, t in enumerate(times):
                _request(demo, s, f"{s.name}{i:06d}", float(t), own)
    demo.events += _broken(rng, span)
    demo.events.sort(key=_ts)
    return demo


def _request(demo: Demo, s: Scenario, rid: str, t: float, rng: np.random.Generator) -> None:
    """Add one request of ``s`` at ``t`` seconds into the stream, and its truth."""
    ts = START_TS + t
    context = int(t / demo.span * 3) % 3 if s.n_contexts > 1 else None
    message = {"type": "request", "experiment": s.name, "request_id": rid, "ts": ts}
    user = int(rng.integers(s.units)) if s.units else 0
    if s.units:
        message["unit"] = f"user{user:04d}"
    if context is not None:
        message["context"] = context
    demo.events.append(orjson.dumps(message))
    demo.truth[rid] = (s.name, ts, s.expected_losses(t / demo.span, context or 0, user))


def _own_rng(seed: int, name: str, purpose: str) -> np.random.Generator:
    """The generator of one experiment's requests or feedback, from the seed and its name
    only (not from its place among the experiments)."""
    return np.random.default_rng([seed, zlib.crc32(f"{name}/{purpose}".encode())])


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
