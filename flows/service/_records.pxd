# The service's records (slots dataclasses) built and kept from compiled code: see _records.pyx.

cdef class Layout:
    cdef readonly type cls
    cdef readonly tuple slots

    cdef object built(self, tuple values)


cdef object kept(object record)
