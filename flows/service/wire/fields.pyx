# cython: language_level=3
"""What a message's fields must be to be accepted: one body, compiled, which both the
parser (``events.py``, which also says why a refused field is refused) and the
parser's compiled lane (``_parse.pyx``, which only decides) call.

>>> identifier_ok("r1"), identifier_ok(""), identifier_ok(7)
(True, False, False)
>>> index_ok(None), index_ok(3), index_ok(-1), index_ok(True)
(True, True, False, False)
>>> loss_ok(2.5), loss_ok(float("nan")), loss_ok(1e301)
(True, False, False)
>>> time_ok(100.0, 10.0, now=105.0), time_ok(100.0, 10.0, now=111.0)
(True, False)
"""

MAX_ID_LENGTH = ID_LIMIT
MAX_MESSAGE_BYTES = SIZE_LIMIT
MAX_ABS_LOSS = LOSS_LIMIT


def identifier_ok(value) -> bool:
    """A non-empty string of at most ``MAX_ID_LENGTH`` characters."""
    return identifier(value)


def index_ok(value) -> bool:
    """None, or an int >= 0 (never a bool)."""
    return index(value)


def arm_ok(value) -> bool:
    """An arm's name (an identifier) or index, or none."""
    return arm(value)


def number_ok(value) -> bool:
    """An int or a float, never a bool."""
    cdef double ignored
    return number(value, &ignored)


def loss_ok(double value) -> bool:
    """Finite, and at most ``MAX_ABS_LOSS`` in absolute value."""
    return loss_in_range(value)


def time_ok(double ts, double window, double now) -> bool:
    """Finite and within ``window`` seconds of ``now``."""
    return time_in_window(ts, window, now)


def size_ok(Py_ssize_t size) -> bool:
    """At most ``MAX_MESSAGE_BYTES``."""
    return size_accepted(size)
