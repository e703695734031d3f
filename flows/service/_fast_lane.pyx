# cython: language_level=3, boundscheck=False, wraparound=False
"""The shard's common events, compiled: the fast lane of ``ShardLogic.handle``.

Most events a shard sees are a new request of a live instance and the feedback of its
open ticket (or, when both topics have a backlog, feedback that comes before its
request). This loop serves those in C, on the same state objects
(``flows.service.instance``: an ``Instance``, its entries, its bandit) and with the same
metrics, and hands every other event to the Python path (``ShardLogic._on_event``,
``ShardLogic._wake``), which is the reference: a retry, a duplicate, late feedback, a
wrong context, a full early-feedback buffer, a new or packed-away instance, a registry
change, event time, anything unusual. The lane takes an event only when it can
tell, before changing anything, that the reference would serve it the plain way; the
tests run every kind of event through both and compare outputs, states and metrics.

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

from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

from heapq import heappush
from time import time

from flows.service.events import Request, Selection
from flows.service._draw import uniform_draw
from flows.service._records cimport Layout, kept
from flows.service.instance import Early, Handled, Open, Settled
from flows.service.metrics import (
    AGE_BUCKETS,
    APPLIED,
    DECISIONS,
    PENDING,
    PROCESSING_BUCKETS,
    observe_item,
    thread_tally,
)


cdef inline double _monotonic() noexcept:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef inline void _bin(list hist, tuple buckets, double x):
    """Count ``x`` in a tally histogram: counts per bucket (the last is +Inf), then the sum
    (``metrics._observe_times`` does the same with bisect_left)."""
    cdef Py_ssize_t i = 0, n = len(buckets)
    while i < n and <double>buckets[i] < x:
        i += 1
    hist[i] += 1
    hist[n + 1] += x


cdef inline object _bandit(object instance):
    """``Instance.bandit``: the live bandit, without the property's call when it is live."""
    bandit = instance._bandit
    return instance.bandit if bandit is None else bandit


cdef inline object _next_deadline(object instance):
    """``Instance.next_deadline``: the one entry's, or the head of the heap of two or
    more."""
    held = instance._entries
    if held is None:
        return None
    return instance._deadlines[0][0] if type(held) is dict else held.deadline


cdef Layout _SELECTION = Layout(Selection, (
    "experiment", "unit", "request_id", "instance", "arm", "arm_name", "prob", "round"
))
cdef Layout _OPEN = Layout(Open, ("rid", "ticket", "unit", "deadline", "origin"))
cdef Layout _SETTLED = Layout(Settled, ("rid", "ticket", "unit", "deadline"))
cdef Layout _EARLY = Layout(Early, ("rid", "feedback", "deadline"))
cdef enum:
    MAX_EXPERIMENTS = 256  # experiments a lane keeps read
cdef enum:
    APPLIED_NOW = 1  # feedback applied to its open ticket
    EARLY = 2  # feedback kept until its request comes


cdef class _Experiment:
    """What the lane reads of an experiment, read once for each experiment object."""

    cdef object source, name, arms, seed
    cdef double ttl, retry_window
    cdef bint per_unit
    cdef Py_ssize_t n_contexts, early_limit

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


cdef class _Lane:
    """A shard's lane, kept by its logic from one batch to the next (a shard gets a few
    events a call, so what is read once per call counts): its flow's context as last
    read, its experiments as read; during a batch, the shard's logic and what it counted
    (the logic is let go after each batch: no cycle between the two)."""

    cdef object logic, context, instances, touched, deadlines, stream, clock, tally
    cdef dict experiments
    cdef bint stream_time, event_time
    cdef double now
    cdef object noted_source, noted_partition  # the input partition whose time waits
    cdef double noted_time  # its newest time served, not yet told to the stream clock

    def __init__(self):
        self.experiments = {}

    cdef int begin(self, object logic) except -1:
        """A new batch: the logic and its tables, this thread's tally, the context if it
        changed."""
        self.logic = logic
        self.instances = logic.instances
        self.touched = logic.touched
        self.deadlines = logic.deadlines
        self.tally = thread_tally()
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
        cdef _Experiment found = self.experiments.get(id(experiment))
        if found is None:  # a new object (a registry reload makes new ones): read it
            if len(self.experiments) >= MAX_EXPERIMENTS:  # reloads left old ones behind
                self.experiments.clear()
            found = _Experiment(experiment)
            self.experiments[id(experiment)] = found
        return found

    cdef double _now(self, object event) except? -1.0:
        """``ShardLogic._time_of`` off event time: the Kafka timestamp (noted as served)
        on stream time, else the clock; kept as ``now`` for the metrics."""
        origin = event.origin
        if not self.stream_time or origin.time is None:
            self.now = self.clock()
        else:
            self.now = origin.time
            self._note(origin.source, origin.partition, self.now)
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
        """The selection of a new request, or None when the Python path must decide."""
        rid = event.request_id
        held = instance._entries
        waiting = None  # feedback that came first
        if held is not None:
            waiting = held.get(rid) if type(held) is dict else held if held.rid == rid else None
            if waiting is not None and type(waiting) is not Early:
                return None  # a retry: the Python path answers it
        context = event.context
        if not (context is None if exp.n_contexts == 1 else
                type(context) is int and 0 <= context < exp.n_contexts):
            return None  # the Python path writes the dead letter
        bandit = _bandit(instance)
        now = self._now(event)
        ticket = bandit.select(context, uniform_draw(exp.seed, key, rid))
        origin = event.origin
        if type(origin.source) is str:
            kept(origin)
        if type(ticket.instance) is str:
            kept(ticket)
        entry = kept(_OPEN.built((
            rid, ticket, None if exp.per_unit else event.unit, now + exp.ttl, origin
        )))
        arm = ticket.arm
        answer = _SELECTION.built((
            exp.name, event.unit, rid, key, arm, exp.arms[arm], ticket.prob, ticket.round
        ))
        if waiting is None:
            self.put(instance, held, rid, entry, now + exp.ttl)
            return answer
        instance._put(entry)  # in place of the waiting feedback, which is applied now
        return instance.apply_waiting(Handled([answer], pending=1), waiting, now)

    cdef int put(self, object instance, object held, str rid, object entry,
                 double deadline) except -1:
        """``Instance._put`` of an Open or a Settled entry (no early feedback involved):
        the one entry, or into the table of two or more and its heap of deadlines."""
        if held is None or (type(held) is not dict and held.rid == rid):
            instance._entries = entry
        elif type(held) is dict:
            held[rid] = entry
            heappush(instance._deadlines, (deadline, rid))
        else:
            instance._put(entry)  # a second entry: the table and heap are built there
        return 0

    cdef int feedback(self, object instance, _Experiment exp, object event) except -1:
        """Apply the feedback of an open ticket (APPLIED), keep feedback that came before
        its request (EARLY), or leave it to the Python path (0)."""
        rid = event.request_id
        held = instance._entries
        entry = None
        if held is not None:
            entry = held.get(rid) if type(held) is dict else held if held.rid == rid else None
        if entry is None:
            if instance._n_early >= exp.early_limit:
                return 0  # the Python path writes the early_buffer_full dead letter
            now = self._now(event)
            instance._put(kept(_EARLY.built((rid, event, now + exp.ttl))))
            return EARLY
        if type(entry) is not Open:
            return 0
        ticket = entry.ticket
        named = event.arm
        if named is not None and named != ticket.arm and named != exp.arms[ticket.arm]:
            return False  # the Python path writes the arm_mismatch dead letter
        now = self._now(event)
        _bandit(instance).update(ticket, event.loss)
        settled = kept(_SETTLED.built((
            rid, ticket, entry.unit, now + exp.retry_window
        )))
        self.put(instance, held, rid, settled, now + exp.retry_window)
        return APPLIED_NOW

    cdef list serve(self, object logic, list events):
        self.begin(logic)
        try:
            return self.serve_all(logic, events)
        finally:
            self.logic = None

    cdef list serve_all(self, object logic, list events):
        cdef list out = []
        for key, experiment, event in events:
            served = None
            if type(event) is not str:  # not a WAKE_UP
                instance = self.instances.get(key)
                if not (self.event_time or instance is None or instance._notices is not None
                        or experiment is not instance.experiment):
                    served = self.serve_one(key, instance, experiment, event)
            if served is None:
                self.told()
                served = logic._wake() if type(event) is str else \
                    logic._on_event(key, experiment, event)
            out += served
        self.told()
        return out

    cdef object serve_one(self, str key, object instance, object experiment, object event):
        """The outputs of a plain request or feedback, or None for the Python path."""
        cdef double started = _monotonic()
        cdef _Experiment exp = self._experiment(experiment)
        cdef bint is_request = type(event) is Request
        cdef int done
        due = _next_deadline(instance)
        handled = None  # what the Python metrics count, for the less plain cases
        try:
            if is_request:
                answer = self.request(key, instance, exp, event)
                if answer is None:
                    return None
                if type(answer) is Handled:  # and the feedback that waited for it
                    handled, out = answer, list(answer)
                else:
                    out = [answer]
            else:
                done = self.feedback(instance, exp, event)
                if done == 0:
                    return None
                out = []
                if done == EARLY:
                    handled = Handled(early=1)
        except Exception as exc:  # as ShardLogic._on_event: this event's dead letter
            self.told()
            return self.logic._failed(key, experiment, event, exc)
        self.touched.add(key)
        after = _next_deadline(instance)
        if after != due:  # else the shard's queue holds its wake-up
            self.deadlines.want(key, after)
        if handled is None:
            self.count(exp, is_request, event, _monotonic() - started)
        else:
            observe_item(exp.name, event, handled, False, started, self.now)
        return out

    cdef void count(self, _Experiment exp, bint is_request, object event, double spent):
        """What ``metrics.observe_item`` counts for a plain request or feedback."""
        tally = self.tally
        c = tally.experiments.get(exp.name) or tally.experiment(exp.name)
        if is_request:
            c[DECISIONS] += 1
            c[PENDING] += 1
        else:
            c[PENDING] -= 1
            c[APPLIED] += 1
        _bin(tally.processing[is_request], PROCESSING_BUCKETS, spent)
        tally.last_event = time()
        ts = event.ts
        if ts is not None:
            tally.last_ts = ts
            _bin(tally.age[is_request], AGE_BUCKETS, max(self.now - ts, 0.0))


def handle(logic, list events) -> list:
    """Serve ``events`` (routed: (instance key, experiment, event), or a wake-up) in order
    for the shard ``logic``: the common ones here, the others by its Python path. The
    lane is kept in ``logic.lane``."""
    cdef _Lane lane = logic.lane
    if lane is None:
        lane = logic.lane = _Lane()
    return lane.serve(logic, events)
