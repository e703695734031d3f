# cython: language_level=3, boundscheck=False, wraparound=False
"""An instance's answers kept for retries, in one C array.

After its feedback (or its expiry) a request's answer is kept ``retry_window`` seconds
(an hour by default), to answer a retry the same way and to name duplicate or late
feedback. Held as entry objects (a ``Settled``, its ``Ticket``, its numbers, a slot in
the instance's dict and heap) an answer takes several times a row's bytes and a few
allocations (bench/RESULTS.md, "kept answers in C rows"); a busy service keeps an hour
of them. Here it is one 80-byte row and its hash: the request_id and unit strings it
already had, the ticket's numbers in C. At most ``LIMIT`` rows: the answers of an
instance beyond that (a busy shared instance) are kept as entries, with their heap. A row comes out as the compact tuple of ``Instance.compact_entries``
(kind, rid, ticket as a tuple, unit, deadline), the same values bit for bit.

Rows are found by a scan of their hashes (at most ``LIMIT``, in an array of their own:
a request of a user with 15 answers reads two cache lines, not 15 rows), kept in the
order they came, and dropped at their deadline by ``expire``.

>>> book = AnswerBook()
>>> book.add("s", "r1", ("home", 1, 0, 0.5, 0.5, None, "holdout"), None, 10.0)
True
>>> "r1" in book, "r2" in book, len(book), book.due
(True, False, 1, 10.0)
>>> book.pop("r1")
('s', 'r1', ('home', 1, 0, 0.5, 0.5, None, 'holdout'), None, 10.0)
>>> len(book), book.next_deadline()
(0, None)
"""

from cpython.float cimport PyFloat_CheckExact
from cpython.long cimport PyLong_CheckExact
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from cpython.object cimport PyObject
from cpython.ref cimport Py_DECREF, Py_INCREF, Py_XDECREF, Py_XINCREF
from cpython.unicode cimport PyUnicode_CheckExact
from libc.math cimport INFINITY
from libc.string cimport memmove

from tsi_core._kernel import WHYS

cdef tuple _WHYS = WHYS

cdef extern from "Python.h":
    long long PyLong_AsLongLongAndOverflow(object o, int *overflow) except? -1

#: Rows a book holds at most (answers of one instance kept in C).
LIMIT = 64
cdef Py_ssize_t _LIMIT = LIMIT


cdef inline bint _count(object value, long long *out) except -1:
    """Whether ``value`` is an int (not a subclass) in [0, 2**63), written to ``out``."""
    cdef int overflow = 0
    if not PyLong_CheckExact(value):
        return False
    out[0] = PyLong_AsLongLongAndOverflow(value, &overflow)
    return overflow == 0 and out[0] >= 0


cdef class AnswerBook:
    """Up to ``LIMIT`` kept answers of one instance, by request_id (see the module)."""

    def __cinit__(self):
        self.due = INFINITY

    def __dealloc__(self):
        cdef Py_ssize_t i
        for i in range(self.n):
            self._release(&self.answers[i])
        PyMem_Free(self.answers)
        PyMem_Free(self.hashes)

    cdef void _release(self, Answer *row) noexcept:
        Py_DECREF(<object>row.rid)
        Py_XDECREF(row.unit)
        Py_DECREF(<object>row.instance)

    cdef Py_ssize_t find(self, str rid) except -2:
        """The row of ``rid``, or -1."""
        cdef Py_hash_t h = hash(rid)
        cdef Py_ssize_t i
        cdef Answer *row
        for i in range(self.n):
            if self.hashes[i] == h:
                row = &self.answers[i]
                if row.rid == <PyObject*>rid or <str>row.rid == rid:
                    return i
        return -1

    cdef bint has(self, str rid) except -1:
        return self.find(rid) >= 0

    cdef bint keep(self, str kind, str rid, object ticket, object unit, double deadline) except -1:
        """Add the answer of ``rid``, which the caller knows is not in the book (its open
        ticket was found, or ``add`` looked); False (nothing done) when the book is full
        or a value is not one a row holds exactly (then the caller keeps an entry)."""
        cdef long long round_, arm, context = -1
        cdef unsigned char why
        if self.n >= _LIMIT or (kind != "s" and kind != "x"):
            return False
        if not isinstance(ticket, tuple) or len(ticket) != 7:
            return False
        cdef tuple fields = <tuple>ticket  # a Ticket is a tuple: its fields read in place
        if not (PyUnicode_CheckExact(fields[6]) and fields[6] in _WHYS):
            return False
        why = _WHYS.index(fields[6])
        instance, prob, weight_share = fields[0], fields[3], fields[4]
        if not (PyUnicode_CheckExact(instance) and _count(fields[1], &round_)
                and _count(fields[2], &arm)
                and PyFloat_CheckExact(prob) and PyFloat_CheckExact(weight_share)
                and (fields[5] is None or _count(fields[5], &context))
                and (unit is None or PyUnicode_CheckExact(unit))):
            return False
        if self.n == self.capacity:
            self._grow()
        cdef Answer *row = &self.answers[self.n]
        row.rid, row.unit, row.instance = <PyObject*>rid, <PyObject*>unit, <PyObject*>instance
        if unit is None:
            row.unit = NULL
        Py_INCREF(rid)
        Py_XINCREF(row.unit)
        Py_INCREF(instance)
        self.hashes[self.n] = hash(rid)
        row.round, row.arm, row.prob, row.weight_share = round_, arm, prob, weight_share
        row.context, row.why = context, why
        row.deadline = deadline
        row.kind = b"s"[0] if kind == "s" else b"x"[0]
        self.n += 1
        if deadline < self.due:
            self.due = deadline
        return True

    cdef int _grow(self) except -1:
        cdef Py_ssize_t capacity = min(max(2 * self.capacity, 2), _LIMIT)
        cdef Answer *grown = <Answer*>PyMem_Realloc(self.answers, capacity * sizeof(Answer))
        if grown == NULL:
            raise MemoryError()
        self.answers = grown
        cdef Py_hash_t *hashes = <Py_hash_t*>PyMem_Realloc(
            self.hashes, capacity * sizeof(Py_hash_t))
        if hashes == NULL:
            raise MemoryError()
        self.hashes, self.capacity = hashes, capacity
        return 0

    cdef object _item(self, Py_ssize_t i):
        """Row ``i`` as a compact tuple."""
        cdef Answer *row = &self.answers[i]
        ticket = (<object>row.instance, row.round, row.arm, row.prob, row.weight_share,
                  None if row.context < 0 else row.context, _WHYS[row.why])
        return ("s" if row.kind == b"s"[0] else "x", <object>row.rid, ticket,
                None if row.unit == NULL else <object>row.unit, row.deadline)

    cdef void _remove(self, Py_ssize_t i) noexcept:
        self._release(&self.answers[i])
        memmove(&self.answers[i], &self.answers[i + 1], (self.n - i - 1) * sizeof(Answer))
        memmove(&self.hashes[i], &self.hashes[i + 1], (self.n - i - 1) * sizeof(Py_hash_t))
        self.n -= 1

    cdef void _recount(self) noexcept:
        cdef Py_ssize_t i
        self.due = INFINITY
        for i in range(self.n):
            if self.answers[i].deadline < self.due:
                self.due = self.answers[i].deadline

    def add(self, str kind, str rid, object ticket, object unit, double deadline) -> bool:
        """Keep an answer (see ``keep``); False also when ``rid`` is in the book."""
        return self.find(rid) < 0 and self.keep(kind, rid, ticket, unit, deadline)

    def pop(self, str rid) -> tuple | None:
        """The answer of ``rid`` as a compact tuple, taken out of the book; None if absent."""
        cdef Py_ssize_t i = self.find(rid)
        if i < 0:
            return None
        item = self._item(i)
        self._remove(i)
        self._recount()
        return item

    def expire(self, double now) -> int:
        """Drop the answers whose deadline is ``now`` or earlier; how many."""
        cdef Py_ssize_t i = 0, dropped = 0
        if self.due > now:
            return 0
        while i < self.n:
            if self.answers[i].deadline <= now:
                self._remove(i)
                dropped += 1
            else:
                i += 1
        self._recount()
        return dropped

    def next_deadline(self) -> float | None:
        """The earliest deadline, or None when the book is empty."""
        return None if self.n == 0 else self.due

    def newest(self) -> float | None:
        """The latest deadline, or None when the book is empty."""
        cdef Py_ssize_t i
        if self.n == 0:
            return None
        latest = self.answers[0].deadline
        for i in range(1, self.n):
            if self.answers[i].deadline > latest:
                latest = self.answers[i].deadline
        return latest

    def __contains__(self, rid) -> bool:
        return PyUnicode_CheckExact(rid) and self.has(rid)

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return iter([self._item(i) for i in range(self.n)])

    def __reduce__(self):
        return _book_of, (tuple(self),)

    @staticmethod
    def of(items) -> AnswerBook | None:
        """A book of compact answers (kind, rid, ticket tuple, unit, deadline), or None if
        one of them is not an answer a row holds exactly, or they are too many."""
        cdef AnswerBook book = AnswerBook()
        for item in items:
            if not (isinstance(item, tuple) and len(item) == 5 and PyUnicode_CheckExact(item[1])
                    and PyUnicode_CheckExact(item[0]) and PyFloat_CheckExact(item[4])):
                return None
            kind, rid, ticket, unit, deadline = item
            if not book.add(kind, rid, ticket, unit, deadline):
                return None
        return book


def _book_of(items):
    """Unpickling: the book of ``items`` (a ticket pickled before ``Ticket.why`` has six
    fields: its arm was the bandit's)."""
    return AnswerBook.of(
        (kind, rid, ticket + ("bandit",) if len(ticket) == 6 else ticket, unit, deadline)
        for kind, rid, ticket, unit, deadline in items
    )
