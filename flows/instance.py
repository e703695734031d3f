"""One bandit instance's event handling: pure logic, no I/O, the clock passed in.

Requests draw an arm with u hashed from (seed, instance, request_id), so a retried or
replayed request gets the same answer. A selection waits as an open ticket until its
feedback arrives or its time to live passes. Feedback that arrives before its request
waits in a bounded buffer. Whatever is not applied comes back as a ``DeadLetter`` with
its reason: nothing is dropped silently, and a refused event changes no state.

>>> from flows.registry import Registry
>>> from flows.events import Origin, parse_request, parse_feedback
>>> exp = Registry.from_toml('[experiments.home]\\narms = ["a", "b"]')["home"]
>>> inst = Instance(exp, "home")
>>> [sel] = inst.on_request(parse_request(b'{"experiment":"home","request_id":"r1"}',
...                                       Origin("t")), now=0.0)
>>> inst.on_feedback(parse_feedback(b'{"experiment":"home","request_id":"r1","loss":2}',
...                                 Origin("t")), now=1.0)
[]
>>> inst.bandit.n_updates
1
"""

from __future__ import annotations

import hashlib
import heapq
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from flows.events import DeadLetter, Feedback, Origin, Request, Selection
from flows.registry import Experiment
from tsi_core import Bandit, Ticket

Output = Selection | DeadLetter


def uniform_draw(seed: int, instance: str, request_id: str) -> float:
    """u in [0, 1) from a stable hash (never the salted built-in ``hash``).

    >>> uniform_draw(1, "home", "r1") == uniform_draw(1, "home", "r1")
    True
    """
    digest = hashlib.blake2b(
        f"{seed}\x00{instance}\x00{request_id}".encode(), digest_size=8
    ).digest()
    return (int.from_bytes(digest, "big") >> 11) / float(1 << 53)


@dataclass(slots=True)
class Open:
    """A served selection waiting for its feedback."""

    ticket: Ticket
    unit: str | None  # echoed in the answer (the rest of it is rebuilt from the ticket)
    deadline: float
    request: bytes
    origin: Origin


@dataclass(slots=True)
class Early:
    """Feedback that arrived before its request."""

    feedback: Feedback
    deadline: float


_NONE: Any = MappingProxyType({})  # shared read-only stand-in for an empty table
_NO_DEADLINES: Any = ()


class Instance:
    """State and event handling of one instance (an experiment, or experiment + unit).

    Idle instances are the common case with one bandit per user, so empty tables are a
    shared read-only stand-in until something is stored, and go back to it when emptied.
    """

    __slots__ = ("_deadlines", "bandit", "early", "experiment", "key", "open", "settled")

    def __init__(self, experiment: Experiment, key: str, bandit: Bandit | None = None) -> None:
        self.experiment = experiment
        self.key = key
        self.bandit = bandit if bandit is not None else experiment.new_bandit(key)
        self.open: dict[str, Open] = _NONE
        # rid -> (ticket, unit, forget at): enough to answer a retried request identically
        self.settled: dict[str, tuple[Ticket, str | None, float]] = _NONE
        self.early: dict[str, Early] = _NONE
        self._deadlines: list[tuple[float, str]] = _NO_DEADLINES  # heap; may hold stale entries

    def _remember(self, table: str, rid: str, value: Any, due: float) -> None:
        if getattr(self, table) is _NONE:
            setattr(self, table, {})
        getattr(self, table)[rid] = value
        if self._deadlines is _NO_DEADLINES:
            self._deadlines = []
        heapq.heappush(self._deadlines, (due, rid))

    def _forget(self, table: str, rid: str) -> None:
        entries = getattr(self, table)
        del entries[rid]
        if not entries:
            setattr(self, table, _NONE)

    # ------------------------------------------------------------------ events
    def on_request(self, request: Request, now: float) -> list[Output]:
        rid = request.request_id
        served = self.open.get(rid)
        if served is not None:
            if served.ticket.context != request.context:
                return [
                    self._dead(
                        request,
                        "context_mismatch",
                        f"request_id {rid!r} was served with context "
                        f"{served.ticket.context!r}, now asks {request.context!r}",
                    )
                ]
            return [self._answer(rid, served.ticket, served.unit)]  # a retry: the same answer
        done = self.settled.get(rid)
        if done is not None:
            return [self._answer(rid, done[0], done[1])]
        refused = self._check_context(request)
        if refused is not None:
            return [refused]
        u = uniform_draw(self.experiment.seed, self.key, rid)
        ticket = self.bandit.select(context=request.context, u=u)
        deadline = now + self.experiment.feedback_ttl
        served = Open(ticket, request.unit, deadline, request.raw, request.origin)
        self._remember("open", rid, served, deadline)
        out: list[Output] = [self._answer(rid, ticket, request.unit)]
        waiting = self.early.get(rid)
        if waiting is not None:
            self._forget("early", rid)
            out += self.on_feedback(waiting.feedback, now)
        return out

    def _check_context(self, request: Request) -> DeadLetter | None:
        n_contexts, context = self.experiment.n_contexts, request.context
        if n_contexts == 1 and context is not None:
            return self._dead(
                request,
                "context_out_of_range",
                f"experiment {self.experiment.name!r} takes no context",
            )
        if n_contexts > 1 and context is None:
            return self._dead(
                request, "missing_field", f"experiment {self.experiment.name!r} needs a context"
            )
        if n_contexts > 1 and context >= n_contexts:
            return self._dead(
                request,
                "context_out_of_range",
                f"context {context} is not in [0, {n_contexts - 1}]",
            )
        return None

    def on_feedback(self, feedback: Feedback, now: float) -> list[Output]:
        rid = feedback.request_id
        served = self.open.get(rid)
        if served is None:
            if rid in self.settled:
                return [
                    self._dead(
                        feedback,
                        "duplicate_feedback",
                        f"request_id {rid!r} already has its feedback",
                    )
                ]
            if rid in self.early:
                return [
                    self._dead(
                        feedback,
                        "duplicate_feedback",
                        f"feedback for request_id {rid!r} is already waiting",
                    )
                ]
            if len(self.early) >= self.experiment.early_feedback_limit:
                return [
                    self._dead(
                        feedback,
                        "early_buffer_full",
                        f"{len(self.early)} feedback events already wait for their requests",
                    )
                ]
            deadline = now + self.experiment.feedback_ttl
            self._remember("early", rid, Early(feedback, deadline), deadline)
            return []
        if feedback.arm is not None and feedback.arm != served.ticket.arm:
            return [
                self._dead(
                    feedback,
                    "arm_mismatch",
                    f"request_id {rid!r} was served arm {served.ticket.arm}, "
                    f"feedback names arm {feedback.arm}",
                )
            ]
        self.bandit.update(served.ticket, feedback.loss)
        self._forget("open", rid)
        forget = now + self.experiment.feedback_ttl
        self._remember("settled", rid, (served.ticket, served.unit, forget), forget)
        return []

    def expire(self, now: float) -> list[Output]:
        """Close what has waited too long: tickets without feedback, feedback without request."""
        out: list[Output] = []
        while self._deadlines and self._deadlines[0][0] <= now:
            due, rid = heapq.heappop(self._deadlines)
            served = self.open.get(rid)
            if served is not None and served.deadline == due:
                self.bandit.discard(served.ticket)
                self._forget("open", rid)
                out.append(
                    DeadLetter(
                        "ticket_expired",
                        f"no feedback for request_id {rid!r} within "
                        f"{self.experiment.feedback_ttl:g} s",
                        served.request,
                        served.origin,
                        self.key,
                    )
                )
            waiting = self.early.get(rid)
            if waiting is not None and waiting.deadline == due:
                self._forget("early", rid)
                out.append(
                    self._dead(
                        waiting.feedback,
                        "unknown_ticket",
                        f"no request {rid!r} arrived within "
                        f"{self.experiment.feedback_ttl:g} s of its feedback",
                    )
                )
            done = self.settled.get(rid)
            if done is not None and done[2] == due:
                self._forget("settled", rid)
        if not self._deadlines:
            self._deadlines = _NO_DEADLINES  # an idle instance keeps no list
        return out

    def next_deadline(self) -> float | None:
        return self._deadlines[0][0] if self._deadlines else None

    def _answer(self, rid: str, ticket: Ticket, unit: str | None) -> Selection:
        """The selection a ticket stands for (built when emitted, not stored)."""
        return Selection(
            self.experiment.name,
            unit,
            rid,
            self.key,
            ticket.arm,
            self.experiment.arms[ticket.arm],
            ticket.prob,
            ticket.round,
        )

    def _dead(self, event: Request | Feedback, reason: str, detail: str) -> DeadLetter:
        return DeadLetter(reason, detail, event.raw, event.origin, self.key)

    # ------------------------------------------------------------- snapshots
    def to_dict(self) -> dict[str, Any]:
        """JSON-able state (the bandit's own snapshot plus tickets and buffers)."""
        return {
            "experiment": self.experiment.name,
            "key": self.key,
            "bandit": self.bandit.to_dict(),
            "open": [_open_to_dict(rid, o) for rid, o in self.open.items()],
            "settled": [
                [rid, t.to_dict(), unit, forget] for rid, (t, unit, forget) in self.settled.items()
            ],
            "early": [
                [rid, _feedback_to_dict(e.feedback), e.deadline] for rid, e in self.early.items()
            ],
        }

    @classmethod
    def from_dict(cls, experiment: Experiment, data: dict[str, Any]) -> Instance:
        inst = cls.__new__(cls)
        inst.restore(experiment, data)
        return inst

    def restore(self, experiment: Experiment, data: dict[str, Any]) -> None:
        """Become the instance ``data`` (from ``to_dict``) describes."""
        Instance.__init__(self, experiment, data["key"], Bandit.from_dict(data["bandit"]))
        for item in data["open"]:
            served = Open(
                Ticket.from_dict(item["ticket"]),
                item["unit"],
                item["deadline"],
                bytes.fromhex(item["request"]),
                Origin(*item["origin"]),
            )
            self._remember("open", item["request_id"], served, item["deadline"])
        for rid, ticket, unit, forget in data["settled"]:
            self._remember("settled", rid, (Ticket.from_dict(ticket), unit, forget), forget)
        for rid, feedback, deadline in data["early"]:
            self._remember("early", rid, Early(_feedback_from_dict(feedback), deadline), deadline)


def _open_to_dict(rid: str, o: Open) -> dict[str, Any]:
    return {
        "request_id": rid,
        "ticket": o.ticket.to_dict(),
        "unit": o.unit,
        "deadline": o.deadline,
        "request": o.request.hex(),
        "origin": [o.origin.source, o.origin.partition, o.origin.offset],
    }


def _feedback_to_dict(f: Feedback) -> dict[str, Any]:
    return {
        "experiment": f.experiment,
        "unit": f.unit,
        "request_id": f.request_id,
        "loss": f.loss,
        "arm": f.arm,
        "ts": f.ts,
        "raw": f.raw.hex(),
        "origin": [f.origin.source, f.origin.partition, f.origin.offset],
    }


def _feedback_from_dict(d: dict[str, Any]) -> Feedback:
    return Feedback(
        d["experiment"],
        d["unit"],
        d["request_id"],
        d["loss"],
        d["arm"],
        d["ts"],
        bytes.fromhex(d["raw"]),
        Origin(*d["origin"]),
    )
