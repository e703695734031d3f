# cython: language_level=3, boundscheck=False, wraparound=False
"""Heaps of deadlines, compiled: ``TimeHeap`` and the queue of wake-ups built on it.

Every event a shard serves moves its instance's deadlines (a ticket's, then its kept
answer's), and each shard call asks its queue for the earliest one. A ``heapq`` of
(time, key) tuples would make and compare a tuple per event and hold one per entry
(bench/RESULTS.md, "Figures behind the code": deadline heaps). Here a heap is two C
arrays (times, keys) and ties are broken by the key as tuples would be, so the order is
the same.

>>> q = DeadlineQueue()
>>> q.want("a", 5.0); q.want("b", 3.0); q.want("a", 4.0)   # a's earlier wish replaces 5.0
>>> q.due(4.5), q.next(), len(q)
(['b', 'a'], None, 0)
>>> h = TimeHeap(); h.push(2.0, "r2"); h.push(1.0, "r9"); h.push(1.0, "r1")
>>> h.first(), h.pop(), h.pop(), len(h)
((1.0, 'r1'), (1.0, 'r1'), (1.0, 'r9'), 1)
"""

from cpython.object cimport Py_LT, PyObject, PyObject_RichCompareBool
from cpython.ref cimport Py_DECREF, Py_INCREF
from cpython.mem cimport PyMem_Free, PyMem_Realloc


cdef class TimeHeap:
    """(time, key) pairs, earliest first and ties by key, as a ``heapq`` of tuples would
    pop them; each key held (a reference) while its pair is in the heap. An instance's
    entries by deadline (``Instance._deadlines``) and a queue's wake-ups."""

    def __dealloc__(self):
        self.clear()
        PyMem_Free(self._at)
        PyMem_Free(self._keys)

    def push(self, double at, str key) -> None:
        """Add (at, key)."""
        self.add(at, key)

    cdef int add(self, double at, str key) except -1:
        """``push``, for C callers."""
        cdef Py_ssize_t i, parent
        if self._size == self._capacity:
            self._resize(max(4, 2 * self._capacity))
        Py_INCREF(key)
        i = self._size
        self._size += 1
        while i > 0:  # sift up
            parent = (i - 1) >> 1
            if not _before(at, <PyObject*>key, self._at[parent], self._keys[parent]):
                break
            self._at[i], self._keys[i] = self._at[parent], self._keys[parent]
            i = parent
        self._at[i], self._keys[i] = at, <PyObject*>key
        return 0

    cpdef tuple pop(self):
        """Remove and return the first (time, key); IndexError if empty."""
        if not self._size:
            raise IndexError("pop from an empty TimeHeap")
        cdef double at = self._at[0]
        key = <object>self._keys[0]  # a new reference: the heap's own is given up below
        self.drop_first()
        return at, key

    cdef int drop_first(self) except -1:
        """Remove the first pair (there is one), its key let go."""
        Py_DECREF(<object>self._keys[0])
        self._size -= 1
        if self._size:
            self._sift_down(self._at[self._size], self._keys[self._size])
        if self._capacity > 16 and self._size < self._capacity // 4:
            self._resize(self._capacity // 2)  # give back what a burst took
        return 0

    cpdef tuple first(self):
        """The first (time, key), left in place; IndexError if empty."""
        if not self._size:
            raise IndexError("first of an empty TimeHeap")
        return self._at[0], <object>self._keys[0]

    cpdef double first_time(self) except? -1.0:
        """The first time; IndexError if empty."""
        if not self._size:
            raise IndexError("first of an empty TimeHeap")
        return self._at[0]

    cdef int clear(self) except -1:
        """Empty it, every key let go."""
        cdef Py_ssize_t i, n = self._size
        self._size = 0
        for i in range(n):
            Py_DECREF(<object>self._keys[i])
        return 0

    def __len__(self) -> int:
        return self._size

    def __iter__(self):
        """Its pairs, in the heap's order (not sorted)."""
        return iter([(self._at[i], <object>self._keys[i]) for i in range(self._size)])

    def __repr__(self) -> str:
        return f"TimeHeap({sorted(self)!r})"

    cdef int _sift_down(self, double at, PyObject* key) except -1:
        """Place (at, key) from the root down (the root's pair is already taken)."""
        cdef Py_ssize_t i = 0, child, n = self._size
        while True:
            child = 2 * i + 1
            if child >= n:
                break
            if child + 1 < n and _before(
                self._at[child + 1], self._keys[child + 1], self._at[child], self._keys[child]
            ):
                child += 1
            if not _before(self._at[child], self._keys[child], at, key):
                break
            self._at[i], self._keys[i] = self._at[child], self._keys[child]
            i = child
        self._at[i], self._keys[i] = at, key
        return 0

    cdef int _resize(self, Py_ssize_t capacity) except -1:
        cdef double* at = <double*>PyMem_Realloc(self._at, capacity * sizeof(double))
        if at is NULL:
            raise MemoryError()
        self._at = at
        cdef PyObject** keys = <PyObject**>PyMem_Realloc(self._keys, capacity * sizeof(PyObject*))
        if keys is NULL:
            raise MemoryError()
        self._keys = keys
        self._capacity = capacity
        return 0


cdef inline bint _before(double a, PyObject* ka, double b, PyObject* kb) except -1:
    """Whether (a, ka) comes before (b, kb): by time, then by key (as tuples compare)."""
    if a != b:
        return a < b
    return PyObject_RichCompareBool(<object>ka, <object>kb, Py_LT)


cdef class DeadlineQueue:
    """The next wake-up wished for each key; popped in time order, each key once."""

    cdef dict _wished  # the earliest wake-up queued per key
    cdef TimeHeap _heap  # the wishes, superseded ones included until they pass

    def __cinit__(self):
        self._wished = {}
        self._heap = TimeHeap()

    def want(self, str key, object at) -> None:
        """Wake ``key`` at ``at`` (None: nothing); an earlier wish than one queued wins,
        a later one waits for the earlier wake-up, whose handler wishes again."""
        if at is None:
            return
        cdef double when = at
        wished = self._wished.get(key)
        if wished is None or when < <double>wished:
            self._wished[key] = when
            self._heap.add(when, key)
            if self._heap._size > 2 * len(self._wished) + 64:
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
        cdef TimeHeap heap = self._heap
        while heap._size and heap._at[0] <= now:
            at, key = heap.pop()
            wished = self._wished.get(key)
            if wished is not None and <double>wished == <double>at:  # else woken already
                del self._wished[key]
                out.append((at, key))
        return out

    def next(self) -> float | None:
        """The earliest wake-up queued, or None."""
        cdef TimeHeap heap = self._heap
        while heap._size:
            wished = self._wished.get(<object>heap._keys[0])
            if wished is not None and <double>wished == heap._at[0]:
                return heap._at[0]
            heap.drop_first()  # superseded
        return None

    def __len__(self) -> int:
        return len(self._wished)

    @property
    def queued(self) -> int:
        """Entries in the heap, superseded wishes included (bounded: see ``_rebuild``)."""
        return self._heap._size

    cdef int _rebuild(self) except -1:
        """One heap entry per key again. Superseded wishes stay in the heap until they pass:
        a ticket answered long before its TTL leaves one behind, so at 10^5 tickets a second
        and a one-hour TTL the heap would grow to 10^8 entries without this."""
        heap = TimeHeap()
        for key, at in self._wished.items():
            heap.add(at, key)
        self._heap = heap
        return 0
