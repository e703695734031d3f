# cython: language_level=3, boundscheck=False, wraparound=False
"""One bandit instance's event handling: pure logic, no I/O, the clock passed in.

Requests draw an arm with u hashed from (seed, instance, request_id), so a retried or
replayed request gets the same answer. A selection waits as an open ticket until its
feedback arrives or its time to live passes. Feedback that arrives before its request
waits in a bounded buffer. Whatever is not applied comes back as a ``DeadLetter`` with
its reason: nothing is dropped silently, and a refused event changes no state.

This module is compiled, and it is the only body of these rules: the shard's event loop
(``flows.service.shards._event_loop``) calls the same operations a test or a tool calls.

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

cimport cython
from libc.math cimport INFINITY

import orjson

from flows.service.instances._answer_book cimport AnswerBook
from flows.service.instances._deadline_queue cimport TimeHeap
from flows.service.instances._draw cimport uniform_draw as _draw
from flows.service.wire._records cimport (
    ARM,
    CONTEXT,
    ELIGIBLE,
    FEEDBACK_GUARDRAILS,
    LOSS,
    REQUEST_ID,
    REQUEST_ORIGIN,
    SOURCE,
    UNIT,
    Layout,
    field,
    kept,
)
from flows.service.wire import _records as records
from flows.service.wire.events import DeadLetter, Feedback, Origin, Selection
from flows.service.wire.keys import split_key
from flows.service.instances import serving
from tsi_core import Bandit, Ticket
from tsi_core.migrate import migrate
from flows.service.instances.serving import request_context_problem

Output = Selection | DeadLetter  # what handling an event hands out

cdef Layout _REQUEST = records.REQUEST
cdef Layout _FEEDBACK = records.FEEDBACK
cdef Layout _ORIGIN = records.ORIGIN
cdef Layout _SELECTION = records.SELECTION
if Ticket._fields[:4] != ("instance", "round", "arm", "prob"):
    raise ImportError(f"compiled code reads Ticket(instance, round, arm, prob, ...), "
                      f"the class has {Ticket._fields}")


def uniform_draw(seed: int, instance: str, request_id: str) -> float:
    """u in [0, 1) from a stable hash (never the salted built-in ``hash``): the first 53
    bits of the 8-byte BLAKE2b of ``f"{seed}\\x00{instance}\\x00{request_id}"``, computed
    in C (``flows.service.instances._draw``; the same bits as the hashlib formula it documents).

    >>> uniform_draw(1, "home", "r1") == uniform_draw(1, "home", "r1")
    True
    """
    return _draw(seed, instance, request_id)


# ------------------------------------------------------------------- entries
@cython.no_gc
cdef class RequestEntry:
    """What an instance holds for one request_id: ``Open``, ``Settled``, ``Expired`` or
    ``Early``. Entries hold strings, numbers, tickets and events only (never a cycle),
    so they are kept out of the cyclic GC."""

    def __eq__(self, other):
        return type(self) is type(other) and self._fields() == (<RequestEntry>other)._fields()

    def __repr__(self) -> str:
        names = type(self).FIELDS
        inner = ", ".join(f"{n}={v!r}" for n, v in zip(names, self._fields()))
        return f"{type(self).__name__}({inner})"

    def __reduce__(self):
        return type(self), self._fields()

    def _fields(self) -> tuple:
        raise NotImplementedError


@cython.no_gc
cdef class Answered(RequestEntry):
    """An entry holding the ticket a request was served with, and its unit (None where
    the instance key implies it, per unit)."""

    def _fields(self) -> tuple:
        return (self.rid, self.ticket, self.unit, self.deadline)


@cython.no_gc
cdef class Open(Answered):
    """A served selection waiting for its feedback until ``deadline`` (the end of its
    window); ``origin`` is where the request came from, for the dead letter if it
    expires. With an ``aggregate`` other than ``first``, the feedback of the window is
    combined as it comes: ``collected`` of them, their sum, last or max ``combined``."""

    FIELDS = ("rid", "ticket", "unit", "deadline", "origin", "collected", "combined")

    def __init__(self, str rid, ticket, unit, double deadline, origin, long collected=0,
                 double combined=0.0):
        self.rid, self.ticket, self.unit, self.deadline, self.origin = (
            rid, ticket, unit, deadline, origin
        )
        self.collected, self.combined = collected, combined
        self.kind = OPEN

    def _fields(self) -> tuple:
        return (
            self.rid, self.ticket, self.unit, self.deadline, self.origin, self.collected,
            self.combined,
        )


@cython.no_gc
cdef class Settled(Answered):
    """A request whose feedback was applied, kept until ``deadline`` to answer retries."""

    FIELDS = ("rid", "ticket", "unit", "deadline")

    def __init__(self, str rid, ticket, unit, double deadline):
        self.rid, self.ticket, self.unit, self.deadline = rid, ticket, unit, deadline
        self.kind = SETTLED


@cython.no_gc
cdef class Expired(Answered):
    """A selection whose feedback never came, kept until ``deadline`` to answer retries
    (with the same answer) and to name late feedback (``late_feedback``)."""

    FIELDS = ("rid", "ticket", "unit", "deadline")

    def __init__(self, str rid, ticket, unit, double deadline):
        self.rid, self.ticket, self.unit, self.deadline = rid, ticket, unit, deadline
        self.kind = EXPIRED


@cython.no_gc
cdef class Early(RequestEntry):
    """Feedback that arrived before its request, kept until ``deadline``."""

    FIELDS = ("rid", "feedback", "deadline")

    def __init__(self, str rid, feedback, double deadline):
        self.rid, self.feedback, self.deadline = rid, feedback, deadline
        self.kind = EARLY

    def _fields(self) -> tuple:
        return (self.rid, self.feedback, self.deadline)


cdef inline Open _open(str rid, object ticket, object unit, double deadline, object origin):
    cdef Open entry = Open.__new__(Open)
    entry.rid, entry.ticket, entry.unit, entry.deadline, entry.origin = (
        rid, ticket, unit, deadline, origin
    )
    entry.kind = OPEN
    return entry


cdef inline Answered _answered(int kind, str rid, object ticket, object unit, double deadline):
    """A ``Settled`` or ``Expired`` entry."""
    cdef Answered entry = Settled.__new__(Settled) if kind == SETTLED else Expired.__new__(Expired)
    entry.rid, entry.ticket, entry.unit, entry.deadline = rid, ticket, unit, deadline
    entry.kind = kind
    return entry


cdef inline Early _early(str rid, object feedback, double deadline):
    cdef Early entry = Early.__new__(Early)
    entry.rid, entry.feedback, entry.deadline = rid, feedback, deadline
    entry.kind = EARLY
    return entry


cdef inline void _collect(Open entry, int aggregate, double loss) noexcept:
    """Add a feedback's ``loss`` to what its window combined."""
    if entry.collected == 0 or aggregate == LAST:
        entry.combined = loss
    elif aggregate == MAX:
        entry.combined = max(entry.combined, loss)
    else:  # SUM and MEAN add up
        entry.combined += loss
    entry.collected += 1


cdef inline double _combined(Open entry, int aggregate) noexcept:
    """The loss a window's feedback makes."""
    if aggregate == MEAN:
        return entry.combined / entry.collected
    return entry.combined


cdef inline bint _past(double deadline, double now) noexcept:
    """Whether an entry's ``deadline`` has come at ``now``: an open window whose deadline
    is ``now`` is closed before an event at ``now`` is handled."""
    return deadline <= now


def aggregate_losses(str aggregate, losses) -> float:
    """The loss applied for one window's feedback ``losses`` (in the order they came) under
    ``aggregate`` (one of ``serving.AGGREGATES``): for ``first`` the first one (applied at
    once; the others are ``duplicate_feedback``), else what ``expire`` applies when the
    window ends. The rule's one body, for tools that read served logs (``tsi evaluate``).

    >>> aggregate_losses("mean", [1.0, 0.0, 0.5]), aggregate_losses("max", [1, 3, 2])
    (0.5, 3.0)
    >>> aggregate_losses("sum", [])
    Traceback (most recent call last):
    ValueError: no feedback to combine under aggregate 'sum'
    """
    cdef int code = AGGREGATES.index(serving.aggregate(aggregate))
    cdef Open window = Open.__new__(Open)
    for loss in losses:
        if code == FIRST:
            return float(loss)
        _collect(window, code, loss)
    if window.collected == 0:
        raise ValueError(f"no feedback to combine under aggregate {aggregate!r}")
    return _combined(window, code)


def in_window(double served_at, double at, double ttl) -> bool:
    """Whether feedback at time ``at`` falls in the window of a selection served at
    ``served_at`` with ``feedback_ttl`` ``ttl``: before the ticket's deadline
    ``served_at + ttl`` (at it the window is closed and the feedback is
    ``late_feedback``), and, for feedback that came before its request, the request
    before the feedback's own deadline ``at + ttl`` (else ``unknown_ticket``).

    >>> in_window(0.0, 599.5, 600.0), in_window(0.0, 600.0, 600.0), in_window(9.0, 5.0, 600.0)
    (True, False, True)
    """
    return not _past(served_at + ttl, at) and not _past(at + ttl, served_at)


# ------------------------------------------------------------------ outcomes
cdef class Changes:
    """What handling an event changed, for whoever counts (the metrics): open tickets
    (``pending``) and waiting feedback (``early``) gained or lost, feedback ``applied``
    or ``collected`` in its window (with an applied loss: its ``arm``, ``loss`` and the
    ``prob`` the arm was served with), whether it was a ``retry`` of a served request, and
    the named-context attributes that went to their ``other`` slot, and the ``guarded``
    values a feedback that matched its selection sent, with why that was served (what
    the guardrails compare). The shard's loop keeps one and
    clears it before each event."""

    cdef void clear(self) noexcept:
        self.pending = self.early = self.applied = self.collected = 0
        self.retry = False
        self.others = None
        self.guarded = None
        self.arm = -1


class Handled(list):
    """What an event produced (its outputs, in order) and what it changed (see
    ``Changes``), as one value.

    >>> done = Handled(pending=-1, applied=1)
    >>> list(done), done.applied
    ([], 1)
    """

    __slots__ = ("applied", "collected", "early", "pending", "retry")

    def __init__(self, outputs=(), pending=0, early=0, applied=0, retry=False, collected=0):
        super().__init__(outputs)
        self.pending, self.early, self.applied, self.retry = pending, early, applied, retry
        self.collected = collected


cdef object _handled(list out, Changes changes):
    return Handled(
        out, changes.pending, changes.early, changes.applied, changes.retry, changes.collected
    )


# --------------------------------------------------------------------- terms
cdef class Terms:
    """What an instance reads of its experiment at each event, read once for each
    experiment object (a registry reload makes new ones)."""

    def __init__(self, experiment):
        self.experiment = experiment
        self.name = experiment.name
        self.arms = tuple(experiment.arms)
        self.seed = experiment.seed
        self.ttl = experiment.feedback_ttl
        self.retry_window = experiment.retry_window
        self.per_unit = experiment.per_unit
        self.n_contexts = experiment.n_contexts
        self.early_limit = experiment.early_feedback_limit
        self.has_default = experiment.default_loss is not None
        self.default_loss = experiment.default_loss if self.has_default else 0.0
        self.aggregate = AGGREGATES.index(experiment.aggregate)
        self.contexts = experiment.contexts
        self.arm_index = {name: i for i, name in enumerate(self.arms)}


AGGREGATES = serving.AGGREGATES  # in the order of the ``Aggregate`` codes
cdef dict _terms = {}
cdef Terms _last_terms = None
cdef enum:
    MAX_TERMS = 256  # experiment objects whose terms are kept read


cdef Terms terms_of(object experiment):
    """The terms of ``experiment``, read on its first use."""
    global _last_terms
    cdef Terms found = _last_terms
    if found is not None and found.experiment is experiment:
        return found
    found = _terms.get(id(experiment))
    if found is None or found.experiment is not experiment:
        if len(_terms) >= MAX_TERMS:  # reloads left old ones behind
            _terms.clear()
        found = Terms(experiment)
        _terms[id(experiment)] = found
    _last_terms = found
    return found


# ------------------------------------------------------------------ instance
cdef class Instance:
    """State and event handling of one instance (an experiment, or experiment + unit).

    Each request_id has at most one entry, which moves Early -> Open -> Settled (or
    Expired) -> gone: answers are kept ``retry_window`` seconds after the feedback (or the
    expiry) for retries. Idle instances are the common case with one bandit per user, so
    they are kept small: the bandit is packed into bytes while no ticket is pending, and
    the entries are held as nothing, one entry, or (from two on) a dict with a heap of
    deadlines. Answers kept for retries are held apart, in C rows (an ``AnswerBook``;
    beyond its size as entries), and one is built into an entry only when something
    reads it (a retry, duplicate or late feedback).
    """

    def __init__(self, experiment, str key, bandit=None):
        self.experiment = experiment
        self.terms = terms_of(experiment)
        self.key = key
        self._bandit = bandit
        self._packed = None
        self._one = None
        self._table = None
        self._deadlines = None
        self._kept = None
        self._n_early = 0
        self._notices = None

    @staticmethod
    def at_rest(experiment, str key, bytes packed) -> Instance:
        """An instance whose bandit rests as ``packed`` (``Bandit.pack`` bytes of
        ``experiment``'s definition), holding nothing else yet."""
        cdef Instance instance = Instance(experiment, key)
        instance._packed = packed
        return instance

    def __reduce__(self):
        return _instance_of, (
            self.experiment, self.key, self._bandit, self._packed, self._one, self._table,
            self._deadlines, self._kept, self._n_early, self._notices,
        )

    # ----------------------------------------------------- registry changes
    def follow(self, experiment, old_arms=None) -> None:
        """Become an instance of ``experiment`` (its definition changed in the registry),
        keeping what was learned: arms are matched by name (``Experiment.arm_map``) and
        the bandit migrated (``tsi_core.migrate``). Open tickets of a retired arm (or
        context) are closed with an ``arm_retired`` (``context_retired``) dead letter,
        which ``take_notices`` hands out; answers kept for retries of a retired arm are
        dropped. The serving settings (``allocation``, the window's rules) apply at once
        and change nothing learned."""
        old_arms = self.experiment.arms if old_arms is None else old_arms
        bandit = self.live_bandit()  # unpacked with the definition it was packed with
        if experiment.same_state_as(old_arms, bandit):
            if bandit.allocation != experiment.allocation:
                bandit.allocation = experiment.allocation
            self.experiment, self.terms = experiment, terms_of(experiment)
            return
        template = experiment.template
        moved = migrate(
            bandit,
            experiment.arm_map(old_arms),
            competition=experiment.competition,
            gamma=template.gamma,
            variant=template.variant,
            new_arm_share=experiment.new_arm_share,
        )
        moved.bandit.allocation = experiment.allocation
        notices = []
        for entry in list(self.entries().values()):
            if entry.kind == EARLY:
                continue
            if entry.kind == OPEN:
                ticket = moved.tickets[entry.ticket.round]
                if ticket is None:
                    notices.append(self._retired(entry, moved.new_index_of_old, old_arms))
            else:
                ticket = moved.remap(entry.ticket)
            if ticket is None:
                self._drop(entry)
            else:
                (<Answered>entry).ticket = ticket
        self._bandit, self._packed = moved.bandit, None
        self.experiment, self.terms = experiment, terms_of(experiment)
        if notices:
            self._notices = (self._notices or []) + notices

    def take_notices(self) -> list:
        """Dead letters a registry change produced, once."""
        notices, self._notices = self._notices or [], None
        return notices

    cpdef bint has_notices(self):
        """Whether a registry change left dead letters to hand out."""
        return self._notices is not None

    def _retired(self, Open served, kept_arms, old_arms):
        arm = served.ticket.arm
        reason = "context_retired" if arm in kept_arms else "arm_retired"
        what = f"context {served.ticket.context}" if arm in kept_arms else f"arm {old_arms[arm]!r}"
        letter = self._expired(served)
        detail = f"{what} of request_id {served.rid!r} left the experiment's definition"
        return DeadLetter(reason, detail, letter.raw, served.origin, self.key)

    # ---------------------------------------------------------------- bandit
    @property
    def bandit(self):
        """The live bandit (created, or unpacked after it was put to rest, on first use)."""
        return self.live_bandit()

    cdef object live_bandit(self):
        if self._bandit is None:
            if self._packed is None:
                self._bandit = self.experiment.new_bandit(self.key)
            else:
                one = self._one  # packed only with at most one entry: see rest()
                pending = ((<Open>one).ticket,) if one is not None and one.kind == OPEN else ()
                self._bandit = self.experiment.unpack_bandit(self._packed, self.key, pending)
                self._packed = None
        return self._bandit

    def rest(self) -> None:
        """Pack the bandit (``Bandit.pack``), unless it has many pending
        tickets (a busy shared instance), which would have to be handed back at every
        unpack."""
        if self._bandit is not None:
            blob = self._bandit.pack(keep_pending=self._table is None)
            if blob is not None:
                self._packed, self._bandit = blob, None

    @property
    def packed(self):
        """The packed bandit while the instance is at rest, else None."""
        return self._packed

    def is_at_rest(self) -> bool:
        """Whether the bandit is packed and no dead letter waits to be handed out."""
        return self._packed is not None and self._bandit is None and self._notices is None

    def holds_nothing(self) -> bool:
        """Whether the instance holds no entry and no kept answer (only its bandit)."""
        return self._one is None and self._table is None and self._kept is None

    def n_held(self) -> int:
        """Entries and kept answers held."""
        n = len(self._table) if self._table is not None else self._one is not None
        return n + (0 if self._kept is None else len(self._kept))

    def holding(self) -> dict:
        """How the instance holds its state (tests, diagnostics): its bandit (``live``,
        ``packed`` or None: not created yet), whether its entries are a table, the
        table's heap of (deadline, request_id), the answers in its book, the feedback
        waiting for its request.

        >>> from flows.service.instances.registry import Registry
        >>> Instance(Registry.from_toml('[experiments.e]\\narms = ["a"]')["e"], "e").holding()
        {'bandit': None, 'table': False, 'deadlines': None, 'book': 0, 'n_early': 0}
        """
        return {
            "bandit": "live" if self._bandit is not None else (
                None if self._packed is None else "packed"
            ),
            "table": self._table is not None,
            "deadlines": None if self._deadlines is None else list(self._deadlines),
            "book": 0 if self._kept is None else len(self._kept),
            "n_early": self._n_early,
        }

    def build_kept(self) -> None:
        """Build the answers kept in the book into entries (what reading them does)."""
        self._unkept()

    # --------------------------------------------------------------- entries
    cdef object _get(self, str rid):
        cdef RequestEntry found = None
        if self._table is not None:
            found = self._table.get(rid)
        elif self._one is not None and self._one.rid == rid:
            found = self._one
        if found is None and self._kept is not None and self._kept.has(rid):
            [found] = compact_to_entries((self._kept.pop(rid),))  # built as it is read
            if not self._kept:
                self._kept = None
            self._put(found)
        return found

    def get(self, str rid):
        """The entry of ``rid``, or None (a kept answer is built into an entry)."""
        return self._get(rid)

    def put(self, RequestEntry entry) -> None:
        """Store ``entry``, replacing the entry of the same request_id if there is one."""
        self._put(entry)

    def keep_compact(self, tuple items) -> None:
        """Hold kept answers (``compact_entries`` items of kinds ``ANSWER_CODES``) in the
        book, or as entries if they do not fit it."""
        book = AnswerBook.of(items)
        if book is None:
            for entry in compact_to_entries(items):
                self._put(entry)
        elif book:
            self._kept = book

    cdef bint _keep_answer(self, str kind, Answered entry, double deadline) except -1:
        """Keep the answer of ``entry`` in the book (False: it does not fit; nothing done)."""
        cdef AnswerBook book = self._kept
        if book is None:
            book = AnswerBook()
        if not book.keep(kind, entry.rid, entry.ticket, entry.unit, deadline):
            return False
        self._kept = book
        return True

    cdef int _unkept(self) except -1:
        """The kept answers held in the book, built into entries."""
        book, self._kept = self._kept, None
        for entry in compact_to_entries(tuple(book or ())):
            self._put(entry)
        return 0

    def _live(self):
        """The entries held as objects (not the kept answers held in the book)."""
        if self._table is not None:
            return self._table.values()
        return () if self._one is None else (self._one,)

    def newest_answer(self):
        """When the newest of the answers kept for retries was settled, if the instance
        holds several entries and all are kept answers; else None."""
        live, book = list(self._live()), self._kept
        if len(live) + (0 if book is None else len(book)) < 2:
            return None
        for entry in live:
            if entry.kind != SETTLED and entry.kind != EXPIRED:
                return None
        deadlines = [(<RequestEntry>entry).deadline for entry in live]
        if book is not None:
            deadlines.append(book.newest())
        return max(deadlines) - self.terms.retry_window

    cdef int _put(self, RequestEntry entry) except -1:
        cdef RequestEntry old = self._get(entry.rid), one
        if old is not None and old.kind == EARLY:
            self._n_early -= 1
        if entry.kind == EARLY:
            self._n_early += 1
        if self._table is None:
            one = self._one
            if one is None or one.rid == entry.rid:
                self._one = entry
                return 0
            # a second entry: from here on a table and a heap of deadlines
            self.live_bandit()  # unpacked while the one entry can still hand back its ticket
            self._deadlines = TimeHeap()
            self._deadlines.add(one.deadline, one.rid)
            self._table, self._one = {one.rid: one}, None
        self._table[entry.rid] = entry
        self._deadlines.add(entry.deadline, entry.rid)
        return 0

    cdef int _drop(self, RequestEntry entry) except -1:
        if entry.kind == EARLY:
            self._n_early -= 1
        if self._table is None:
            self._one = None
            return 0
        del self._table[entry.rid]
        if len(self._table) == 1:  # back to one entry: no table, no heap
            for one in self._table.values():
                self._one = one
            self._table, self._deadlines = None, None
        return 0

    def entries(self, kind=None) -> dict:
        """The entries (of one kind: ``Open``, ``Settled``, ``Expired`` or ``Early``) by
        request_id, sorted; the kept answers built into entries first when asked for."""
        if self._kept is not None and kind is not Open and kind is not Early:
            self._unkept()
        code = 0 if kind is None else _KIND_OF[kind]
        chosen = [e for e in self._live() if code == 0 or (<RequestEntry>e).kind == code]
        return {e.rid: e for e in sorted(chosen, key=_rid)}

    def awaits_feedback(self) -> bool:
        """Whether a selection waits for its feedback (an ``Open`` entry): then its next
        event is likely near."""
        return any((<RequestEntry>entry).kind == OPEN for entry in self._live())

    @property
    def open(self) -> dict:
        return self.entries(Open)

    @property
    def settled(self) -> dict:
        return self.entries(Settled)

    @property
    def early(self) -> dict:
        return self.entries(Early)

    @property
    def n_early(self) -> int:
        return self._n_early

    # ---------------------------------------------------------------- events
    def on_request(self, request, double now) -> Handled:
        """A request's answer (or dead letter) and what it changed."""
        cdef list out = []
        cdef Changes changes = Changes()
        self.request(request, now, out, changes)
        return _handled(out, changes)

    def on_feedback(self, feedback, double now) -> Handled:
        """What a feedback event produced (a dead letter, or nothing) and changed."""
        cdef list out = []
        cdef Changes changes = Changes()
        self.feedback(feedback, now, out, changes)
        return _handled(out, changes)

    cdef int request(self, object request, double now, list out, Changes changes) except -1:
        cdef Terms terms = self.terms
        cdef Answered answered
        rid = field(_REQUEST, request, REQUEST_ID)
        context = field(_REQUEST, request, CONTEXT)
        eligible = field(_REQUEST, request, ELIGIBLE)
        if type(context) is dict:  # named attributes: their combination's index
            context = self._served_context(request, context, out, changes)
            if context is None:
                return 0
        if eligible is not None:
            eligible = self._eligible(request, eligible, out)
            if eligible is None:
                return 0
        entry = self._get(rid)
        if entry is not None and (<RequestEntry>entry).kind != EARLY:
            answered = entry
            if answered.ticket.context != context:
                detail = (
                    f"request_id {rid!r} was served with context "
                    f"{answered.ticket.context!r}, now asks {context!r}"
                )
                out.append(self._dead(request, "context_mismatch", detail))
                return 0
            out.append(self._answer(rid, answered.ticket, answered.unit))  # the same answer
            changes.retry = True
            return 0
        problem = request_context_problem(terms.contexts, terms.n_contexts, context)
        if problem is not None:
            reason = "missing_field" if context is None else "context_out_of_range"
            out.append(self._dead(request, reason, f"experiment {terms.name!r}: {problem}"))
            return 0
        try:
            ticket = self.live_bandit().select(
                context, _draw(terms.seed, self.key, rid), eligible
            )
        except ValueError as exc:  # the forced arm is not eligible
            if eligible is None:
                raise
            out.append(self._dead(request, "ineligible_arms", f"{exc}"))
            return 0
        origin = field(_REQUEST, request, REQUEST_ORIGIN)
        if type(field(_ORIGIN, origin, SOURCE)) is str:
            kept(origin)  # strings and numbers only: never walked by the cyclic GC
        if type((<tuple>ticket)[0]) is str:
            kept(ticket)
        unit = None if terms.per_unit else field(_REQUEST, request, UNIT)
        self._put(_open(rid, ticket, unit, now + terms.ttl, origin))
        out.append(self._answer(rid, ticket, unit))
        changes.pending += 1
        if entry is not None:  # its feedback was waiting: apply it now
            self.feedback((<Early>entry).feedback, now, out, changes)
            changes.early = -1
        return 0

    cdef object _served_context(self, object request, object context, list out,
                                Changes changes):
        """The index of a request's named context (``others`` in ``changes``: the
        attributes whose value went to their ``other`` slot); None, with its dead letter
        in ``out``, if the experiment has no named contexts or an attribute is missing or
        unknown."""
        cdef Terms terms = self.terms
        where = f"experiment {terms.name!r}"
        if terms.contexts is None:
            detail = f"{where} has no named contexts, got context {context!r}"
            out.append(self._dead(request, "context_out_of_range", detail))
            return None
        try:
            index, others = terms.contexts.index(context)
        except KeyError as exc:
            detail = f"{where}: context attribute {exc.args[0]!r} is missing"
            out.append(self._dead(request, "missing_field", detail))
            return None
        except ValueError as exc:
            out.append(self._dead(request, "unknown_context_attribute", f"{where}: {exc}"))
            return None
        if others:
            changes.others = others
        return index

    cdef object _eligible(self, object request, object eligible, list out):
        """A request's eligible arms (names or indices) as a tuple of indices; None, with
        its dead letter in ``out``, for an empty list, an arm the experiment does not
        have (``unknown_arm``) or one named twice (``ineligible_arms``)."""
        cdef Terms terms = self.terms
        indices, unknown = serving.arm_indices(terms.arm_index, len(terms.arms), eligible)
        if unknown:
            detail = f"experiment {terms.name!r} has no arm {unknown}, arms {list(terms.arms)}"
            out.append(self._dead(request, "unknown_arm", detail))
            return None
        if not indices or len(set(indices)) != len(indices):
            detail = (
                f"eligible must name distinct arms of {list(terms.arms)}, got {list(eligible)}"
            )
            out.append(self._dead(request, "ineligible_arms", detail))
            return None
        return tuple(indices)

    def apply_waiting(self, served, Early waiting, double now) -> Handled:
        """``served``, a request's answer, with the feedback that waited for it applied."""
        waited = self.on_feedback(waiting.feedback, now)
        served += waited
        served.pending += waited.pending
        served.applied += waited.applied
        served.collected += waited.collected
        served.early = -1
        return served

    cdef int feedback(self, object feedback, double now, list out, Changes changes) except -1:
        cdef Terms terms = self.terms
        cdef Answered answered
        rid = field(_FEEDBACK, feedback, REQUEST_ID)
        cdef RequestEntry entry = self._get(rid)
        cdef int kind = 0 if entry is None else entry.kind
        if kind == SETTLED:
            detail = f"request_id {rid!r} already has its feedback"
            out.append(self._dead(feedback, "duplicate_feedback", detail))
            return 0
        if kind == EXPIRED:
            detail = (
                f"request_id {rid!r} waited {terms.ttl:g} s for its "
                "feedback and expired before this came"
            )
            out.append(self._dead(feedback, "late_feedback", detail))
            return 0
        if kind == EARLY:
            detail = f"feedback for request_id {rid!r} is already waiting"
            out.append(self._dead(feedback, "duplicate_feedback", detail))
            return 0
        if entry is None:
            if self._n_early >= terms.early_limit:
                detail = f"{self._n_early} feedback events already wait for their requests"
                out.append(self._dead(feedback, "early_buffer_full", detail))
                return 0
            self._put(_early(rid, feedback, now + terms.ttl))
            changes.early += 1
            return 0
        answered = <Answered>entry
        served = (<tuple>answered.ticket)[2]
        named = field(_FEEDBACK, feedback, ARM)
        if named is not None and named != served and named != terms.arms[served]:
            detail = (
                f"request_id {rid!r} was served arm {served} "
                f"({terms.arms[served]!r}), feedback names arm {named!r}"
            )
            out.append(self._dead(feedback, "arm_mismatch", detail))
            return 0
        guardrails = field(_FEEDBACK, feedback, FEEDBACK_GUARDRAILS)
        if guardrails is not None:
            changes.guarded = (guardrails, (<tuple>answered.ticket)[6])
        loss = field(_FEEDBACK, feedback, LOSS)
        if terms.aggregate != FIRST:  # combined, applied once when the window ends
            _collect(<Open>answered, terms.aggregate, loss)
            changes.collected += 1
            return 0
        self.live_bandit().update(answered.ticket, loss)
        deadline = now + terms.retry_window
        if self._keep_answer("s", answered, deadline):
            self._drop(answered)
        else:
            self._put(_answered(SETTLED, rid, answered.ticket, answered.unit, deadline))
        changes.pending -= 1
        changes.applied += 1
        changes.arm, changes.loss, changes.prob = served, loss, (<tuple>answered.ticket)[3]
        return 0

    cpdef list expire(self, double now):
        """Close what has waited too long: tickets without feedback, feedback without
        request; kept answers past their retry window go without a word."""
        cdef RequestEntry entry
        cdef double due, window
        if self._kept is not None and self._kept.due <= now:
            self._kept.expire(now)
            if not self._kept:
                self._kept = None
        out = []
        while self._one is not None or self._table is not None:
            if self._table is not None:
                due = self._deadlines.first_time()
                if not _past(due, now):
                    break
                _, rid = self._deadlines.pop()
                entry = self._table.get(rid)
                if entry is None or entry.deadline != due:
                    continue  # stale: the entry moved on or is gone
            elif _past(self._one.deadline, now):
                entry = self._one
            else:
                break
            if entry.kind == OPEN and (<Open>entry).collected > 0:  # its window's feedback
                self._close(
                    <Open>entry, _combined(<Open>entry, self.terms.aggregate), now, False
                )
                self._closed_applied += 1
                continue
            if entry.kind == OPEN and self.terms.has_default:  # none came: the default
                self._close(<Open>entry, self.terms.default_loss, now, True)
                self._closed_defaulted += 1
                continue
            if entry.kind == OPEN:
                self.live_bandit().discard((<Open>entry).ticket)  # while the entry holds it
                out.append(self._expired(entry))
                window = self.terms.retry_window
                if window > 0:  # its answer stays for retries, and to name late feedback
                    self._put(_answered(
                        EXPIRED, entry.rid, (<Open>entry).ticket, (<Open>entry).unit,
                        now + window,
                    ))
                    continue
            elif entry.kind == EARLY:
                out.append(
                    self._dead(
                        (<Early>entry).feedback,
                        "unknown_ticket",
                        f"no request {entry.rid!r} arrived within "
                        f"{self.terms.ttl:g} s of its feedback",
                    )
                )
            self._drop(entry)
        return out

    cdef int _close(self, Open entry, double loss, double now, bint defaulted) except -1:
        """End a window: apply ``loss`` to its ticket (the ``defaulted`` loss if none
        came), and keep its answer for retries (later feedback is ``late_feedback``) for
        the retry window."""
        cdef tuple ticket = <tuple>entry.ticket
        self.live_bandit().update(ticket, loss)
        if self._closed_losses is None:
            self._closed_losses = []
        self._closed_losses.append((ticket[2], loss, ticket[3], defaulted))
        window = self.terms.retry_window
        if window > 0:
            self._put(_answered(EXPIRED, entry.rid, entry.ticket, entry.unit, now + window))
        else:
            self._drop(entry)
        return 0

    def take_closed(self) -> tuple:
        """(windows closed with their feedback combined, windows closed with the default
        loss) by ``expire`` since last asked: what the metrics count."""
        closed = (self._closed_applied, self._closed_defaulted)
        self._closed_applied = self._closed_defaulted = 0
        return closed

    def take_closed_losses(self) -> list:
        """(arm, loss, prob, defaulted) of each window ``expire`` closed since last
        asked: the losses it applied, what the metrics count by arm."""
        closed, self._closed_losses = self._closed_losses, None
        return [] if closed is None else closed

    def _expired(self, Open served):
        """A ticket without feedback; the request is re-encoded from what was kept of it."""
        request = {"experiment": self.terms.name, "request_id": served.rid}
        unit = self._unit(served.unit)
        if unit is not None:
            request["unit"] = unit
        if served.ticket.context is not None:
            request["context"] = served.ticket.context
        return DeadLetter(
            "ticket_expired",
            f"no feedback for request_id {served.rid!r} within {self.terms.ttl:g} s",
            orjson.dumps(request),
            served.origin,
            self.key,
        )

    cpdef double due(self) except? -1.0:
        """The next deadline; infinity when there is none."""
        cdef double at
        if self._table is not None:
            at = self._deadlines.first_time()
        elif self._one is not None:
            at = self._one.deadline
        else:
            at = INFINITY
        if self._kept is not None and self._kept.due < at:
            return self._kept.due
        return at

    def next_deadline(self):
        """The next deadline, or None."""
        at = self.due()
        return None if at == INFINITY else at

    def _unit(self, unit):
        """A request's unit: implied by the key of a per-unit instance, else as kept."""
        return split_key(self.key)[1] if self.terms.per_unit else unit

    cdef object _answer(self, str rid, object ticket, object unit):
        """The selection a ticket stands for (built when emitted, not stored)."""
        cdef tuple t = <tuple>ticket
        arm = t[2]
        return kept(_SELECTION.built((
            self.terms.name, self._unit(unit), rid, self.key, arm, self.terms.arms[arm], t[3], t[1],
            t[6],
        )))

    cdef object _dead(self, object event, str reason, str detail):
        return DeadLetter(reason, detail, event.raw, event.origin, self.key)

    # ------------------------------------------------------------- snapshots
    def to_dict(self) -> dict:
        """JSON-able state (the bandit's own snapshot plus tickets and buffers)."""
        return {
            "experiment": self.experiment.name,
            "key": self.key,
            "arms": list(self.experiment.arms),
            "bandit": self.live_bandit().to_dict(),
            **entries_to_dict(self.entries().values()),
        }

    def compact_entries(self):
        """The entries as plain tuples (``compact_to_entries`` reads them back), or None
        when feedback waits for its request (kept whole only by ``to_dict``).

        >>> from flows.service.instances.registry import Registry
        >>> exp = Registry.from_toml('[experiments.e]\\narms = ["a", "b"]')["e"]
        >>> inst = Instance(exp, "e")
        >>> inst.put(Settled("r1", inst.bandit.select(u=0.5), None, 9.0))
        >>> inst.compact_entries()
        (('s', 'r1', ('e', 1, 1, 0.5, 0.5, None, 'bandit'), None, 9.0),)
        """
        out = list(self._kept or ())  # the kept answers first, as compact tuples
        for entry in self._live():
            kind = _COMPACT_CODES.get(entry.kind)
            if kind is None:
                return None
            item = (kind, entry.rid, tuple(entry.ticket), entry.unit, entry.deadline)
            if kind == "o":
                origin = entry.origin
                item += ((origin.source, origin.partition, origin.offset, origin.time),)
                if (<Open>entry).collected:  # a window's feedback combined so far
                    item += ((<Open>entry).collected, (<Open>entry).combined)
            out.append(item)
        return tuple(out)

    @classmethod
    def from_dict(cls, experiment, dict data) -> Instance:
        """The instance ``data`` (from ``to_dict``) describes, following ``experiment`` if
        its definition changed since (see ``follow``); it starts packed."""
        bandit = Bandit.from_dict(data["bandit"])
        cdef Instance inst = Instance(experiment, data["key"], bandit)
        for item in data["open"]:
            ticket = Ticket.from_dict(item["ticket"])
            origin = Origin(*item["origin"])
            collected, combined = item.get("collected", (0, 0.0))
            inst._put(Open(
                item["request_id"], ticket, item["unit"], item["deadline"], origin, collected,
                combined,
            ))
        for rid, ticket, unit, forget in data["settled"]:
            inst._put(Settled(rid, Ticket.from_dict(ticket), unit, forget))
        for rid, ticket, unit, forget in data.get("expired", ()):  # older snapshots: none
            inst._put(Expired(rid, Ticket.from_dict(ticket), unit, forget))
        for rid, feedback, deadline in data["early"]:
            inst._put(Early(rid, _feedback_from_dict(feedback), deadline))
        inst.follow(experiment, _arms_of(data, experiment, bandit.n_arms))
        inst.rest()
        return inst


def _instance_of(experiment, key, bandit, packed, one, table, deadlines, book, n_early, notices):
    """An instance from ``Instance.__reduce__``'s fields (pickle, copy)."""
    cdef Instance inst = Instance(experiment, key, bandit)
    inst._packed, inst._one, inst._table, inst._deadlines = packed, one, table, deadlines
    inst._kept, inst._n_early, inst._notices = book, n_early, notices
    return inst


def _rid(entry):
    return entry.rid


_COMPACT_CODES = {OPEN: "o", SETTLED: "s", EXPIRED: "x"}
_KIND_OF = {Open: OPEN, Settled: SETTLED, Expired: EXPIRED, Early: EARLY}
_COMPACT_KINDS = {"s": Settled, "x": Expired}
#: the compact codes of kept answers: at their deadline they are dropped, with no output
ANSWER_CODES = frozenset(_COMPACT_KINDS)


def entries_to_dict(entries) -> dict:
    """Entries (sorted by request_id) as the lists of ``Instance.to_dict``."""
    chosen = sorted(entries, key=_rid)
    return {
        "open": [_open_to_dict(o) for o in chosen if o.kind == OPEN],
        "settled": [
            [s.rid, s.ticket.to_dict(), s.unit, s.deadline] for s in chosen if s.kind == SETTLED
        ],
        "expired": [
            [e.rid, e.ticket.to_dict(), e.unit, e.deadline] for e in chosen if e.kind == EXPIRED
        ],
        "early": [
            [e.rid, _feedback_to_dict(e.feedback), e.deadline] for e in chosen if e.kind == EARLY
        ],
    }


def compact_to_entries(tuple items) -> list:
    """The entries ``Instance.compact_entries`` wrote, as objects (a ticket written
    before ``Ticket.why`` has six fields: it reads as "bandit")."""
    out = []
    for kind, rid, ticket, unit, deadline, *rest in items:
        if kind == "o":  # rest: its origin, and what its window combined, if anything
            out.append(Open(rid, Ticket(*ticket), unit, deadline, Origin(*rest[0]), *rest[1:]))
        else:
            out.append(_COMPACT_KINDS[kind](rid, Ticket(*ticket), unit, deadline))
    return out


def _arms_of(dict data, experiment, n_arms) -> tuple:
    """The arm names a snapshot was taken with. Snapshots written before they were kept
    name none: then the experiment's first ``n_arms`` arms, by position, are assumed."""
    arms = data.get("arms")
    if arms is not None:
        return tuple(arms)
    named = tuple(experiment.arms[:n_arms])
    return named + tuple(f"#{i}" for i in range(len(named), n_arms))


def _open_to_dict(o) -> dict:
    saved = {
        "request_id": o.rid,
        "ticket": o.ticket.to_dict(),
        "unit": o.unit,
        "deadline": o.deadline,
        "origin": [o.origin.source, o.origin.partition, o.origin.offset],
    }
    if o.collected:  # a window's feedback combined so far
        saved["collected"] = [o.collected, o.combined]
    return saved


def _feedback_to_dict(f) -> dict:
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


def _feedback_from_dict(dict d):
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
