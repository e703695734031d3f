# One bandit instance's state and event handling, compiled: see instance.pyx.

from flows.service.instances._answer_book cimport AnswerBook
from flows.service.instances._deadline_queue cimport TimeHeap


cdef enum EntryKind:
    OPEN = 1
    SETTLED = 2
    EXPIRED = 3
    EARLY = 4


cdef class RequestEntry:
    cdef public str rid
    cdef public double deadline
    cdef readonly int kind  # an EntryKind


cdef class Answered(RequestEntry):
    cdef public object ticket
    cdef public object unit


cdef class Open(Answered):
    cdef public object origin
    cdef public long collected  # feedback combined so far (an ``aggregate`` other than first)
    cdef public double combined  # their sum, last or max


cdef class Settled(Answered):
    pass


cdef class Expired(Answered):
    pass


cdef class Early(RequestEntry):
    cdef public object feedback


cdef class Changes:
    cdef public int pending, early, applied, collected
    cdef public bint retry
    cdef public long arm  # the arm of the loss applied (``applied``), else -1
    cdef public double loss, prob  # that loss, and the probability its arm was served with
    cdef public tuple others  # named-context attributes whose value went to ``other``
    cdef public tuple guarded  # (guardrails, why served) of a feedback that matched, else None

    cdef void clear(self) noexcept


cdef class Terms:
    cdef readonly object experiment
    cdef readonly str name
    cdef readonly tuple arms
    cdef readonly object seed
    cdef readonly double ttl, retry_window
    cdef readonly bint per_unit
    cdef readonly Py_ssize_t n_contexts, early_limit
    cdef readonly bint has_default
    cdef readonly double default_loss
    cdef readonly int aggregate  # an AGGREGATE: FIRST, SUM, MEAN, LAST, MAX
    cdef readonly object contexts  # ``serving.NamedContexts``, or None
    cdef readonly dict arm_index  # arm name -> index


cdef enum Aggregate:
    FIRST = 0
    SUM = 1
    MEAN = 2
    LAST = 3
    MAX = 4


cdef Terms terms_of(object experiment)


cdef class Instance:
    cdef readonly object experiment
    cdef readonly str key
    cdef Terms terms
    cdef object _bandit  # None: packed, or not created yet while _packed is None too
    cdef object _packed
    cdef RequestEntry _one  # the entry, while it holds one
    cdef dict _table  # its entries by request_id, while it holds two or more
    cdef TimeHeap _deadlines  # (deadline, request_id) of the table's entries
    cdef AnswerBook _kept  # answers kept for retries (never an empty book)
    cdef Py_ssize_t _n_early
    cdef list _notices
    cdef long _closed_applied, _closed_defaulted  # windows closed by ``expire``, untold
    cdef list _closed_losses  # their (arm, loss, prob, defaulted), untold; None if none

    cdef object live_bandit(self)
    cdef object _get(self, str rid)
    cdef int _put(self, RequestEntry entry) except -1
    cdef int _drop(self, RequestEntry entry) except -1
    cdef bint _keep_answer(self, str kind, Answered entry, double deadline) except -1
    cdef int _unkept(self) except -1
    cdef object _answer(self, str rid, object ticket, object unit)
    cdef object _dead(self, object event, str reason, str detail)
    cdef object _served_context(self, object request, object context, list out,
                                Changes changes)
    cdef object _eligible(self, object request, object eligible, list out)
    cdef int _close(self, Open entry, double loss, double now, bint defaulted) except -1
    cdef int request(self, object request, double now, list out, Changes changes) except -1
    cdef int feedback(self, object feedback, double now, list out, Changes changes) except -1
    cpdef list expire(self, double now)
    cpdef double due(self) except? -1.0
    cpdef bint has_notices(self)
