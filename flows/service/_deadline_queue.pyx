# cython: language_level=3, boundscheck=False, wraparound=False
"""The queue of wake-ups (``flows.service.deadlines.DeadlineQueue``), compiled.

Every event a shard serves moves its instance's next deadline (a ticket's, then its
answer's), and the shard tells its queue; each shard call then asks its queue for the
earliest one. In Python that was a heap of (time, key) tuples: a tuple and a float made
and compared per event, ~13% of the shard's instructions (callgrind of the fast lane).
Here the heap is two C arrays (times, keys) and ties are broken by the key as the tuples
did, so the order of wake-ups is the same.

>>> q = DeadlineQueue()
>>> q.want("a", 5.0); q.want("b", 3.0); q.want("a", 4.0)   # a's earlier wish replaces 5.0
>>> q.due(4.5), q.next(), len(q)
(['b', 'a'], None, 0)
"""

from cpython.object cimport Py_LT, PyObject, PyObject_RichCompareBool
from cpython.ref cimport Py_DECREF, Py_INCREF
from libc.stdlib cimport free, realloc


cdef class DeadlineQueue:
    """The next wake-up wished for each key; popped in time order, each key once."""

    cdef dict _wished  # the earliest wake-up queued per key
    cdef double* _at  # the heap: times, and the keys (owned references) beside them
    cdef PyObject** _keys
    cdef Py_ssize_t _size, _capacity

    def __cinit__(self):
        self._wished = {}

    def __dealloc__(self):
        cdef Py_ssize_t i
        for i in range(self._size):
            Py_DECREF(<object>self._keys[i])
        free(self._at)
        free(self._keys)

    def want(self, str key, object at) -> None:
        """Wake ``key`` at ``at`` (None: nothing); an earlier wish than one queued wins,
        a later one waits for the earlier wake-up, whose handler wishes again."""
        if at is None:
            return
        cdef double when = at
        wished = self._wished.get(key)
        if wished is None or when < <double>wished:
            self._wished[key] = when
            self._push(when, key)
            if self._size > 2 * len(self._wished) + 64:
                self._rebuild()

    def forget(self, str key) -> None:
        """No wake-up for ``key`` any more (its entry in the heap is dropped when it passes)."""
        self._wished.pop(key, None)

    def due(self, double now) -> list:
        """The keys whose wake-up is at or before ``now``, earliest first, each once."""
        return [key for _, key in self.due_times(now)]

    def due_times(self, double now) -> list:
        """(wake-up, key) of the keys ``due`` returns."""
        cdef list out = []
        cdef double at
        while self._size and self._at[0] <= now:
            at, key = self._pop()
            wished = self._wished.get(key)
            if wished is not None and <double>wished == at:  # else superseded: woken already
                del self._wished[key]
                out.append((at, key))
        return out

    def next(self) -> float | None:
        """The earliest wake-up queued, or None."""
        cdef PyObject* head
        while self._size:
            head = self._keys[0]
            wished = self._wished.get(<object>head)
            if wished is not None and <double>wished == self._at[0]:
                return self._at[0]
            self._pop()
        return None

    def __len__(self) -> int:
        return len(self._wished)

    @property
    def queued(self) -> int:
        """Entries in the heap, superseded wishes included (bounded: see ``_rebuild``)."""
        return self._size

    # -- the heap ------------------------------------------------------------------------

    cdef bint _less(self, double a, PyObject* ka, double b, PyObject* kb) except -1:
        """Whether (a, ka) comes before (b, kb): by time, then by key (as tuples compare)."""
        if a != b:
            return a < b
        return PyObject_RichCompareBool(<object>ka, <object>kb, Py_LT)

    cdef int _push(self, double at, object key) except -1:
        cdef Py_ssize_t i, parent
        if self._size == self._capacity:
            self._grow(max(64, 2 * self._capacity))
        Py_INCREF(key)
        i = self._size
        self._size += 1
        while i > 0:  # sift up
            parent = (i - 1) >> 1
            if not self._less(at, <PyObject*>key, self._at[parent], self._keys[parent]):
                break
            self._at[i], self._keys[i] = self._at[parent], self._keys[parent]
            i = parent
        self._at[i], self._keys[i] = at, <PyObject*>key
        return 0

    cdef tuple _pop(self):
        """The head as (time, key), the heap's last entry sifted down in its place."""
        cdef double at = self._at[0]
        key = <object>self._keys[0]  # a new reference: the heap's own is given up below
        Py_DECREF(key)
        self._size -= 1
        if self._size:
            self._sift_down(self._at[self._size], self._keys[self._size])
        return at, key

    cdef int _sift_down(self, double at, PyObject* key) except -1:
        """Place (at, key) from the root down (the root's entry is already taken)."""
        cdef Py_ssize_t i = 0, child, n = self._size
        while True:
            child = 2 * i + 1
            if child >= n:
                break
            if child + 1 < n and self._less(
                self._at[child + 1], self._keys[child + 1], self._at[child], self._keys[child]
            ):
                child += 1
            if not self._less(self._at[child], self._keys[child], at, key):
                break
            self._at[i], self._keys[i] = self._at[child], self._keys[child]
            i = child
        self._at[i], self._keys[i] = at, key
        return 0

    cdef int _grow(self, Py_ssize_t capacity) except -1:
        cdef double* at = <double*>realloc(self._at, capacity * sizeof(double))
        if at is NULL:
            raise MemoryError()
        self._at = at
        cdef PyObject** keys = <PyObject**>realloc(self._keys, capacity * sizeof(PyObject*))
        if keys is NULL:
            raise MemoryError()
        self._keys = keys
        self._capacity = capacity
        return 0

    cdef int _rebuild(self):
        """One heap entry per key again. Superseded wishes stay in the heap until they pass:
        a ticket answered long before its TTL left one behind, so at 10^5 tickets a second
        and a one-hour TTL the heap would grow to 10^8 entries without this."""
        cdef Py_ssize_t i
        for i in range(self._size):
            Py_DECREF(<object>self._keys[i])
        self._size = 0
        for key, at in self._wished.items():
            self._push(at, key)
        if self._capacity > 4 * self._size + 256:  # give back what a burst took
            self._grow(2 * self._size + 64)
        return 0
