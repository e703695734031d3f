# cython: language_level=3, boundscheck=False, wraparound=False
"""A shard's events, compiled: the loop of ``ShardStore.handle``.

Every event a shard gets passes here, in order: a wake-up asks the shard for what is due
(``ShardStore.expire_due``); a request or feedback finds its instance (or has the shard
bind it: built new, or revived from its resting bytes, ``ShardStore.bind``), follows a
changed experiment, and is handled by the instance (``flows.service.instances.instance``, the only
body of the instance's rules), then counted. The loop reaches the shard only through
what ``ShardStore`` declares for it: ``instances``, ``touched``, ``deadlines``,
``context``, ``bind``, ``expire_due`` and ``changed``.

Counting has one body, here: what an event did (its outputs and the instance's
``Changes``) is added in C and handed to the thread's tally (``metrics.thread_tally``)
before anything else counts and at the end of each batch.

>>> from flows.service.shards.shard_store import FlowContext, ShardStore
>>> from flows.service.instances.registry import LiveRegistry, Registry
>>> from flows.service.wire.events import Origin, parse_request
>>> live = LiveRegistry(Registry.from_toml('[experiments.home]\\narms = ["a", "b"]'))
>>> shard = ShardStore(FlowContext(live))
>>> home = live.current["home"]
>>> ask = lambda rid: ("home", home, parse_request(
...     b'{"experiment":"home","request_id":"%s"}' % rid.encode(), Origin("t")))
>>> [first, second] = handle(shard, [ask("r1"), ask("r2")])
>>> second.round, second.request_id
(2, 'r2')
"""

from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.pythread cimport PyThread_get_thread_ident
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec
from libc.math cimport INFINITY

from time import time

from flows.service.wire.events import DeadLetter, Request
from flows.service.wire._records cimport (
    FEEDBACK_ORIGIN,
    FEEDBACK_RAW,
    FEEDBACK_TS,
    PARTITION,
    REQUEST_ORIGIN,
    REQUEST_TS,
    SELECTION_ARM,
    SELECTION_WHY,
    SOURCE,
    TIME,
    Layout,
    field,
)
from flows.service.wire import _records as records
from flows.service.instances.instance cimport Changes, Instance
from flows.service.observe.arm_metrics import (
    ARM_FEEDBACK,
    ARM_IPS,
    ARM_LOSS,
    ARM_LOSS_SQUARES,
    ARM_SELECTIONS,
    ARM_SLOTS,
    SHARE_EVERY,
    context_labels,
)
from flows.service.observe.guardrail_metrics import count_guardrails
from flows.service.observe.metrics import (
    AGE_BUCKETS,
    APPLIED,
    COLLECTED,
    DECISIONS,
    EARLY,
    EARLY_FEEDBACK,
    INSTANCES,
    LOSSES,
    PENDING,
    PROCESSING_BUCKETS,
    RETRIES,
    REWARDS,
    SLOT_OF_REASON,
    count_context_other,
    observe_expired,
    thread_tally,
)

cdef Layout _REQUEST = records.REQUEST
cdef Layout _FEEDBACK = records.FEEDBACK
cdef Layout _ORIGIN = records.ORIGIN
cdef Layout _SELECTION = records.SELECTION
cdef bytes _REWARD_KEY = b'"reward"'


cdef inline double _monotonic() noexcept:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef enum:
    MAX_BUCKETS = 32  # a histogram's buckets, +Inf apart
    MAX_EXPERIMENTS = 256  # experiments whose counts a loop keeps


cdef class _Times:
    """A histogram of seconds counted in C during a batch and added at its end to a
    tally's list (counts per bucket, the last +Inf, then the sum); a value goes in the
    first bucket whose bound is not below it (Prometheus' ``le``)."""

    cdef double bounds[MAX_BUCKETS]
    cdef long counts[MAX_BUCKETS + 1]
    cdef Py_ssize_t n
    cdef double total
    cdef bint empty
    cdef list hist  # the tally's list it adds to

    def __init__(self, tuple buckets):
        if len(buckets) > MAX_BUCKETS:
            raise ValueError(f"{len(buckets)} buckets, the loop counts at most {MAX_BUCKETS}")
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


# an arm's slots (``metrics``), read once as C numbers
cdef Py_ssize_t N_ARM_SLOTS = ARM_SLOTS, A_SELECTIONS = ARM_SELECTIONS
cdef Py_ssize_t A_FEEDBACK = ARM_FEEDBACK, A_LOSS = ARM_LOSS
cdef Py_ssize_t A_LOSS_SQUARES = ARM_LOSS_SQUARES, A_IPS = ARM_IPS
cdef double _SHARE_EVERY = SHARE_EVERY


cdef class _Counts:
    """What the loop counted for one experiment in this batch, not yet in the tally: the
    slots of an experiment's tally (``metrics``) it writes, the dead letters by slot, and
    by arm (index, as the experiment object ``experiment`` numbers them) the slots of an
    arm's tally; the shared instance whose q to read."""

    cdef str name
    cdef object experiment  # the experiment object whose arms ``by_arm`` counts
    cdef tuple arms
    cdef Py_ssize_t n_arms
    cdef double *by_arm  # N_ARM_SLOTS per arm
    cdef bint armed  # by_arm holds something
    cdef bint shared  # the experiment's instance is shared, its q exported: read it
    cdef tuple contexts  # the labels of its contexts (``context_labels``), None: context-free
    cdef object share_of  # the shared instance handled since its q was last read
    cdef double share_read  # when it was last read (monotonic)
    cdef long decisions, retries, pending, early, early_feedback, applied, collected, instances
    cdef long losses, rewards  # feedback by its field
    cdef dict by_slot  # a dead letter's slot (SLOT_OF_REASON) -> count
    cdef dict by_why  # a selection's why, other than "bandit" -> count
    cdef bint counted
    cdef list counters  # the experiment's counters in the tally ``counters_of``
    cdef object counters_of

    def __init__(self, str name):
        self.name = name
        self.by_slot = {}
        self.by_why = {}
        self.share_read = -INFINITY

    def __dealloc__(self):
        PyMem_Free(self.by_arm)

    cdef int follow(self, object experiment, object tally) except -1:
        """Count by the arms of ``experiment`` (a new one, or a reloaded registry's), after
        adding what was counted by the former's to ``tally``."""
        cdef Py_ssize_t n
        if self.armed:
            self.tallied_arms(tally)
        arms = tuple(experiment.arms)
        n = len(arms) * N_ARM_SLOTS
        PyMem_Free(self.by_arm)
        self.by_arm = <double *>PyMem_Malloc(max(n, 1) * sizeof(double))
        if self.by_arm == NULL:
            raise MemoryError()
        for i in range(n):
            self.by_arm[i] = 0.0
        self.experiment, self.arms, self.n_arms = experiment, arms, len(arms)
        self.contexts = context_labels(experiment)
        self.shared = not experiment.per_unit and (
            experiment.n_contexts == 1 or self.contexts is not None)
        self.share_of = None
        return 0

    cdef inline void applied_loss(self, long arm, double loss, double prob) noexcept:
        """A loss applied to ``arm``, served with ``prob``."""
        cdef double *slots
        if 0 <= arm < self.n_arms:
            slots = self.by_arm + arm * N_ARM_SLOTS
            slots[A_FEEDBACK] += 1.0
            slots[A_LOSS] += loss
            slots[A_LOSS_SQUARES] += loss * loss
            slots[A_IPS] += loss / prob
            self.armed = True

    cdef inline void selected(self, long arm) noexcept:
        """A selection of ``arm`` (not a retry's)."""
        if 0 <= arm < self.n_arms:
            self.by_arm[arm * N_ARM_SLOTS + A_SELECTIONS] += 1.0
            self.armed = True

    cdef int tallied_arms(self, object tally) except -1:
        """Add the counts by arm to ``tally`` (``_Tally.arm``) and start again."""
        cdef Py_ssize_t i, k
        cdef double *slots
        cdef list counters
        for i in range(self.n_arms):
            slots = self.by_arm + i * N_ARM_SLOTS
            for k in range(N_ARM_SLOTS):
                if slots[k] != 0.0:
                    break
            else:
                continue
            counters = tally.arm(self.name, self.arms[i])
            for k in range(N_ARM_SLOTS):
                if slots[k] != 0.0:
                    counters[k] += slots[k]
                    slots[k] = 0.0
        self.armed = False
        return 0

    cdef int read_share(self, object tally) except -1:
        """Note the q of the shared instance handled (a context-free one's served P too),
        at most every ``SHARE_EVERY`` s and never unpacking one at rest."""
        cdef double now = _monotonic()
        if now - self.share_read < _SHARE_EVERY:
            return 0
        instance = self.share_of
        self.share_of = None
        if instance.is_at_rest() or instance.experiment is not self.experiment:
            return 0
        self.share_read = now
        bandit = instance.bandit
        if self.contexts is None:
            q, served = [bandit.policy().tolist()], bandit.probabilities().tolist()
        else:
            q = [bandit.policy(i).tolist() for i in range(len(self.contexts))]
            served = None
        tally.shares[self.name] = (time(), self.arms, self.contexts, q, served)
        return 0


cdef class _Loop:
    """A shard's loop, kept by its store from one batch to the next (a shard gets a few
    events a call, so what is read once per call counts): its flow's context as last
    read, the counts by experiment; during a batch, the shard's store (let go after each
    batch: no cycle between the two)."""

    cdef object store, context, deadlines, stream, clock, tally
    cdef dict instances
    cdef set touched
    cdef dict counts  # experiment name -> _Counts
    cdef _Counts last_counts
    cdef Changes changes
    cdef unsigned long tally_thread  # the thread whose tally ``tally`` is
    cdef bint stream_time, event_time
    cdef object noted_source, noted_partition  # the input partition whose time waits
    cdef double noted_time  # its newest time served, not yet told to the stream clock
    cdef list counted  # the experiments whose counts wait for the tally
    cdef _Times processing_request, processing_feedback, age_request, age_feedback
    cdef object last_ts  # the ts of the newest event counted that had one

    def __init__(self):
        self.counts = {}
        self.counted = []
        self.changes = Changes()
        self.processing_request = _Times(PROCESSING_BUCKETS)
        self.processing_feedback = _Times(PROCESSING_BUCKETS)
        self.age_request = _Times(AGE_BUCKETS)
        self.age_feedback = _Times(AGE_BUCKETS)

    cdef int begin(self, object store) except -1:
        """A new batch: the store and its tables, this thread's tally, the context if it
        changed."""
        self.store = store
        self.instances = store.instances
        self.touched = store.touched
        self.deadlines = store.deadlines
        if self.tally is None or PyThread_get_thread_ident() != self.tally_thread:
            tally = self.tally = thread_tally()
            self.tally_thread = PyThread_get_thread_ident()
            self.processing_request.hist = tally.processing[True]
            self.processing_feedback.hist = tally.processing[False]
            self.age_request.hist = tally.age[True]
            self.age_feedback.hist = tally.age[False]
        self.noted_source = None
        context = store.context
        if context is not self.context:
            self.context = context
            self.stream = context.stream
            self.stream_time = context.stream is not None and not context.event_time
            self.event_time = context.event_time
            self.clock = context.clock
        return 0

    cdef double time_of(self, object event, bint is_request) except? -1.0:
        """The time an event happened at: its own ``ts`` on event time, its Kafka
        timestamp on stream time (noted as served), else the clock."""
        if self.event_time:
            ts = field(_REQUEST, event, REQUEST_TS) if is_request else \
                field(_FEEDBACK, event, FEEDBACK_TS)
            return self.clock() if ts is None else ts
        if not self.stream_time:
            return self.clock()
        origin = field(_REQUEST, event, REQUEST_ORIGIN) if is_request else \
            field(_FEEDBACK, event, FEEDBACK_ORIGIN)
        at = field(_ORIGIN, origin, TIME)
        if at is None:
            return self.clock()
        self.note(field(_ORIGIN, origin, SOURCE), field(_ORIGIN, origin, PARTITION), at)
        return at

    cdef int note(self, object source, object partition, double at) except -1:
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
        """The stream clock told what was served: before a wake-up, and at the end of the
        batch."""
        if self.noted_source is not None:
            self.stream.note_served(self.noted_source, self.noted_partition, self.noted_time)
            self.noted_source = None
        return 0

    cdef list serve(self, object store, list events):
        self.begin(store)
        try:
            return self.serve_all(store, events)
        finally:
            self.told()
            self.tallied()
            self.store = None

    cdef list serve_all(self, object store, list events):
        cdef list out = []
        for key, experiment, event in events:
            if experiment is None:  # a wake-up (``WAKE_UP``), the only event of no experiment
                self.told()
                self.tallied()
                out.extend(store.expire_due())
            else:
                self.serve_one(store, key, experiment, event, out)
        return out

    cdef int serve_one(self, object store, str key, object experiment, object event,
                       list out) except -1:
        """Handle a request or feedback: its outputs appended to ``out``, counted."""
        cdef double started = _monotonic(), now = 0.0, due = INFINITY, after
        cdef bint is_request = type(event) is Request, new = False, bound = False
        cdef Instance instance = self.instances.get(key)
        cdef Changes changes = self.changes
        cdef Py_ssize_t mark = len(out), first
        changes.clear()
        try:
            if instance is None:
                instance, new = store.bind(experiment, key)
                bound = True
            else:
                due = instance.due()
                if experiment is not instance.experiment:
                    instance.follow(experiment)  # the registry was reloaded
            if instance.has_notices():  # a registry change closed tickets
                notices = instance.take_notices()
                observe_expired(instance, notices)  # never raises
                out.extend(notices)
            now = self.time_of(event, is_request)
            if self.event_time:
                expired = instance.expire(now)
                observe_expired(instance, expired)  # never raises
                out.extend(expired)
            first = len(out)
            if is_request:
                instance.request(event, now, out, changes)
            else:
                instance.feedback(event, now, out, changes)
        except Exception as exc:  # this event's dead letter; the dataflow goes on
            del out[mark:]
            detail = f"{type(exc).__name__}: {exc}"
            first = len(out)
            out.append(DeadLetter("internal_error", detail, event.raw, event.origin, key))
            changes.clear()
            self.count(experiment, event, is_request, out, first, new, started, now, None)
            store.changed(key)
            return 0
        self.count(experiment, event, is_request, out, first, new, started, now, instance)
        self.touched.add(key)
        after = instance.due()
        if bound or after != due:  # else the shard's queue holds its wake-up
            self.deadlines.want(key, None if after == INFINITY else after)
        return 0

    cdef int count(self, object experiment, object event, bint is_request, list out,
                   Py_ssize_t first, bint new, double started, double now,
                   object instance) except -1:
        """Count what handling ``event`` did: the outputs ``out[first:]`` and
        ``self.changes``, by arm too, a new instance, the time spent and the event's age;
        ``instance`` (None after an internal error) to read the q of."""
        cdef Changes changes = self.changes
        cdef _Counts c = self.counting(experiment.name)
        cdef Py_ssize_t i
        if c.experiment is not experiment:
            c.follow(experiment, self.tally)
        if c.shared and instance is not None:
            c.share_of = instance
        if changes.arm >= 0:
            c.applied_loss(changes.arm, changes.loss, changes.prob)
        if not is_request:  # a parsed feedback has its key "reward" as these bytes, or "loss"
            if _REWARD_KEY in field(_FEEDBACK, event, FEEDBACK_RAW):
                c.rewards += 1
            else:
                c.losses += 1
        c.instances += new
        c.pending += changes.pending
        c.early += changes.early
        c.applied += changes.applied
        c.collected += changes.collected
        c.early_feedback += changes.early > 0
        if changes.others is not None:  # a named context went to its other slot
            count_context_other(c.name, changes.others)
        if changes.guarded is not None:  # a feedback sent guardrail values
            count_guardrails(self.tally, experiment, changes.guarded)
        for i in range(first, len(out)):
            item = out[i]
            if item.dead_letter:
                slot = SLOT_OF_REASON.get((<object>item).reason)
                if slot is not None:
                    c.by_slot[slot] = c.by_slot.get(slot, 0) + 1
            else:  # an answer
                c.decisions += 1
                c.retries += changes.retry
                if not changes.retry:
                    c.selected(field(_SELECTION, item, SELECTION_ARM))
                why = field(_SELECTION, item, SELECTION_WHY)
                if why != "bandit":  # the others; the bandit's are the rest of decisions
                    c.by_why[why] = c.by_why.get(why, 0) + 1
        (self.processing_request if is_request else self.processing_feedback).add(
            _monotonic() - started
        )
        ts = field(_REQUEST, event, REQUEST_TS) if is_request else \
            field(_FEEDBACK, event, FEEDBACK_TS)
        if ts is not None:
            self.last_ts = ts
            (self.age_request if is_request else self.age_feedback).add(max(now - ts, 0.0))
        return 0

    cdef _Counts counting(self, str name):
        """The counts of experiment ``name``, among those waiting for ``tallied``."""
        cdef _Counts c = self.last_counts
        if c is None or c.name != name:
            c = self.counts.get(name)
            if c is None:
                if len(self.counts) >= MAX_EXPERIMENTS:
                    self.tallied()
                    self.counts.clear()
                c = self.counts[name] = _Counts(name)
            self.last_counts = c
        if not c.counted:
            c.counted = True
            self.counted.append(c)
        return c

    cdef int tallied(self) except -1:
        """Add what the loop counted to this thread's tally (before anything else counts,
        and at the end of the batch); ``last_event`` the time of adding."""
        cdef _Counts c
        cdef list slots
        if not self.counted:
            return 0
        tally = self.tally
        for c in self.counted:
            if c.counters_of is not tally:  # a tally's counters lists are never replaced
                c.counters, c.counters_of = tally.experiment(c.name), tally
            slots = c.counters
            _add(slots, DECISIONS, c.decisions)
            _add(slots, RETRIES, c.retries)
            _add(slots, PENDING, c.pending)
            _add(slots, APPLIED, c.applied)
            _add(slots, COLLECTED, c.collected)
            _add(slots, EARLY, c.early)
            _add(slots, EARLY_FEEDBACK, c.early_feedback)
            _add(slots, INSTANCES, c.instances)
            _add(slots, LOSSES, c.losses)
            _add(slots, REWARDS, c.rewards)
            if c.by_slot:
                for slot, n in c.by_slot.items():
                    slots[slot] += n
                c.by_slot.clear()
            if c.by_why:
                served = tally.served
                for why, n in c.by_why.items():
                    served[c.name, why] = served.get((c.name, why), 0) + n
                c.by_why.clear()
            if c.armed:
                c.tallied_arms(tally)
            if c.share_of is not None:
                c.read_share(tally)
            c.decisions = c.retries = c.pending = c.applied = c.collected = c.early = 0
            c.early_feedback = c.instances = c.losses = c.rewards = 0
            c.counted = False
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


def handle(store, list events) -> list:
    """Serve ``events`` (routed: (instance key, experiment, event), or a wake-up) in order
    for the shard ``store``; their outputs, in order. The loop is kept in ``store.loop``."""
    cdef _Loop loop = store.loop
    if loop is None:
        loop = store.loop = _Loop()
    return loop.serve(store, events)
