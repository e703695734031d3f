# The service's records (slots dataclasses) built and kept from compiled code: see _records.pyx.

cdef enum:
    MAX_FIELDS = 16  # fields of a record a Layout reads

cdef class Layout:
    cdef readonly type cls
    cdef readonly tuple slots
    cdef tuple names
    cdef Py_ssize_t offsets[MAX_FIELDS]

    cdef object built(self, tuple values)
    cdef object get(self, object record, Py_ssize_t i)


cdef object kept(object record)
