# What a message's fields must be to be accepted, compiled: see fields.pyx.

from cpython.float cimport PyFloat_CheckExact
from cpython.long cimport PyLong_CheckExact
from cpython.unicode cimport PyUnicode_CheckExact
from libc.math cimport fabs, isfinite

cdef enum:
    ID_LIMIT = 256  # characters of an identifier (experiment, unit, request_id, arm name)
    SIZE_LIMIT = 65536  # bytes of a message

cdef extern from *:
    """
    #define TSI_LOSS_LIMIT 1e300
    """
    const double LOSS_LIMIT "TSI_LOSS_LIMIT"  # |loss| at most (a reward is a negated loss)


cdef inline bint identifier(object value) noexcept:
    """A non-empty string of at most ``ID_LIMIT`` characters."""
    return PyUnicode_CheckExact(value) and 0 < len(<str>value) <= ID_LIMIT


cdef inline bint index(object value) noexcept:
    """None, or an int >= 0 (never a bool)."""
    return value is None or (PyLong_CheckExact(value) and value >= 0)


cdef inline bint arm(object value) noexcept:
    """What a feedback may name its served arm by: its name or its index (or none)."""
    return identifier(value) or index(value)


cdef inline bint number(object value, double* out) except -1:
    """An int or a float (never a bool), its value in ``out``."""
    if PyFloat_CheckExact(value) or PyLong_CheckExact(value):
        out[0] = value
        return True
    return False


cdef inline bint loss_in_range(double value) noexcept:
    return isfinite(value) and fabs(value) <= LOSS_LIMIT


cdef inline bint time_in_window(double ts, double window, double now) noexcept:
    """A ``ts`` finite and within ``window`` seconds of ``now`` (the wall clock)."""
    return isfinite(ts) and fabs(ts - now) <= window


cdef inline bint size_accepted(Py_ssize_t size) noexcept:
    return size <= SIZE_LIMIT
