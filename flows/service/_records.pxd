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


# Field numbers of the events' layouts (``REQUEST``, ``FEEDBACK``, ``ORIGIN``,
# ``SELECTION`` in _records.pyx, each defined once there), in their fields' order.
cdef enum:
    UNIT = 1  # of a Request and a Feedback
    REQUEST_ID = 2
    CONTEXT = 3  # of a Request
    REQUEST_TS = 4
    REQUEST_ORIGIN = 6
    LOSS = 3  # of a Feedback
    ARM = 4
    FEEDBACK_TS = 5
    FEEDBACK_ORIGIN = 7
    SOURCE = 0  # of an Origin
    PARTITION = 1
    TIME = 3
    SELECTION_INSTANCE = 3  # of a Selection
