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


cdef extern from *:
    """
    static inline PyObject *tsi_slot_at(PyObject *record, Py_ssize_t offset) {
        return *(PyObject **)((char *)record + offset);
    }
    """
    void *_slot_at "tsi_slot_at" (object record, Py_ssize_t offset) noexcept


cdef inline object field(Layout layout, object record, Py_ssize_t i):
    """``layout.get(record, i)`` compiled into the module that reads it: the slot read
    where the caller is, the call only for another class or an empty slot (its error)."""
    cdef void *value
    if type(record) is layout.cls:
        value = _slot_at(record, layout.offsets[i])
        if value != NULL:
            return <object>value
    return layout.get(record, i)


cdef object kept(object record)


# Field numbers of the events' layouts (``REQUEST``, ``FEEDBACK``, ``ORIGIN``,
# ``SELECTION`` in _records.pyx, each defined once there), in their fields' order.
cdef enum:
    UNIT = 1  # of a Request and a Feedback
    REQUEST_ID = 2
    CONTEXT = 3  # of a Request
    REQUEST_TS = 4
    REQUEST_ORIGIN = 6
    ELIGIBLE = 7
    LOSS = 3  # of a Feedback
    ARM = 4
    FEEDBACK_TS = 5
    FEEDBACK_RAW = 6
    FEEDBACK_ORIGIN = 7
    FEEDBACK_GUARDRAILS = 8
    SOURCE = 0  # of an Origin
    PARTITION = 1
    TIME = 3
    SELECTION_INSTANCE = 3  # of a Selection
    SELECTION_ARM = 4
    SELECTION_WHY = 8
