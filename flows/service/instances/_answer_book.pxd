# An instance's answers kept for retries, in one C array: see _answer_book.pyx.

from cpython.object cimport PyObject


cdef struct Answer:
    PyObject *rid  # a str
    PyObject *unit  # a str, or NULL for None
    PyObject *instance  # the ticket's instance (a str)
    long long round
    long long context  # the ticket's context; -1 for None
    long long arm
    double prob
    double weight_share
    double deadline
    char kind  # b"s" settled, b"x" expired (``instance.ANSWER_CODES``)
    unsigned char why  # the ticket's ``why``, its index in ``tsi_core._kernel.WHYS``


cdef class AnswerBook:
    cdef Answer *answers
    cdef Py_hash_t *hashes  # each row's ``hash``, side by side: what a scan reads
    cdef Py_ssize_t n, capacity
    cdef readonly double due  # the earliest deadline; infinity when empty

    cdef Py_ssize_t find(self, str rid) except -2
    cdef bint has(self, str rid) except -1
    cdef bint keep(self, str kind, str rid, object ticket, object unit, double deadline) except -1
    cdef void _release(self, Answer *row) noexcept
    cdef int _grow(self) except -1
    cdef object _item(self, Py_ssize_t i)
    cdef void _remove(self, Py_ssize_t i) noexcept
    cdef void _recount(self) noexcept
