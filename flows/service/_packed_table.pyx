# cython: language_level=3, boundscheck=False, wraparound=False
"""Packed bandits by instance key, held in C: what a shard's idle instances cost.

A Python dict of ``str -> bytes`` pays, per idle instance, a key object (~61 B for a
12-character key), a bytes object (33 B of header and malloc's rounding around the
~128 B of a packed 10-arm bandit) and a dict slot (~40 B at its load factor). Here each
entry is one record in an arena, ``<u32 key length><u32 value length><key><value>``, and
one slot of an open-addressing index (a 32-bit hash and a 64-bit offset): about 20 B
beyond its own bytes. Removed and replaced records are holes in the arena, squeezed out
when they reach a quarter of it. The table holds what ``flows.service.resting.Resting`` kept
in its dict; it is compared with a dict by a property test.

>>> table = PackedTable()
>>> table["home:u1"] = b"\\x01\\x02"; table["home:u2"] = b"x"
>>> "home:u1" in table, len(table), table.pop("home:u1"), table.pop("home:u1")
(True, 2, b'\\x01\\x02', None)
>>> sorted(table.items())
[('home:u2', b'x')]
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_AsEncodedString, PyUnicode_DecodeUTF8
from libc.stdint cimport int64_t, uint32_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcmp, memcpy


cdef enum:
    EMPTY = -1
    REMOVED = -2
    HEAD = 8  # the two u32 lengths before a record's bytes


cdef inline bytes _utf8(object key):
    """A key's bytes (lone surrogates kept, as a str may hold them)."""
    if type(key) is not str:
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
    cdef uint32_t* hashes
    cdef int64_t* offsets
    cdef int64_t slots, count, removed  # index slots, entries, slots marked removed

    def __cinit__(self):
        self.arena = NULL
        self.hashes = NULL
        self.offsets = NULL
        self._reindex(8)

    def __dealloc__(self):
        free(self.arena)
        free(self.hashes)
        free(self.offsets)

    def __len__(self) -> int:
        return self.count

    def __contains__(self, key) -> bool:
        cdef bytes raw = _utf8(key)
        cdef Py_ssize_t n = PyBytes_GET_SIZE(raw)
        cdef const char* data = PyBytes_AS_STRING(raw)
        return self._find(data, n, _hash(data, n)) >= 0

    def __setitem__(self, key, value) -> None:
        if type(value) is not bytes:
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
        cdef int64_t at = self._append(data, n, value)
        slot = self._free_slot(h)
        if self.offsets[slot] == REMOVED:
            self.removed -= 1
        self.hashes[slot] = h
        self.offsets[slot] = at
        self.count += 1

    def pop(self, key, default=None):
        """The bytes of ``key``, no longer held; ``default`` if it is not held."""
        cdef bytes raw = _utf8(key)
        cdef Py_ssize_t n = PyBytes_GET_SIZE(raw)
        cdef const char* data = PyBytes_AS_STRING(raw)
        cdef int64_t slot = self._find(data, n, _hash(data, n))
        if slot < 0:
            return default
        value = self._value(self.offsets[slot])
        self._drop(slot)
        self._squeeze_if_holey()
        return value

    def __iter__(self):
        return iter([key for key, _ in self.items()])

    def items(self) -> list:
        """Every (key, bytes), in no particular order."""
        cdef int64_t slot, at
        cdef uint32_t* lengths
        out = []
        for slot in range(self.slots):
            at = self.offsets[slot]
            if at >= 0:
                lengths = <uint32_t*>(self.arena + at)
                key = PyUnicode_DecodeUTF8(self.arena + at + HEAD, lengths[0], "surrogatepass")
                out.append((key, self._value(at)))
        return out

    def nbytes(self) -> int:
        """Bytes allocated: the arena and the index."""
        return self.capacity + self.slots * (sizeof(uint32_t) + sizeof(int64_t))

    # ------------------------------------------------------------------ internals
    cdef int64_t _find(self, const char* data, Py_ssize_t n, uint32_t h) noexcept:
        """The slot holding the key, or -1."""
        cdef int64_t mask = self.slots - 1, slot = h & mask, at
        cdef uint32_t* lengths
        while True:
            at = self.offsets[slot]
            if at == EMPTY:
                return -1
            if at >= 0 and self.hashes[slot] == h:
                lengths = <uint32_t*>(self.arena + at)
                if lengths[0] == n and memcmp(self.arena + at + HEAD, data, n) == 0:
                    return slot
            slot = (slot + 1) & mask

    cdef int64_t _free_slot(self, uint32_t h) noexcept:
        cdef int64_t mask = self.slots - 1, slot = h & mask
        while self.offsets[slot] >= 0:
            slot = (slot + 1) & mask
        return slot

    cdef object _value(self, int64_t at):
        cdef uint32_t* lengths = <uint32_t*>(self.arena + at)
        return PyBytes_FromStringAndSize(self.arena + at + HEAD + lengths[0], lengths[1])

    cdef void _drop(self, int64_t slot) noexcept:
        cdef uint32_t* lengths = <uint32_t*>(self.arena + self.offsets[slot])
        self.holes += HEAD + lengths[0] + lengths[1]
        self.offsets[slot] = REMOVED
        self.removed += 1
        self.count -= 1

    cdef int64_t _append(self, const char* key, Py_ssize_t n, bytes value) except -1:
        cdef Py_ssize_t m = PyBytes_GET_SIZE(value)
        cdef int64_t need = self.used + HEAD + n + m, at = self.used
        if need > self.capacity:
            self._grow(max(need, self.capacity + self.capacity // 4 + 4096))
        cdef uint32_t* lengths = <uint32_t*>(self.arena + at)
        lengths[0] = <uint32_t>n
        lengths[1] = <uint32_t>m
        memcpy(self.arena + at + HEAD, key, n)
        memcpy(self.arena + at + HEAD + n, PyBytes_AS_STRING(value), m)
        self.used = need
        return at

    cdef int _grow(self, int64_t capacity) except -1:
        cdef char* grown = <char*>realloc(self.arena, capacity)
        if grown == NULL:
            raise MemoryError(f"a packed table of {capacity} bytes")
        self.arena, self.capacity = grown, capacity
        return 0

    cdef int _reindex(self, int64_t want) except -1:
        """A new index of at least ``want`` slots (a power of two) over the live records."""
        cdef int64_t slots = 8, slot, at, new_slot
        while slots < want:
            slots *= 2
        cdef uint32_t* hashes = <uint32_t*>malloc(slots * sizeof(uint32_t))
        cdef int64_t* offsets = <int64_t*>malloc(slots * sizeof(int64_t))
        if hashes == NULL or offsets == NULL:
            free(hashes)
            free(offsets)
            raise MemoryError(f"a packed table index of {slots} slots")
        for slot in range(slots):
            offsets[slot] = EMPTY
        for slot in range(self.slots if self.offsets != NULL else 0):
            at = self.offsets[slot]
            if at >= 0:
                new_slot = self.hashes[slot] & (slots - 1)
                while offsets[new_slot] != EMPTY:
                    new_slot = (new_slot + 1) & (slots - 1)
                hashes[new_slot] = self.hashes[slot]
                offsets[new_slot] = at
        free(self.hashes)
        free(self.offsets)
        self.hashes, self.offsets, self.slots, self.removed = hashes, offsets, slots, 0
        return 0

    cdef int _squeeze_if_holey(self) except -1:
        if self.holes > 4096 and self.holes * 4 > self.used:
            self._squeeze()
        return 0

    cdef int _squeeze(self) except -1:
        """Copy the live records into a new arena, without the holes."""
        cdef int64_t size = self.used - self.holes, slot, at, length, used = 0
        cdef char* arena = <char*>malloc(max(size, 1))
        cdef uint32_t* lengths
        if arena == NULL:
            raise MemoryError(f"a packed table of {size} bytes")
        for slot in range(self.slots):
            at = self.offsets[slot]
            if at >= 0:
                lengths = <uint32_t*>(self.arena + at)
                length = HEAD + lengths[0] + lengths[1]
                memcpy(arena + used, self.arena + at, length)
                self.offsets[slot] = used
                used += length
        free(self.arena)
        self.arena, self.capacity, self.used, self.holes = arena, max(size, 1), used, 0
        return 0
