# One bandit instance's state and event handling, compiled: see instance.pyx.

from flows.service.instances._answer_book cimport AnswerBook
from flows.service.shards._deadline_queue cimport TimeHeap


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


cdef class Settled(Answered):
    pass


cdef class Expired(Answered):
    pass


cdef class Early(RequestEntry):
    cdef public object feedback


cdef class Changes:
    cdef public int pending, early, applied
    cdef public bint retry

    cdef void clear(self) noexcept


cdef class Terms:
    cdef readonly object experiment
    cdef readonly str name
    cdef readonly tuple arms
    cdef readonly object seed
    cdef readonly double ttl, retry_window
    cdef readonly bint per_unit
    cdef readonly Py_ssize_t n_contexts, early_limit


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

    cdef object live_bandit(self)
    cdef object _get(self, str rid)
    cdef int _put(self, RequestEntry entry) except -1
    cdef int _drop(self, RequestEntry entry) except -1
    cdef bint _keep_answer(self, str kind, Answered entry, double deadline) except -1
    cdef int _unkept(self) except -1
    cdef object _answer(self, str rid, object ticket, object unit)
    cdef object _dead(self, object event, str reason, str detail)
    cdef int request(self, object request, double now, list out, Changes changes) except -1
    cdef int feedback(self, object feedback, double now, list out, Changes changes) except -1
    cpdef list expire(self, double now)
    cpdef double due(self) except? -1.0
    cpdef bint has_notices(self)
