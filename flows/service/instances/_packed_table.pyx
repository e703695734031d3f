# cython: language_level=3, boundscheck=False, wraparound=False
"""Packed bandits by instance key, held in C: what a shard's idle instances cost.

A Python dict of ``str -> bytes`` pays, per idle instance, a key object, a bytes object
(its header and malloc's rounding around the packed bandit) and a dict slot at its load
factor (bench/RESULTS.md, "Figures behind the code": resting tables). Here each entry is
one record in an arena, ``<key length><value length><key><value>`` (the lengths as
varints: 3 B for a short key and a value under 2^14 bytes), and one 8-byte slot of an
open-addressing index (24 bits of the key's hash beside a 40-bit offset): about 20 B
beyond its own bytes at the index's load factor. Removed and replaced records are holes
in the arena, squeezed out when they reach a quarter of it. The table holds what ``flows.service.instances.resting.Resting`` kept
in its dict; it is compared with a dict by a property test.

A timed table (``PackedTable(timed=True)``, instances waiting with one ticket) also keeps
each record's deadline (8 B before its lengths) and a heap of (deadline, 32-bit hash),
12 B a record: ``due(now)`` finds the records whose deadline has come by probing their hashes,
so a waiting instance costs no Python object at all. Entries of the heap left behind by
records removed or replaced are dropped when they pass, or when they outnumber the
records (the heap is rebuilt from them). The index and the heap shrink as a table
empties (instances waiting on their answers move on).

>>> table = PackedTable()
>>> table["home:u1"] = b"\\x01\\x02"; table["home:u2"] = b"x"
>>> "home:u1" in table, len(table), table.pop("home:u1"), table.pop("home:u1")
(True, 2, b'\\x01\\x02', None)
>>> sorted(table.items())
[('home:u2', b'x')]
>>> waiting = PackedTable(timed=True)
>>> waiting.put("home:u1", b"t1", 5.0); waiting.put("home:u2", b"t2", 3.0)
>>> waiting.next_deadline(), waiting.due(4.0), waiting.due(4.0)
(3.0, [(3.0, 'home:u2')], [])

The varints of the records are also for their users' own prefixes (``varint``,
``read_varint``):

>>> varint(300), read_varint(varint(300) + b"rest")
(b'\\xac\\x02', (300, 2))
"""

from cpython.bytes cimport (
    PyBytes_AS_STRING,
    PyBytes_CheckExact,
    PyBytes_FromStringAndSize,
    PyBytes_GET_SIZE,
)
from cpython.unicode cimport PyUnicode_AsEncodedString, PyUnicode_CheckExact, PyUnicode_DecodeUTF8
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcmp, memcpy


# An index slot: EMPTY, REMOVED, or a record's (offset + 2) in its low 40 bits below
# 24 bits of its key's hash (the hash's top bits: its low ones choose the slot).
cdef uint64_t EMPTY = 0
cdef uint64_t REMOVED = 1
cdef uint64_t OFFSET_BITS = (<uint64_t>1 << 40) - 1
cdef int64_t LARGEST = (<int64_t>1 << 40) - 3  # the largest arena an index slot can address


cdef inline bint _live(uint64_t slot) noexcept:
    return slot > REMOVED


cdef inline int64_t _offset(uint64_t slot) noexcept:
    return <int64_t>(slot & OFFSET_BITS) - 2


cdef inline uint64_t _tag(uint32_t h) noexcept:
    return <uint64_t>(h >> 8) << 40


cdef inline const unsigned char* _read_varint(const unsigned char* p, uint32_t* out) noexcept:
    """The varint (LEB128) at ``p`` in ``out``; the byte after it."""
    cdef uint32_t value = 0, shift = 0
    while p[0] & 0x80:
        value |= <uint32_t>(p[0] & 0x7F) << shift
        shift += 7
        p += 1
    out[0] = value | (<uint32_t>p[0] << shift)
    return p + 1


cdef inline unsigned char* _write_varint(unsigned char* p, uint32_t value) noexcept:
    while value >= 0x80:
        p[0] = <unsigned char>(value & 0x7F) | 0x80
        value >>= 7
        p += 1
    p[0] = <unsigned char>value
    return p + 1


cdef inline int64_t _varint_size(uint32_t value) noexcept:
    cdef int64_t size = 1
    while value >= 0x80:
        value >>= 7
        size += 1
    return size


def varint(uint32_t value) -> bytes:
    """``value`` as a varint (LEB128): one byte below 128, at most five."""
    cdef unsigned char out[5]
    cdef unsigned char* end = _write_varint(out, value)
    return PyBytes_FromStringAndSize(<char*>out, end - out)


def read_varint(bytes data) -> tuple:
    """(the varint that starts ``data``, its length in bytes); ValueError without one."""
    cdef Py_ssize_t n = PyBytes_GET_SIZE(data), size = 0
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef uint32_t value
    while size < n and size < 4 and p[size] & 0x80:
        size += 1
    if size >= n or p[size] & 0x80:
        raise ValueError(f"no varint starts {data[:8]!r}")
    _read_varint(p, &value)
    return value, size + 1


cdef inline bytes _utf8(object key):
    """A key's bytes (lone surrogates kept, as a str may hold them)."""
    if not PyUnicode_CheckExact(key):
        raise TypeError(f"a packed table's keys are str, not {type(key).__name__}")
    return PyUnicode_AsEncodedString(key, "utf-8", "surrogatepass")


cdef inline uint32_t _hash(const char* data, Py_ssize_t n) noexcept:
    """FNV-1a over the key's UTF-8 bytes (stable; never 0, which would look empty)."""
    cdef uint32_t h = 2166136261u
    cdef Py_ssize_t i
    for i in range(n):
        h = (h ^ <unsigned char>data[i]) * 16777619u
    return h | 1u


cdef class PackedTable:
    """``str -> bytes``, as a dict of them would be, in far fewer bytes (see the module)."""

    cdef char* arena
    cdef int64_t used, capacity, holes
    cdef uint64_t* index
    cdef int64_t slots, count, removed  # index slots, entries, slots marked removed
    cdef bint timed
    cdef int64_t head  # bytes before a record's lengths: its deadline's 8 when timed
    cdef double* heap_at
    cdef uint32_t* heap_hash
    cdef int64_t heap_len, heap_cap

    def __cinit__(self, bint timed=False):
        self.arena = NULL
        self.index = NULL
        self.heap_at = NULL
        self.heap_hash = NULL
        self.timed = timed
        self.head = sizeof(double) if timed else 0
        self._reindex(8)

    def __dealloc__(self):
        free(self.arena)
        free(self.index)
        free(self.heap_at)
        free(self.heap_hash)

    def __len__(self) -> int:
        return self.count

    def __contains__(self, key) -> bool:
        cdef bytes raw = _utf8(key)
        cdef Py_ssize_t n = PyBytes_GET_SIZE(raw)
        cdef const char* data = PyBytes_AS_STRING(raw)
        return self._find(data, n, _hash(data, n)) >= 0

    def __setitem__(self, key, value) -> None:
        if self.timed:
            raise TypeError("a timed table takes put(key, value, deadline)")
        self._store(key, value, 0.0)

    def put(self, key, value, double deadline) -> None:
        """Hold ``value`` under ``key`` until ``deadline`` (a timed table)."""
        if not self.timed:
            raise TypeError("put(key, value, deadline) is for a timed table")
        if deadline != deadline:
            raise ValueError(f"a deadline must be a number, not {deadline!r}")
        self._push(deadline, <uint32_t>self._store(key, value, deadline))

    def pop(self, key, default=None):
        """The bytes of ``key``, no longer held; ``default`` if it is not held."""
        cdef bytes raw = _utf8(key)
        cdef Py_ssize_t n = PyBytes_GET_SIZE(raw)
        cdef const char* data = PyBytes_AS_STRING(raw)
        cdef int64_t slot = self._find(data, n, _hash(data, n))
        if slot < 0:
            return default
        value = self._value(_offset(self.index[slot]))
        self._drop(slot)
        self._squeeze_if_holey()
        if self.slots > 64 and self.count * 8 < self.slots:  # emptied: a smaller index
            self._reindex(self.count * 2 + 2)
        return value

    def due(self, double now) -> list:
        """(deadline, key) of every record whose deadline is at or before ``now``, earliest
        first (then by key); they stay held until popped."""
        cdef int64_t mask = self.slots - 1, slot
        cdef uint32_t h
        cdef uint64_t tag, held
        cdef double deadline
        found = {}
        while self.heap_len and self.heap_at[0] <= now:
            h = self.heap_hash[0]
            self._pop_heap()
            slot, tag = h & mask, _tag(h)
            held = self.index[slot]
            while held != EMPTY:
                if _live(held) and held & ~OFFSET_BITS == tag:
                    deadline = self._deadline(_offset(held))
                    if deadline <= now:
                        found[self._key(_offset(held))] = deadline
                slot = (slot + 1) & mask
                held = self.index[slot]
        return sorted([(deadline, key) for key, deadline in found.items()])

    def next_deadline(self):
        """The earliest deadline held (or one of a record since removed), or None."""
        return self.heap_at[0] if self.heap_len else None

    def __iter__(self):
        cdef int64_t slot
        return iter([self._key(_offset(self.index[slot])) for slot in range(self.slots)
                     if _live(self.index[slot])])

    def items(self) -> list:
        """Every (key, bytes), in no particular order."""
        cdef int64_t slot, at
        out = []
        for slot in range(self.slots):
            if _live(self.index[slot]):
                at = _offset(self.index[slot])
                out.append((self._key(at), self._value(at)))
        return out

    def nbytes(self) -> int:
        """Bytes allocated: the arena, the index and the heap."""
        index = self.slots * sizeof(uint64_t)
        return self.capacity + index + self.heap_cap * (sizeof(double) + sizeof(uint32_t))

    # ------------------------------------------------------------------ internals
    cdef int64_t _store(self, object key, object value, double deadline) except -1:
        """Hold ``value`` under ``key``; the key's hash."""
        if not PyBytes_CheckExact(value):
            raise TypeError(f"a packed table holds bytes, not {type(value).__name__}")
        cdef bytes raw = _utf8(key)
        cdef Py_ssize_t n = PyBytes_GET_SIZE(raw)
        cdef const char* data = PyBytes_AS_STRING(raw)
        cdef uint32_t h = _hash(data, n)
        cdef int64_t slot = self._find(data, n, h)
        if slot >= 0:
            self._drop(slot)
            self._squeeze_if_holey()
        if (self.count + self.removed + 1) * 10 > self.slots * 7:
            self._reindex(max(8, self.count * 2 + 2))
        cdef int64_t at = self._append(data, n, value, deadline)
        slot = self._free_slot(h)
        if self.index[slot] == REMOVED:
            self.removed -= 1
        self.index[slot] = _tag(h) | <uint64_t>(at + 2)
        self.count += 1
        return h

    cdef int64_t _find(self, const char* data, Py_ssize_t n, uint32_t h) noexcept:
        """The slot holding the key, or -1."""
        cdef int64_t mask = self.slots - 1, slot = h & mask
        cdef uint64_t tag = _tag(h), held
        cdef uint32_t key_n, value_n
        cdef const char* key
        while True:
            held = self.index[slot]
            if held == EMPTY:
                return -1
            if _live(held) and held & ~OFFSET_BITS == tag:
                key = self._fields(_offset(held), &key_n, &value_n)
                if key_n == n and memcmp(key, data, n) == 0:
                    return slot
            slot = (slot + 1) & mask

    cdef int64_t _free_slot(self, uint32_t h) noexcept:
        cdef int64_t mask = self.slots - 1, slot = h & mask
        while _live(self.index[slot]):
            slot = (slot + 1) & mask
        return slot

    cdef inline const char* _fields(self, int64_t at, uint32_t* key_n,
                                    uint32_t* value_n) noexcept:
        """The record at ``at``: its key's first byte; its two lengths set."""
        cdef const unsigned char* p = <const unsigned char*>(self.arena + at + self.head)
        return <const char*>_read_varint(_read_varint(p, key_n), value_n)

    cdef inline int64_t _size(self, int64_t at) noexcept:
        cdef uint32_t n, m
        cdef const char* key = self._fields(at, &n, &m)
        return (key - (self.arena + at)) + n + m

    cdef inline double _deadline(self, int64_t at) noexcept:
        cdef double deadline
        memcpy(&deadline, self.arena + at, sizeof(double))
        return deadline

    cdef object _key(self, int64_t at):
        cdef uint32_t n, m
        cdef const char* key = self._fields(at, &n, &m)
        return PyUnicode_DecodeUTF8(key, n, "surrogatepass")

    cdef object _value(self, int64_t at):
        cdef uint32_t n, m
        cdef const char* key = self._fields(at, &n, &m)
        return PyBytes_FromStringAndSize(key + n, m)

    cdef void _drop(self, int64_t slot) noexcept:
        self.holes += self._size(_offset(self.index[slot]))
        self.index[slot] = REMOVED
        self.removed += 1
        self.count -= 1

    cdef int64_t _append(self, const char* key, Py_ssize_t n, bytes value,
                         double deadline) except -1:
        cdef Py_ssize_t m = PyBytes_GET_SIZE(value)
        if n > 0xFFFFFFFF or m > 0xFFFFFFFF:
            raise ValueError(f"a packed table's records are under 4 GB, not {n} + {m} bytes")
        cdef int64_t at = self.used
        cdef int64_t need = at + self.head + _varint_size(n) + _varint_size(m) + n + m
        if need > self.capacity:
            self._grow(max(need, self.capacity + self.capacity // 8 + 4096))
        if self.timed:
            memcpy(self.arena + at, &deadline, sizeof(double))
        cdef unsigned char* p = <unsigned char*>(self.arena + at + self.head)
        p = _write_varint(_write_varint(p, <uint32_t>n), <uint32_t>m)
        memcpy(p, key, n)
        memcpy(p + n, PyBytes_AS_STRING(value), m)
        self.used = need
        return at

    cdef int _grow(self, int64_t capacity) except -1:
        if capacity > LARGEST:
            raise MemoryError(f"a packed table holds at most {LARGEST} bytes, not {capacity}")
        cdef char* grown = <char*>realloc(self.arena, capacity)
        if grown == NULL:
            raise MemoryError(f"a packed table of {capacity} bytes")
        self.arena, self.capacity = grown, capacity
        return 0

    cdef int _reindex(self, int64_t want) except -1:
        """A new index of at least ``want`` slots (a power of two) over the live records."""
        cdef int64_t slots = 8, slot, new_slot
        while slots < want:
            slots *= 2
        cdef uint64_t* index = <uint64_t*>calloc(slots, sizeof(uint64_t))  # all EMPTY
        if index == NULL:
            raise MemoryError(f"a packed table index of {slots} slots")
        for slot in range(self.slots if self.index != NULL else 0):
            if _live(self.index[slot]):
                new_slot = self._hash_at(_offset(self.index[slot])) & (slots - 1)
                while index[new_slot] != EMPTY:
                    new_slot = (new_slot + 1) & (slots - 1)
                index[new_slot] = self.index[slot]
        free(self.index)
        self.index, self.slots, self.removed = index, slots, 0
        return 0

    cdef inline uint32_t _hash_at(self, int64_t at) noexcept:
        """The hash of the key of the record at ``at`` (the index keeps only its top bits)."""
        cdef uint32_t n, m
        cdef const char* key = self._fields(at, &n, &m)
        return _hash(key, n)

    cdef int _squeeze_if_holey(self) except -1:
        if self.holes > 4096 and self.holes * 4 > self.used:
            self._squeeze()
        return 0

    cdef int _squeeze(self) except -1:
        """Copy the live records into a new arena, without the holes."""
        cdef int64_t size = self.used - self.holes, slot, at, length, used = 0
        cdef char* arena = <char*>malloc(max(size, 1))
        if arena == NULL:
            raise MemoryError(f"a packed table of {size} bytes")
        for slot in range(self.slots):
            if _live(self.index[slot]):
                at = _offset(self.index[slot])
                length = self._size(at)
                memcpy(arena + used, self.arena + at, length)
                self.index[slot] = (self.index[slot] & ~OFFSET_BITS) | <uint64_t>(used + 2)
                used += length
        free(self.arena)
        self.arena, self.capacity, self.used, self.holes = arena, max(size, 1), used, 0
        return 0

    # ------------------------------------------------------------------ the heap
    cdef int _push(self, double at, uint32_t h) except -1:
        if self.heap_len > 2 * self.count + 64:
            self._rebuild_heap()  # mostly entries of records gone: start again from these
        if self.heap_len == self.heap_cap:
            self._grow_heap(max(64, self.heap_cap * 2))
        cdef int64_t i = self.heap_len, parent
        self.heap_len += 1
        while i > 0:
            parent = (i - 1) // 2
            if self.heap_at[parent] <= at:
                break
            self.heap_at[i], self.heap_hash[i] = self.heap_at[parent], self.heap_hash[parent]
            i = parent
        self.heap_at[i], self.heap_hash[i] = at, h
        return 0

    cdef int _pop_heap(self) except -1:
        self.heap_len -= 1
        if self.heap_len:
            self._sift_down(0, self.heap_at[self.heap_len], self.heap_hash[self.heap_len])
        if self.heap_cap > 64 and self.heap_len * 4 < self.heap_cap:  # emptied: smaller
            self._grow_heap(self.heap_cap // 2)
        return 0

    cdef void _sift_down(self, int64_t i, double at, uint32_t h) noexcept:
        cdef int64_t child, n = self.heap_len
        while True:
            child = 2 * i + 1
            if child >= n:
                break
            if child + 1 < n and self.heap_at[child + 1] < self.heap_at[child]:
                child += 1
            if self.heap_at[child] >= at:
                break
            self.heap_at[i], self.heap_hash[i] = self.heap_at[child], self.heap_hash[child]
            i = child
        self.heap_at[i], self.heap_hash[i] = at, h

    cdef int _grow_heap(self, int64_t cap) except -1:
        cdef double* at = <double*>realloc(self.heap_at, cap * sizeof(double))
        if at == NULL:
            raise MemoryError(f"a deadline heap of {cap} entries")
        self.heap_at = at
        cdef uint32_t* h = <uint32_t*>realloc(self.heap_hash, cap * sizeof(uint32_t))
        if h == NULL:
            raise MemoryError(f"a deadline heap of {cap} entries")
        self.heap_hash, self.heap_cap = h, cap
        return 0

    cdef int _rebuild_heap(self) except -1:
        """The heap of the records held, one entry each."""
        cdef int64_t slot, at, i
        self.heap_len = 0
        if self.heap_cap < self.count + 64:
            self._grow_heap(self.count + 64)
        for slot in range(self.slots):
            if _live(self.index[slot]):
                at = _offset(self.index[slot])
                self.heap_at[self.heap_len] = self._deadline(at)
                self.heap_hash[self.heap_len] = self._hash_at(at)
                self.heap_len += 1
        for i in range(self.heap_len // 2 - 1, -1, -1):
            self._sift_down(i, self.heap_at[i], self.heap_hash[i])
        return 0
