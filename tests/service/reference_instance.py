"""The test oracle of ``flows.service.instances.instance``: the same rules in plain Python.

The service's instance is compiled (``flows/service/instances/instance.pyx``); this is the Python
implementation it replaced, kept only for tests, which run random streams through both
and compare (``tests/service/test_event_loop.py``). It is never imported by the service.

One bandit instance's event handling: pure logic, no I/O, the clock passed in.

Requests draw an arm with u hashed from (seed, instance, request_id), so a retried or
replayed request gets the same answer. A selection waits as an open ticket until its
feedback arrives or its time to live passes. Feedback that arrives before its request
waits in a bounded buffer. Whatever is not applied comes back as a ``DeadLetter`` with
its reason: nothing is dropped silently, and a refused event changes no state.

>>> from flows.service.instances.registry import Registry
>>> from flows.service.wire.events import Origin, parse_request, parse_feedback
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

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from flows.service.instances import _draw
from flows.service.instances._answer_book import AnswerBook
from flows.service.instances._deadline_queue import TimeHeap
from flows.service.instances.registry import Experiment
from flows.service.instances.serving import request_context_problem
from flows.service.wire.events import DeadLetter, Feedback, Origin, Request, Selection
from flows.service.wire.keys import split_key
from tsi_core import Bandit, Ticket
from tsi_core.migrate import migrate

Output = Selection | DeadLetter


class Handled(list):
    """What an event produced (its outputs, in order) and what it changed, for whoever
    counts (the metrics): open tickets (``pending``) and waiting feedback (``early``) gained
    or lost, feedback ``applied``, and whether it was a ``retry`` of a served request.

    >>> done = Handled(pending=-1, applied=1)
    >>> list(done), done.applied
    ([], 1)
    """

    __slots__ = ("applied", "early", "pending", "retry")

    def __init__(
        self,
        outputs: list[Output] = (),  # type: ignore[assignment]
        pending: int = 0,
        early: int = 0,
        applied: int = 0,
        retry: bool = False,
    ) -> None:
        super().__init__(outputs)
        self.pending, self.early, self.applied, self.retry = pending, early, applied, retry


def uniform_draw(seed: int, instance: str, request_id: str) -> float:
    """u in [0, 1) from a stable hash (never the salted built-in ``hash``): the first 53
    bits of the 8-byte BLAKE2b of ``f"{seed}\\x00{instance}\\x00{request_id}"``, computed
    in C (``flows.service.instances._draw``; the same bits as the hashlib formula it documents).

    >>> uniform_draw(1, "home", "r1") == uniform_draw(1, "home", "r1")
    True
    """
    return _draw.uniform_draw(seed, instance, request_id)


@dataclass(slots=True)
class Open:
    """A served selection waiting for its feedback."""

    rid: str
    ticket: Ticket
    unit: str | None  # echoed in answers; None where the instance key implies it (per unit)
    deadline: float
    origin: Origin  # where the request came from, for the dead letter if it expires


@dataclass(slots=True)
class Settled:
    """A request whose feedback was applied, kept until ``deadline`` to answer retries."""

    rid: str
    ticket: Ticket
    unit: str | None
    deadline: float


@dataclass(slots=True)
class Expired:
    """A selection whose feedback never came, kept until ``deadline`` to answer retries
    (with the same answer) and to name late feedback (``late_feedback``)."""

    rid: str
    ticket: Ticket
    unit: str | None
    deadline: float


@dataclass(slots=True)
class Early:
    """Feedback that arrived before its request."""

    rid: str
    feedback: Feedback
    deadline: float


Entry = Open | Settled | Expired | Early


class Instance:
    """State and event handling of one instance (an experiment, or experiment + unit).

    Each request_id has at most one entry, which moves Early -> Open -> Settled (or
    Expired) -> gone: answers are kept ``retry_window`` seconds after the feedback (or the
    expiry) for retries.
    Idle instances are the common case with one bandit per user, so they are kept small:
    the bandit is packed into bytes while no ticket is pending, and the entries are held
    as nothing, one entry, or (from two on) a dict with a heap of deadlines. Answers kept
    for retries are held apart, in C rows (``_kept``, an ``AnswerBook`` of up to
    ``LIMIT``; beyond that as entries), and one is built into an entry only when
    something reads it (a retry, duplicate or late feedback): a user who comes back
    within the retry window (a request, its feedback) costs the same however many
    answers it has kept.
    """

    __slots__ = (
        "_bandit",
        "_deadlines",
        "_entries",
        "_kept",
        "_n_early",
        "_notices",
        "_packed",
        "experiment",
        "key",
    )

    def __init__(self, experiment: Experiment, key: str, bandit: Bandit | None = None) -> None:
        self.experiment = experiment
        self.key = key
        self._bandit = bandit  # None: packed, or not created yet while _packed is None too
        self._packed: bytes | None = None
        self._entries: Entry | dict[str, Entry] | None = None
        self._deadlines: TimeHeap | None = None  # (deadline, request_id), only beside a dict
        self._kept: AnswerBook | None = None  # kept answers (never an empty book)
        self._n_early = 0
        self._notices: list[Output] | None = None  # dead letters of a registry change

    # ------------------------------------------------------- registry changes
    def follow(self, experiment: Experiment, old_arms: tuple[str, ...] | None = None) -> None:
        """Become an instance of ``experiment`` (its definition changed in the registry),
        keeping what was learned: arms are matched by name (``Experiment.arm_map``) and the
        bandit migrated (``tsi_core.migrate``). Open tickets of a retired arm (or context)
        are closed with an ``arm_retired`` (``context_retired``) dead letter, which
        ``take_notices`` hands out; answers kept for retries of a retired arm are dropped.
        """
        old_arms = self.experiment.arms if old_arms is None else old_arms
        bandit = self.bandit  # unpacked with the definition it was packed with
        if experiment.same_state_as(old_arms, bandit):
            self.experiment = experiment
            return
        moved = migrate(
            bandit,
            experiment.arm_map(old_arms),
            competition=experiment.competition,
            gamma=experiment.template.gamma,
            variant=experiment.template.variant,
            new_arm_share=experiment.new_arm_share,
        )
        notices: list[Output] = []
        for entry in list(self.entries().values()):
            if type(entry) is Open:
                ticket = moved.tickets[entry.ticket.round]
                if ticket is None:
                    notices.append(self._retired(entry, moved.new_index_of_old, old_arms))
            elif type(entry) is Settled or type(entry) is Expired:
                ticket = moved.remap(entry.ticket)
            else:
                continue
            if ticket is None:
                self._drop(entry)
            else:
                entry.ticket = ticket
        self._bandit, self._packed, self.experiment = moved.bandit, None, experiment
        if notices:
            self._notices = (self._notices or []) + notices

    def take_notices(self) -> list[Output]:
        """Dead letters a registry change produced, once."""
        notices, self._notices = self._notices or [], None
        return notices

    def _retired(self, served: Open, kept: dict[int, int], old_arms: tuple[str, ...]) -> DeadLetter:
        arm = served.ticket.arm
        reason = "context_retired" if arm in kept else "arm_retired"
        what = f"context {served.ticket.context}" if arm in kept else f"arm {old_arms[arm]!r}"
        letter = self._expired(served)
        detail = f"{what} of request_id {served.rid!r} left the experiment's definition"
        return DeadLetter(reason, detail, letter.raw, served.origin, self.key)

    @property
    def bandit(self) -> Bandit:
        """The live bandit (created, or unpacked after it was put to rest, on first use)."""
        if self._bandit is None:
            if self._packed is None:
                self._bandit = self.experiment.new_bandit(self.key)
            else:
                held = self._entries  # packed only with at most one entry: see rest()
                pending = (held.ticket,) if type(held) is Open else ()
                self._bandit = self.experiment.unpack_bandit(self._packed, self.key, pending)
                self._packed = None
        return self._bandit

    def rest(self) -> None:
        """Pack the bandit (``Bandit.pack``, a few hundred bytes less than live), unless it
        has many pending tickets (a busy shared instance), which would have to be handed
        back at every unpack. The operator calls it when an epoch closes, for the keys the
        epoch touched: at most one pack and one unpack per instance and epoch."""
        if self._bandit is not None:
            blob = self._bandit.pack(keep_pending=type(self._entries) is not dict)
            if blob is not None:
                self._packed, self._bandit = blob, None

    # ----------------------------------------------------------------- entries
    def _get(self, rid: str) -> Entry | None:
        held = self._entries
        if type(held) is dict:
            found = held.get(rid)
        else:
            found = held if held is not None and held.rid == rid else None
        if found is None and self._kept is not None and rid in self._kept:
            [found] = compact_to_entries((self._kept.pop(rid),))  # built as it is read
            if not self._kept:
                self._kept = None
            self._put(found)
        return found

    def keep_compact(self, kept: tuple[tuple, ...]) -> None:
        """Hold kept answers (``compact_entries`` items of kinds ``ANSWER_CODES``) in the
        book, or as entries if they do not fit it."""
        book = AnswerBook.of(kept)
        if book is None:
            for entry in compact_to_entries(kept):
                self._put(entry)
        elif book:
            self._kept = book

    def _keep_answer(self, kind: str, entry: Open, deadline: float) -> bool:
        """Keep the answer of ``entry`` in the book (False: it does not fit; nothing done)."""
        book = self._kept
        if book is None:
            book = AnswerBook()
        if type(deadline) is not float or not book.add(
            kind, entry.rid, entry.ticket, entry.unit, deadline
        ):
            return False
        self._kept = book
        return True

    def _unkept(self) -> None:
        """The kept answers held in the book, built into entries."""
        kept, self._kept = self._kept, None
        for entry in compact_to_entries(tuple(kept or ())):
            self._put(entry)

    def _live(self) -> Iterable[Entry]:
        """The entries held as objects (not the kept answers held in the book)."""
        held = self._entries
        return held.values() if type(held) is dict else () if held is None else (held,)

    def newest_answer(self) -> float | None:
        """When the newest of the answers kept for retries was settled, if the instance
        holds several entries and all are kept answers (what ``logic.LINGER`` applies
        to); else None."""
        live, kept = list(self._live()), self._kept or ()
        if len(live) + len(kept) < 2:
            return None
        if any(type(entry) is not Settled and type(entry) is not Expired for entry in live):
            return None
        deadlines = [entry.deadline for entry in live] + ([kept.newest()] if kept else [])
        return max(deadlines) - self.experiment.retry_window

    def _put(self, entry: Entry) -> None:
        """Store ``entry``, replacing the entry of the same request_id if there is one."""
        old = self._get(entry.rid)
        if type(old) is Early:
            self._n_early -= 1
        if type(entry) is Early:
            self._n_early += 1
        held = self._entries
        if held is None or (type(held) is not dict and held.rid == entry.rid):
            self._entries = entry
            return
        if type(held) is not dict:  # a second entry: from here on a dict and a heap
            _ = self.bandit  # unpacked while the one entry can still hand back its ticket
            self._deadlines = TimeHeap()
            self._deadlines.push(held.deadline, held.rid)
            self._entries = held = {held.rid: held}
        held[entry.rid] = entry
        self._deadlines.push(entry.deadline, entry.rid)

    def _drop(self, entry: Entry) -> None:
        if type(entry) is Early:
            self._n_early -= 1
        held = self._entries
        if type(held) is not dict:
            self._entries = None
            return
        del held[entry.rid]
        if len(held) == 1:  # back to one entry: no table, no heap
            [self._entries] = held.values()
            self._deadlines = None

    def entries(self, kind: type | None = None) -> dict[str, Entry]:
        """The entries (of one kind: ``Open``, ``Settled`` or ``Early``) by request_id,
        sorted; the kept answers built into entries first when they are asked for."""
        if self._kept is not None and kind is not Open and kind is not Early:
            self._unkept()
        chosen = [e for e in self._live() if kind is None or type(e) is kind]
        return {e.rid: e for e in sorted(chosen, key=lambda e: e.rid)}

    def awaits_feedback(self) -> bool:
        """Whether a selection waits for its feedback (an ``Open`` entry): then its next
        event is likely near."""
        held = self._entries
        if type(held) is dict:
            return any(type(entry) is Open for entry in held.values())
        return type(held) is Open

    @property
    def open(self) -> dict[str, Open]:
        return self.entries(Open)

    @property
    def settled(self) -> dict[str, Settled]:
        return self.entries(Settled)

    @property
    def early(self) -> dict[str, Early]:
        return self.entries(Early)

    # ------------------------------------------------------------------ events
    def on_request(self, request: Request, now: float) -> Handled:
        rid = request.request_id
        entry = self._get(rid)
        if type(entry) is Open or type(entry) is Settled or type(entry) is Expired:
            if entry.ticket.context != request.context:
                detail = (
                    f"request_id {rid!r} was served with context "
                    f"{entry.ticket.context!r}, now asks {request.context!r}"
                )
                return Handled([self._dead(request, "context_mismatch", detail)])
            answer = self._answer(rid, entry.ticket, entry.unit)  # a retry: the same answer
            return Handled([answer], retry=True)
        refused = self._check_context(request)
        if refused is not None:
            return Handled([refused])
        u = uniform_draw(self.experiment.seed, self.key, rid)
        ticket = self.bandit.select(context=request.context, u=u)
        unit = None if self.experiment.per_unit else request.unit  # the key holds it
        self._put(Open(rid, ticket, unit, now + self.experiment.feedback_ttl, request.origin))
        served = Handled([self._answer(rid, ticket, unit)], pending=1)
        if type(entry) is Early:  # its feedback was waiting: apply it now
            return self.apply_waiting(served, entry, now)
        return served

    def apply_waiting(self, served: Handled, waiting: Early, now: float) -> Handled:
        """``served``, a request's answer, with the feedback that waited for it applied."""
        waited = self.on_feedback(waiting.feedback, now)
        served += waited
        served.pending += waited.pending
        served.applied += waited.applied
        served.early = -1
        return served

    def _check_context(self, request: Request) -> DeadLetter | None:
        experiment = self.experiment
        problem = request_context_problem(
            experiment.contexts, experiment.n_contexts, request.context
        )
        if problem is None:
            return None
        reason = "missing_field" if request.context is None else "context_out_of_range"
        return self._dead(request, reason, f"experiment {self.experiment.name!r}: {problem}")

    def on_feedback(self, feedback: Feedback, now: float) -> Handled:
        rid = feedback.request_id
        entry = self._get(rid)
        if type(entry) is Settled:
            detail = f"request_id {rid!r} already has its feedback"
            return Handled([self._dead(feedback, "duplicate_feedback", detail)])
        if type(entry) is Expired:
            detail = (
                f"request_id {rid!r} waited {self.experiment.feedback_ttl:g} s for its "
                "feedback and expired before this came"
            )
            return Handled([self._dead(feedback, "late_feedback", detail)])
        if type(entry) is Early:
            detail = f"feedback for request_id {rid!r} is already waiting"
            return Handled([self._dead(feedback, "duplicate_feedback", detail)])
        if entry is None:
            if self._n_early >= self.experiment.early_feedback_limit:
                detail = f"{self._n_early} feedback events already wait for their requests"
                return Handled([self._dead(feedback, "early_buffer_full", detail)])
            self._put(Early(rid, feedback, now + self.experiment.feedback_ttl))
            return Handled(early=1)
        served = entry.ticket.arm
        named = feedback.arm
        if named is not None and named != served and named != self.experiment.arms[served]:
            detail = (
                f"request_id {rid!r} was served arm {served} "
                f"({self.experiment.arms[served]!r}), feedback names arm {named!r}"
            )
            return Handled([self._dead(feedback, "arm_mismatch", detail)])
        self.bandit.update(entry.ticket, feedback.loss)
        deadline = now + self.experiment.retry_window
        if self._keep_answer("s", entry, deadline):
            self._drop(entry)
        else:
            self._put(Settled(rid, entry.ticket, entry.unit, deadline))
        return Handled(pending=-1, applied=1)

    def take_closed(self) -> tuple[int, int]:
        """Windows closed by ``expire`` applying feedback or a default: none, as the
        oracle's experiments neither aggregate nor default (tests/service/test_windows.py
        checks those rules against bare bandits)."""
        return 0, 0

    def expire(self, now: float) -> list[Output]:
        """Close what has waited too long: tickets without feedback, feedback without
        request; kept answers past their retry window go without a word."""
        if self._kept is not None and self._kept.due <= now:
            self._kept.expire(now)
            if not self._kept:
                self._kept = None
        out: list[Output] = []
        while self._entries is not None:
            held = self._entries
            if type(held) is dict:
                due, rid = self._deadlines.first()
                if due > now:
                    break
                self._deadlines.pop()
                entry = held.get(rid)
                if entry is None or entry.deadline != due:
                    continue  # stale: the entry moved on or is gone
            elif held.deadline <= now:
                entry = held
            else:
                break
            if type(entry) is Open:
                self.bandit.discard(entry.ticket)  # while the entry still holds it (unpack)
                out.append(self._expired(entry))
                window = self.experiment.retry_window
                if window > 0:  # its answer stays for retries, and to name late feedback
                    self._put(Expired(entry.rid, entry.ticket, entry.unit, now + window))
                    continue
            elif type(entry) is Early:
                out.append(
                    self._dead(
                        entry.feedback,
                        "unknown_ticket",
                        f"no request {entry.rid!r} arrived within "
                        f"{self.experiment.feedback_ttl:g} s of its feedback",
                    )
                )
            self._drop(entry)
        return out

    def _expired(self, served: Open) -> DeadLetter:
        """A ticket without feedback; the request is re-encoded from what was kept of it."""
        request = {"experiment": self.experiment.name, "request_id": served.rid}
        unit = self._unit(served.unit)
        if unit is not None:
            request["unit"] = unit
        if served.ticket.context is not None:
            request["context"] = served.ticket.context
        return DeadLetter(
            "ticket_expired",
            f"no feedback for request_id {served.rid!r} within {self.experiment.feedback_ttl:g} s",
            orjson.dumps(request),
            served.origin,
            self.key,
        )

    def next_deadline(self) -> float | None:
        held, kept = self._entries, None if self._kept is None else self._kept.due
        if held is None:
            return kept
        due = self._deadlines.first_time() if type(held) is dict else held.deadline
        return due if kept is None or due < kept else kept

    def _unit(self, kept: str | None) -> str | None:
        """A request's unit: implied by the key of a per-unit instance, else as kept."""
        return split_key(self.key)[1] if self.experiment.per_unit else kept

    def _answer(self, rid: str, ticket: Ticket, unit: str | None) -> Selection:
        """The selection a ticket stands for (built when emitted, not stored)."""
        return Selection(
            self.experiment.name,
            self._unit(unit),
            rid,
            self.key,
            ticket.arm,
            self.experiment.arms[ticket.arm],
            ticket.prob,
            ticket.round,
            ticket.why,
        )

    def _dead(self, event: Request | Feedback, reason: str, detail: str) -> DeadLetter:
        return DeadLetter(reason, detail, event.raw, event.origin, self.key)

    # ------------------------------------------------------------- snapshots
    def to_dict(self) -> dict[str, Any]:
        """JSON-able state (the bandit's own snapshot plus tickets and buffers)."""
        return {
            "experiment": self.experiment.name,
            "key": self.key,
            "arms": list(self.experiment.arms),
            "bandit": self.bandit.to_dict(),
            **entries_to_dict(self.entries().values()),
        }

    def compact_entries(self) -> tuple[tuple, ...] | None:
        """The entries as plain tuples (``compact_to_entries`` reads them back), or None when
        feedback waits for its request (kept whole only by ``to_dict``). Snapshots of
        instances holding tickets and answers take ~1 us an entry this way, against ~30 us
        for ``to_dict`` (measured): at an epoch's close, every touched instance pays it.

        >>> from flows.service.instances.registry import Registry
        >>> exp = Registry.from_toml('[experiments.e]\\narms = ["a", "b"]')["e"]
        >>> inst = Instance(exp, "e")
        >>> inst._put(Settled("r1", inst.bandit.select(u=0.5), None, 9.0))
        >>> inst.compact_entries()
        (('s', 'r1', ('e', 1, 1, 0.5, 0.5, None, 'bandit'), None, 9.0),)
        """
        out = list(self._kept or ())  # the kept answers first, as compact tuples
        for entry in self._live():
            kind = _COMPACT_CODES.get(type(entry))
            if kind is None:
                return None
            item = (kind, entry.rid, tuple(entry.ticket), entry.unit, entry.deadline)
            if kind == "o":
                origin = entry.origin
                item += ((origin.source, origin.partition, origin.offset, origin.time),)
            out.append(item)
        return tuple(out)

    @classmethod
    def from_dict(cls, experiment: Experiment, data: dict[str, Any]) -> Instance:
        inst = cls.__new__(cls)
        inst.restore(experiment, data)
        return inst

    def restore(self, experiment: Experiment, data: dict[str, Any]) -> None:
        """Become the instance ``data`` (from ``to_dict``) describes, following ``experiment``
        if its definition changed since (see ``follow``)."""
        bandit = Bandit.from_dict(data["bandit"])
        Instance.__init__(self, experiment, data["key"], bandit)
        for item in data["open"]:
            ticket = Ticket.from_dict(item["ticket"])
            origin = Origin(*item["origin"])
            self._put(Open(item["request_id"], ticket, item["unit"], item["deadline"], origin))
        for rid, ticket, unit, forget in data["settled"]:
            self._put(Settled(rid, Ticket.from_dict(ticket), unit, forget))
        for rid, ticket, unit, forget in data.get("expired", ()):  # older snapshots: none
            self._put(Expired(rid, Ticket.from_dict(ticket), unit, forget))
        for rid, feedback, deadline in data["early"]:
            self._put(Early(rid, _feedback_from_dict(feedback), deadline))
        self.follow(experiment, _arms_of(data, experiment, bandit.n_arms))
        self.rest()  # a restored instance starts packed


_COMPACT_CODES: dict[type, str] = {Open: "o", Settled: "s", Expired: "x"}
_COMPACT_KINDS: dict[str, type] = {"s": Settled, "x": Expired}
#: the compact codes of kept answers: at their deadline they are dropped, with no output
ANSWER_CODES = frozenset(_COMPACT_KINDS)


def entries_to_dict(entries: Iterable[Entry]) -> dict[str, list]:
    """Entries (sorted by request_id) as the lists of ``Instance.to_dict``."""
    chosen = sorted(entries, key=lambda e: e.rid)
    return {
        "open": [_open_to_dict(o) for o in chosen if type(o) is Open],
        "settled": [
            [s.rid, s.ticket.to_dict(), s.unit, s.deadline] for s in chosen if type(s) is Settled
        ],
        "expired": [
            [e.rid, e.ticket.to_dict(), e.unit, e.deadline] for e in chosen if type(e) is Expired
        ],
        "early": [
            [e.rid, _feedback_to_dict(e.feedback), e.deadline] for e in chosen if type(e) is Early
        ],
    }


def compact_to_entries(kept: tuple[tuple, ...]) -> list[Entry]:
    """The entries ``Instance.compact_entries`` wrote, as objects (a ticket written
    before ``Ticket.why`` has six fields: it reads as "bandit")."""
    out: list[Entry] = []
    for kind, rid, ticket, unit, deadline, *origin in kept:
        if kind == "o":
            out.append(Open(rid, Ticket(*ticket), unit, deadline, Origin(*origin[0])))
        else:
            out.append(_COMPACT_KINDS[kind](rid, Ticket(*ticket), unit, deadline))
    return out


def _arms_of(data: dict[str, Any], experiment: Experiment, n_arms: int) -> tuple[str, ...]:
    """The arm names a snapshot was taken with. Snapshots written before they were kept
    name none: then the experiment's first ``n_arms`` arms, by position, are assumed."""
    arms = data.get("arms")
    if arms is not None:
        return tuple(arms)
    named = experiment.arms[:n_arms]
    return named + tuple(f"#{i}" for i in range(len(named), n_arms))


def _open_to_dict(o: Open) -> dict[str, Any]:
    return {
        "request_id": o.rid,
        "ticket": o.ticket.to_dict(),
        "unit": o.unit,
        "deadline": o.deadline,
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
        "guardrails": None if f.guardrails is None else [list(g) for g in f.guardrails],
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
        _guardrails_of(d.get("guardrails")),
    )


def _guardrails_of(pairs):
    """The guardrails of a feedback written by ``_feedback_to_dict`` (None: none, or one
    written before they were kept)."""
    return None if pairs is None else tuple((name, value) for name, value in pairs)
