cimport cython
from cpython.object cimport PyObject


@cython.final
cdef class TimeHeap:
    cdef double* _at  # the heap: times, and the keys (owned references) beside them
    cdef PyObject** _keys
    cdef Py_ssize_t _size, _capacity

    cdef int add(self, double at, str key) except -1
    cpdef tuple pop(self)
    cpdef tuple first(self)
    cpdef double first_time(self) except? -1.0
    cdef int drop_first(self) except -1
    cdef int clear(self) except -1
    cdef int _sift_down(self, double at, PyObject* key) except -1
    cdef int _resize(self, Py_ssize_t capacity) except -1
