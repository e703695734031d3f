# cython: language_level=3, boundscheck=False, wraparound=False
"""The shard's common events, compiled: the fast lane of ``ShardLogic.handle``.

Most events a shard sees are a new request of a live instance and the feedback of its
open ticket (or, when both topics have a backlog, feedback that comes before its request,
kept until the request comes and then applied with it). This loop serves those in C, on
the same state objects (``flows.service.instance``: an ``Instance``, its entries, its
bandit) and with the same metrics, and hands every other event to the Python path
(``ShardLogic._on_event``, ``ShardLogic._wake``), which is the reference: a retry, a
duplicate, late feedback, a wrong context, a full early-feedback buffer, a registry
change, event time, anything unusual. The lane takes an event only when it can tell,
before changing anything, that the reference would serve it the plain way; the tests run
every kind of event through both and compare outputs, states and metrics. An instance's
first event since its shard started binds it as the Python path does
(``ShardLogic._bind``: built, or revived from its resting bytes), then is served here if
it is plain.

It reads the records' fields at their slots' offsets (``Layout.get``) and counts its
metrics in C, added to the thread's tally before the Python path counts anything and at
the end of each batch (``_Lane.tallied``): measured by instructions (callgrind, 48,000
requests and their feedback after a warm-up), 15.9k an event with attribute reads and a
tally update per event, 11.7k with these.

>>> from flows.service.logic import logic_builder
>>> from flows.service.registry import Registry
>>> from flows.service.events import Origin, parse_request
>>> shard = logic_builder(Registry.from_toml('[experiments.home]\\narms = ["a", "b"]'))(None)
>>> home = shard.context.registry.current["home"]
>>> ask = lambda rid: ("home", home, parse_request(
...     b'{"experiment":"home","request_id":"%s"}' % rid.encode(), Origin("t")))
>>> [first] = shard.handle([ask("r1")])       # a new instance: the Python path builds it
>>> [second] = handle(shard, [ask("r2")])     # a live one: served here
>>> second.round, second.request_id
(2, 'r2')
"""

from cpython.pythread cimport PyThread_get_thread_ident
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec
from libc.math cimport INFINITY

from time import time

from flows.service.events import Feedback, Request
from flows.service._draw cimport uniform_draw
from flows.service._answer_book cimport AnswerBook
from flows.service._deadline_queue cimport TimeHeap
from flows.service._records cimport (
    ARM,
    CONTEXT,
    FEEDBACK_ORIGIN,
    FEEDBACK_TS,
    LOSS,
    PARTITION,
    REQUEST_ID,
    REQUEST_ORIGIN,
    REQUEST_TS,
    SOURCE,
    TIME,
    UNIT,
    Layout,
    field,
    kept,
)
from flows.service import _records as records
from flows.service.instance import Early, Expired, Handled, Instance, Open, Settled
from tsi_core import Bandit
from tsi_core._bandit import unpacked as _unpacked
from tsi_core.ticket import Ticket
from flows.service.metrics import (
    AGE_BUCKETS,
    APPLIED,
    DECISIONS,
    EARLY,
    FEEDBACK,
    INSTANCES,
    PENDING,
    PROCESSING_BUCKETS,
    observe_item,
    thread_tally,
)


cdef inline double _monotonic() noexcept:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef enum:
    MAX_BUCKETS = 32  # a histogram's buckets, +Inf apart


cdef class _Times:
    """A histogram of seconds counted in C during a batch and added at its end to a
    tally's list (counts per bucket, the last +Inf, then the sum), as
    ``metrics._observe_times`` adds each event with bisect_left."""

    cdef double bounds[MAX_BUCKETS]
    cdef long counts[MAX_BUCKETS + 1]
    cdef Py_ssize_t n
    cdef double total
    cdef bint empty
    cdef list hist  # the tally's list it adds to

    def __init__(self, tuple buckets):
        if len(buckets) > MAX_BUCKETS:
            raise ValueError(f"{len(buckets)} buckets, the lane counts at most {MAX_BUCKETS}")
        self.n = len(buckets)
        for i in range(self.n):
            self.bounds[i] = buckets[i]
        self.clear()

    cdef inline void add(self, double x) noexcept:
        cdef Py_ssize_t i = 0
        while i < self.n and self.bounds[i] < x:
            i += 1
        self.counts[i] += 1
        self.total += x
        self.empty = False

    cdef int added(self) except -1:
        """Add the counts to ``hist`` and start again."""
        cdef Py_ssize_t i
        cdef list hist = self.hist
        if self.empty:
            return 0
        for i in range(self.n + 1):
            if self.counts[i]:
                hist[i] += self.counts[i]
        hist[self.n + 1] += self.total
        self.clear()
        return 0

    cdef void clear(self) noexcept:
        cdef Py_ssize_t i
        for i in range(self.n + 1):
            self.counts[i] = 0
        self.total = 0.0
        self.empty = True


# What the lane builds and reads, checked against the classes at import (the events'
# layouts are _records'); the field numbers below follow each layout's order.
cdef Layout _SELECTION = records.SELECTION
cdef Layout _REQUEST = records.REQUEST
cdef Layout _FEEDBACK = records.FEEDBACK
cdef Layout _ORIGIN = records.ORIGIN
cdef Layout _OPEN = Layout(Open, ("rid", "ticket", "unit", "deadline", "origin"))
cdef Layout _SETTLED = Layout(Settled, ("rid", "ticket", "unit", "deadline"))
cdef Layout _EXPIRED = Layout(Expired, ("rid", "ticket", "unit", "deadline"))
cdef Layout _EARLY = Layout(Early, ("rid", "feedback", "deadline"))
cdef Layout _INSTANCE = Layout(Instance, (
    "_bandit", "_deadlines", "_entries", "_kept", "_n_early", "_notices", "_packed", "experiment",
    "key",
))
# fields: of an entry (Open; Settled has the first four, Early its own, see _entry)
cdef enum:
    RID = 0
    TICKET = 1
    ENTRY_UNIT = 2
    DEADLINE = 3
    EARLY_DEADLINE = 2
# of an Instance
cdef enum:
    BANDIT = 0
    DEADLINES = 1
    ENTRIES = 2
    KEPT = 3
    N_EARLY = 4
    NOTICES = 5
    PACKED = 6
    EXPERIMENT = 7
    KEY = 8
# of a Ticket (a named tuple)
cdef enum:
    T_INSTANCE = 0
    T_ROUND = 1
    T_ARM = 2
    T_PROB = 3
if Ticket._fields[:4] != ("instance", "round", "arm", "prob"):
    raise ImportError(f"compiled code reads Ticket(instance, round, arm, prob, ...), "
                      f"the class has {Ticket._fields}")


cdef inline object _entry(object held, Py_ssize_t slot):
    """Field ``slot`` (RID, TICKET, ENTRY_UNIT or DEADLINE; for Early only RID and
    DEADLINE) of an entry of any kind."""
    kind = type(held)
    if kind is Open:
        return field(_OPEN, held, slot)
    if kind is Settled:
        return field(_SETTLED, held, slot)
    if kind is Early:
        return field(_EARLY, held, EARLY_DEADLINE if slot == DEADLINE else slot)
    return field(_EXPIRED, held, slot)


cdef inline object _ticket(object ticket, Py_ssize_t field):
    """Field ``field`` of a Ticket (a named tuple: by index when it is one)."""
    if type(ticket) is Ticket:
        return (<tuple>ticket)[field]
    return ticket[field]


cdef inline object _held(object held, str rid):
    """The entry of ``rid`` among an instance's entries (none, one, or a dict), or None."""
    if held is None:
        return None
    if type(held) is dict:
        return (<dict>held).get(rid)
    return held if _entry(held, RID) == rid else None


cdef inline bint _kept_has(object instance, str rid) except -1:
    """Whether ``rid`` is among the answers an instance keeps in its book
    (``Instance._kept``; the Python path builds one into an entry when it is asked for)."""
    kept = field(_INSTANCE, instance, KEPT)
    return kept is not None and (<AnswerBook?>kept).has(rid)


cdef class _Experiment  # below


cdef inline object _bandit(object instance, _Experiment exp):
    """``Instance.bandit``: the live bandit. A packed one with no open ticket to hand back
    is unpacked here (``Bandit.unpack`` without tickets is ``_bandit.unpacked``), three
    Python calls fewer an event of a user who came back; a new bandit, or one whose open
    ticket goes back in, by the property."""
    bandit = field(_INSTANCE, instance, BANDIT)
    if bandit is not None:
        return bandit
    packed = field(_INSTANCE, instance, PACKED)
    if packed is None or type(field(_INSTANCE, instance, ENTRIES)) is Open:
        return instance.bandit
    bandit = _unpacked(Bandit, packed, exp.template(), field(_INSTANCE, instance, KEY))
    instance._bandit, instance._packed = bandit, None
    return bandit


cdef inline double _next_deadline(object instance) except? -1.0:
    """``Instance.next_deadline``: the one entry's, or the head of the heap of two or
    more, or the kept answers' earliest if sooner; infinity for None (compared as a C
    double: no float object made or compared per event)."""
    cdef double due
    held, kept = field(_INSTANCE, instance, ENTRIES), field(_INSTANCE, instance, KEPT)
    if held is None:
        due = INFINITY
    elif type(held) is dict:
        due = (<TimeHeap?>field(_INSTANCE, instance, DEADLINES)).first_time()
    else:
        due = _entry(held, DEADLINE)
    if kept is not None and (<AnswerBook?>kept).due < due:
        return (<AnswerBook>kept).due
    return due
cdef Py_ssize_t EARLY_FEEDBACK = FEEDBACK["early"]  # the tally's slot of early feedback
cdef enum:
    MAX_EXPERIMENTS = 256  # experiments a lane keeps read
cdef enum:
    APPLIED_NOW = 1  # feedback applied to its open ticket
    KEPT_EARLY = 2  # feedback kept until its request comes
    ANSWERED = 3  # a request answered
    ANSWERED_WAITING = 4  # a request answered, and the feedback that waited applied


cdef class _Experiment:
    """What the lane reads of an experiment, read once for each experiment object."""

    cdef object source, name, arms, seed
    cdef object _template  # its bandits' configuration, read on first use
    cdef double ttl, retry_window
    cdef bint per_unit
    cdef Py_ssize_t n_contexts, early_limit
    # counted in this batch, not yet in the tally: metrics.observe_item's slots
    cdef long decisions, pending, applied, early, early_feedback, instances
    cdef bint counted
    cdef list counters  # the experiment's counters in the tally ``counters_of``
    cdef object counters_of

    def __init__(self, experiment):
        self.source = experiment  # held: its id, the lane's key, is not reused meanwhile
        self.name = experiment.name
        self.arms = experiment.arms
        self.seed = experiment.seed
        self.ttl = experiment.feedback_ttl
        self.retry_window = experiment.retry_window
        self.per_unit = experiment.per_unit
        self.n_contexts = experiment.n_contexts
        self.early_limit = experiment.early_feedback_limit

    cdef object template(self):
        """``Experiment._template``, what its packed bandits are unpacked with."""
        if self._template is None:
            self._template = self.source._template
        return self._template


cdef class _Lane:
    """A shard's lane, kept by its logic from one batch to the next (a shard gets a few
    events a call, so what is read once per call counts): its flow's context as last
    read, its experiments as read; during a batch, the shard's logic and what it counted
    (the logic is let go after each batch: no cycle between the two)."""

    cdef object logic, context, deadlines, stream, clock, tally
    cdef dict instances
    cdef set touched
    cdef dict experiments
    cdef _Experiment last_experiment  # the one read last: a shard often serves one
    cdef unsigned long tally_thread  # the thread whose tally ``tally`` is
    cdef bint stream_time, event_time
    cdef double now
    cdef object noted_source, noted_partition  # the input partition whose time waits
    cdef double noted_time  # its newest time served, not yet told to the stream clock
    cdef list counted  # the experiments whose counts wait for the tally
    cdef bint waited  # the request served last applied feedback that waited for it
    cdef _Times processing_request, processing_feedback, age_request, age_feedback
    cdef object last_ts  # the ts of the newest event counted that had one

    def __init__(self):
        self.experiments = {}
        self.counted = []
        self.processing_request = _Times(PROCESSING_BUCKETS)
        self.processing_feedback = _Times(PROCESSING_BUCKETS)
        self.age_request = _Times(AGE_BUCKETS)
        self.age_feedback = _Times(AGE_BUCKETS)

    cdef int begin(self, object logic) except -1:
        """A new batch: the logic and its tables, this thread's tally, the context if it
        changed."""
        self.logic = logic
        self.instances = logic.instances
        self.touched = logic.touched
        self.deadlines = logic.deadlines
        if self.tally is None or PyThread_get_thread_ident() != self.tally_thread:
            tally = self.tally = thread_tally()
            self.tally_thread = PyThread_get_thread_ident()
            self.processing_request.hist = tally.processing[True]
            self.processing_feedback.hist = tally.processing[False]
            self.age_request.hist = tally.age[True]
            self.age_feedback.hist = tally.age[False]
        self.noted_source = None
        context = logic.context
        if context is not self.context:
            self.context = context
            self.stream = context.stream
            self.stream_time = context.stream is not None
            self.event_time = context.event_time  # replays: every event by the Python path
            self.clock = context.clock
        return 0

    cdef _Experiment _experiment(self, object experiment):
        cdef _Experiment found = self.last_experiment
        if found is not None and found.source is experiment:
            return found
        found = self.experiments.get(id(experiment))
        if found is None:  # a new object (a registry reload makes new ones): read it
            if len(self.experiments) >= MAX_EXPERIMENTS:  # reloads left old ones behind
                self.experiments.clear()
            found = _Experiment(experiment)
            self.experiments[id(experiment)] = found
        self.last_experiment = found
        return found

    cdef double _now(self, object event) except? -1.0:
        """``ShardLogic._time_of`` off event time: the Kafka timestamp (noted as served)
        on stream time, else the clock; kept as ``now`` for the metrics."""
        origin = field(_REQUEST, event, REQUEST_ORIGIN) if type(event) is Request else \
            field(_FEEDBACK, event, FEEDBACK_ORIGIN)
        at = field(_ORIGIN, origin, TIME) if self.stream_time else None
        if at is None:
            self.now = self.clock()
        else:
            self.now = at
            self._note(field(_ORIGIN, origin, SOURCE), field(_ORIGIN, origin, PARTITION), self.now)
        return self.now

    cdef int _note(self, object source, object partition, double at) except -1:
        """Note ``at`` as served from (source, partition), once per run of events of one
        partition: ``StreamClock.note_served`` keeps the newest, so only the run's last
        matters; ``told`` hands it over before anything reads the stream time."""
        if self.noted_source is not None and (
            source != self.noted_source or partition != self.noted_partition
        ):
            self.told()
        if self.noted_source is None or at > self.noted_time:
            self.noted_time = at
        self.noted_source, self.noted_partition = source, partition
        return 0

    cdef int told(self) except -1:
        """The stream clock told what was served: before the Python path runs, and at the
        end of the batch."""
        if self.noted_source is not None:
            self.stream.note_served(self.noted_source, self.noted_partition, self.noted_time)
            self.noted_source = None
        return 0

    cdef object request(self, str key, object instance, _Experiment exp, object event):
        """The selection of a new request, or None when the Python path must decide;
        ``waited`` says whether it applied feedback that waited for it."""
        self.waited = False
        rid = field(_REQUEST, event, REQUEST_ID)
        held = field(_INSTANCE, instance, ENTRIES)
        waiting = _held(held, rid)  # feedback that came first
        if (waiting is not None and type(waiting) is not Early) or _kept_has(instance, rid):
            return None  # a retry: the Python path answers it
        context = field(_REQUEST, event, CONTEXT)
        if not (context is None if exp.n_contexts == 1 else
                type(context) is int and 0 <= context < exp.n_contexts):
            return None  # the Python path writes the dead letter
        bandit = _bandit(instance, exp)
        now = self._now(event)
        ticket = bandit.select(context, uniform_draw(exp.seed, key, rid))
        origin = field(_REQUEST, event, REQUEST_ORIGIN)
        if type(field(_ORIGIN, origin, SOURCE)) is str:
            kept(origin)
        if type(_ticket(ticket, T_INSTANCE)) is str:
            kept(ticket)
        unit = field(_REQUEST, event, UNIT)
        entry_unit = None if exp.per_unit else unit
        entry = kept(_OPEN.built((rid, ticket, entry_unit, now + exp.ttl, origin)))
        arm = _ticket(ticket, T_ARM)
        answer = kept(_SELECTION.built((
            exp.name, unit, rid, key, arm, exp.arms[arm], _ticket(ticket, T_PROB),
            _ticket(ticket, T_ROUND)
        )))
        if waiting is None:
            self.put(instance, held, rid, entry, now + exp.ttl, 0)
            return answer
        feedback = field(_EARLY, waiting, 1)
        named = field(_FEEDBACK, feedback, ARM)
        if named is not None and named != arm and named != exp.arms[arm]:
            instance._put(entry)  # the Python path writes the arm_mismatch dead letter
            return instance.apply_waiting(Handled([answer], pending=1), waiting, now)
        # Instance.apply_waiting: the open entry in place of the waiting feedback, which
        # is applied now
        self.put(instance, held, rid, entry, now + exp.ttl, -1)
        self.settle(instance, exp, rid, ticket, entry_unit, field(_FEEDBACK, feedback, LOSS), now)
        self.waited = True
        return answer

    cdef int settle(self, object instance, _Experiment exp, str rid, object ticket,
                    object unit, object loss, double now) except -1:
        """Apply ``loss`` to the open ticket of ``rid`` and keep its answer for retries
        (``Instance.on_feedback`` past its checks): in the instance's book (``rid`` is not
        in it: the lane found its open ticket), or as an entry where it does not fit."""
        cdef AnswerBook book
        _bandit(instance, exp).update(ticket, loss)
        kept_now = field(_INSTANCE, instance, KEPT)
        book = AnswerBook() if kept_now is None else kept_now
        if book.keep("s", rid, ticket, unit, now + exp.retry_window):
            if kept_now is None:
                instance._kept = book
            held = field(_INSTANCE, instance, ENTRIES)
            if type(held) is not dict:  # ``Instance._drop`` of the open ticket
                instance._entries = None
            else:  # its deadline stays in the heap, stale (skipped when it comes due)
                del (<dict>held)[rid]
                if len(<dict>held) == 1:  # back to one entry: no table, no heap
                    for one in (<dict>held).values():
                        instance._entries = one
                    instance._deadlines = None
            return 0
        settled = kept(_SETTLED.built((rid, ticket, unit, now + exp.retry_window)))
        self.put(instance, field(_INSTANCE, instance, ENTRIES), rid, settled,
                 now + exp.retry_window, 0)
        return 0

    cdef int put(self, object instance, object held, str rid, object entry,
                 double deadline, int early) except -1:
        """``Instance._put`` of ``entry`` in place of the entry of ``rid`` in ``held`` (the
        instance's entries) if any: the one entry, or into the table of two or more and
        its heap of deadlines; ``early`` is what the instance's count of waiting feedback
        gains (1: an Early entry where there was none; -1: one replaced)."""
        cdef TimeHeap heap
        if held is None or (type(held) is not dict and _entry(held, RID) == rid):
            instance._entries = entry
        elif type(held) is dict:
            (<dict>held)[rid] = entry
            kept(held)  # see below
            (<TimeHeap?>field(_INSTANCE, instance, DEADLINES)).add(deadline, rid)
        elif field(_INSTANCE, instance, BANDIT) is None:
            # a second entry beside a packed bandit: ``Instance._put`` unpacks it while
            # the one entry can still hand back its ticket
            instance._put(entry)
            return 0  # and the count of waiting feedback kept
        else:  # a second entry: from here on a table and a heap (``Instance._put``)
            heap = TimeHeap()
            old_rid = _entry(held, RID)
            heap.add(_entry(held, DEADLINE), old_rid)
            heap.add(deadline, rid)
            # a dict holding a record is tracked by the cyclic GC (and again at each
            # insert), even when its records are not (``kept``); no cycle can pass
            # through an instance's entries (none refers back), so it is not walked
            instance._entries = kept({old_rid: held, rid: entry})
            instance._deadlines = heap
        if early:
            instance._n_early = field(_INSTANCE, instance, N_EARLY) + early
        return 0

    cdef int feedback(self, object instance, _Experiment exp, object event) except -1:
        """Apply the feedback of an open ticket (APPLIED), keep feedback that came before
        its request (EARLY), or leave it to the Python path (0)."""
        rid = field(_FEEDBACK, event, REQUEST_ID)
        held = field(_INSTANCE, instance, ENTRIES)
        entry = _held(held, rid)
        if entry is None:
            if _kept_has(instance, rid):
                return 0  # the Python path writes the duplicate_feedback dead letter
            if field(_INSTANCE, instance, N_EARLY) >= exp.early_limit:
                return 0  # the Python path writes the early_buffer_full dead letter
            now = self._now(event)
            early = kept(_EARLY.built((rid, event, now + exp.ttl)))
            self.put(instance, held, rid, early, now + exp.ttl, 1)
            return KEPT_EARLY
        if type(entry) is not Open:
            return 0
        ticket = field(_OPEN, entry, TICKET)
        named = field(_FEEDBACK, event, ARM)
        if named is not None:
            arm = _ticket(ticket, T_ARM)
            if named != arm and named != exp.arms[arm]:
                return 0  # the Python path writes the arm_mismatch dead letter
        now = self._now(event)
        self.settle(instance, exp, rid, ticket, field(_OPEN, entry, ENTRY_UNIT),
                    field(_FEEDBACK, event, LOSS), now)
        return APPLIED_NOW

    cdef list serve(self, object logic, list events):
        self.begin(logic)
        try:
            return self.serve_all(logic, events)
        finally:
            self.tallied()
            self.logic = None

    cdef list serve_all(self, object logic, list events):
        cdef list out = []
        cdef _Experiment counted
        for key, experiment, event in events:
            served = None
            kind = type(event)
            if kind is Request or kind is Feedback:  # not a WAKE_UP
                instance = self.instances.get(key)
                bound = new = False
                if instance is None and not self.event_time and logic.shard is not None:
                    # its first event since the shard started: built, or revived from its
                    # resting bytes, as the Python path binds it (``ShardLogic._bind``)
                    try:
                        instance, new = logic._bind(experiment, key)
                    except Exception as exc:
                        self.told()
                        self.tallied()
                        out += logic._failed(key, experiment, event, exc)
                        continue
                    bound = True
                    if new:  # counted here: the paths below see an instance that exists
                        counted = self.counting(self._experiment(experiment))
                        counted.instances += 1
                if not (self.event_time or instance is None
                        or field(_INSTANCE, instance, NOTICES) is not None
                        or experiment is not field(_INSTANCE, instance, EXPERIMENT)):
                    served = self.serve_one(key, instance, experiment, event, bound)
            if served is None:
                self.told()
                self.tallied()
                served = logic._wake() if type(event) is str else \
                    logic._on_event(key, experiment, event)
            out.extend(served)
        self.told()
        return out

    cdef object serve_one(self, str key, object instance, object experiment, object event,
                          bint bound):
        """The outputs of a plain request or feedback, or None for the Python path."""
        cdef double started = _monotonic()
        cdef _Experiment exp = self._experiment(experiment)
        cdef bint is_request = type(event) is Request
        cdef int done
        cdef double due = _next_deadline(instance), after
        handled = None  # what the Python metrics count, for the less plain cases
        try:
            if is_request:
                answer = self.request(key, instance, exp, event)
                if answer is None:
                    return None
                if type(answer) is Handled:  # and a dead letter for the waiting feedback
                    handled, out = answer, list(answer)
                else:
                    out = [answer]
                done = ANSWERED_WAITING if self.waited else ANSWERED
            else:
                done = self.feedback(instance, exp, event)
                if done == 0:
                    return None
                out = []
        except Exception as exc:  # as ShardLogic._on_event: this event's dead letter
            self.told()
            return self.logic._failed(key, experiment, event, exc)
        self.touched.add(key)
        after = _next_deadline(instance)
        if bound or after != due:  # else the shard's queue holds its wake-up
            self.deadlines.want(key, None if after == INFINITY else after)
        if handled is None:
            self.count(exp, done, event, _monotonic() - started)
        else:
            self.tallied()  # what the lane counted goes first
            observe_item(exp.name, event, handled, False, started, self.now)
        return out

    cdef void count(self, _Experiment exp, int done, object event, double spent):
        """What ``metrics.observe_item`` counts for what the lane did with ``event``
        (``done``), kept in the lane until ``tallied``."""
        cdef bint is_request = done == ANSWERED or done == ANSWERED_WAITING
        self.counting(exp)
        if done == ANSWERED:
            exp.decisions += 1
            exp.pending += 1
        elif done == ANSWERED_WAITING:  # the open ticket settled at once
            exp.decisions += 1
            exp.applied += 1
            exp.early -= 1
        elif done == APPLIED_NOW:
            exp.pending -= 1
            exp.applied += 1
        else:  # KEPT_EARLY
            exp.early += 1
            exp.early_feedback += 1
        (self.processing_request if is_request else self.processing_feedback).add(spent)
        ts = field(_REQUEST, event, REQUEST_TS) if is_request else \
            field(_FEEDBACK, event, FEEDBACK_TS)
        if ts is not None:
            self.last_ts = ts
            (self.age_request if is_request else self.age_feedback).add(max(self.now - ts, 0.0))

    cdef _Experiment counting(self, _Experiment exp):
        """``exp``, among the experiments whose counts wait for ``tallied``."""
        if not exp.counted:
            exp.counted = True
            self.counted.append(exp)
        return exp

    cdef int tallied(self) except -1:
        """Add what the lane counted to this thread's tally (before the Python path
        counts anything, and at the end of the batch): the same sums as an
        ``observe_item`` per event, ``last_event`` the time of adding."""
        cdef _Experiment exp
        if not self.counted:
            return 0
        cdef list c
        tally = self.tally
        for exp in self.counted:
            if exp.counters_of is not tally:  # a tally's counters lists are never replaced
                exp.counters, exp.counters_of = tally.experiment(exp.name), tally
            c = exp.counters
            _add(c, DECISIONS, exp.decisions)
            _add(c, PENDING, exp.pending)
            _add(c, APPLIED, exp.applied)
            _add(c, EARLY, exp.early)
            _add(c, EARLY_FEEDBACK, exp.early_feedback)
            _add(c, INSTANCES, exp.instances)
            exp.decisions = exp.pending = exp.applied = exp.early = exp.early_feedback = 0
            exp.instances = 0
            exp.counted = False
        self.counted.clear()
        self.processing_request.added()
        self.processing_feedback.added()
        self.age_request.added()
        self.age_feedback.added()
        tally.last_event = time()
        if self.last_ts is not None:
            tally.last_ts, self.last_ts = self.last_ts, None
        return 0


cdef inline int _add(list counters, Py_ssize_t slot, long n) except -1:
    """``counters[slot] += n``, skipped for 0 (most of a call's counts)."""
    if n:
        counters[slot] += n
    return 0


def handle(logic, list events) -> list:
    """Serve ``events`` (routed: (instance key, experiment, event), or a wake-up) in order
    for the shard ``logic``: the common ones here, the others by its Python path. The
    lane is kept in ``logic.lane``."""
    cdef _Lane lane = logic.lane
    if lane is None:
        lane = logic.lane = _Lane()
    return lane.serve(logic, events)
