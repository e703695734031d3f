# cython: language_level=3, boundscheck=False, wraparound=False
"""Parsing and routing of message batches, compiled: the fast lane of
``flows.service.dataflow.parse_and_route``.

``flows.service.wire.events`` is the reference. This module accepts only what it can decide
exactly and hands everything else to it: a message takes the lane when it is ``bytes``
within the size limit, orjson reads it as an object whose keys are all known to its
parser, each holding a plain valid value, and it names a known experiment (with its unit
when the experiment keeps one bandit per unit; a request's ``eligible`` arms or named
``context`` object are never plain). The lane then builds the same ``Request``
or ``Feedback``, instance key and shard as ``events.parse_*`` and ``dataflow.route``. Any
other message (every refusal, anything unusual) goes through the Python parser and
``route``, so each dead letter is the one ``events.py`` writes; the tests run generated
messages through both and compare.

The common message is not read by orjson either: a scanner (``_Message.scan``) reads an
object of known keys, each once, whose values are ASCII strings without escapes, null,
ints of at most 18 digits or finite floats (read by ``PyOS_string_to_double``, correctly
rounded as orjson's), and gives the values orjson would; anything else (whitespace aside,
one byte off that form) is read by orjson into a dict. The scanner spares the common
message most of this step's instructions (bench/RESULTS.md, "The common message scanned
in C").

>>> from flows.service.dataflow import route
>>> from flows.service.wire.events import Origin
>>> from flows.service.instances.registry import Registry
>>> registry = Registry.from_toml('[experiments.home]\\narms = ["a", "b"]')
>>> batch = [(b'{"experiment":"home","request_id":"r1"}', Origin("t")), (b'[]', Origin("t"))]
>>> shards, dead = parse_and_route(parse_request, route, 3600.0, registry, batch, shards=32)
>>> [(group, [(shard, [(key, e.request_id) for key, _, e in events]) for shard, events in parts])
...  for group, parts in shards]
[('group-000-of-008', [('shard-016-of-032', [('home', 'r1')])])]
>>> dead[0].reason
'not_an_object'
"""

from cpython.bytes cimport PyBytes_CheckExact
from cpython.dict cimport PyDict_CheckExact, PyDict_GetItemWithError
from cpython.float cimport PyFloat_CheckExact, PyFloat_FromDouble
from cpython.long cimport PyLong_CheckExact, PyLong_FromLongLong
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.unicode cimport PyUnicode_CheckExact
from libc.math cimport isfinite
from libc.string cimport memcmp, memcpy
from posix.time cimport CLOCK_REALTIME, clock_gettime, timespec

import orjson

from flows.service.wire.events import (
    DeadLetter,
    ParseBySource,
    parse_event,
    parse_feedback,
    parse_request,
)
from flows.service.wire._records cimport Layout, kept
from flows.service.wire import _records as records
from flows.service.wire.fields cimport arm as _arm, identifier as _identifier, index as _index
from flows.service.wire.fields cimport loss_in_range, number as _number, size_accepted, time_in_window
from flows.service.wire.keys cimport in_groups, shard_index, shard_names
from flows.service.wire.keys import DEFAULT_SHARDS, UNIT_SEPARATOR

#: the registry and experiment classes whose objects the lane reads directly: named by
#: ``flows.service.instances.registry`` as it loads (``lane_reads``), as wire sits below it
cdef object _REGISTRY = None
cdef object _EXPERIMENT = None


cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object text)
    unsigned char* PyUnicode_DATA(object text)
    object PyUnicode_New(Py_ssize_t size, Py_UCS4 maxchar)
    double PyOS_string_to_double(const char* s, char** endptr, PyObject* overflow) except? -1.0


cdef enum Kind:
    REQUEST, FEEDBACK, EVENT

#: the parsers this lane stands for, with the kind of message each reads
FAST_PARSERS = {parse_request: REQUEST, parse_feedback: FEEDBACK, parse_event: EVENT}

cdef object _loads = orjson.loads
cdef str _SEPARATOR = UNIT_SEPARATOR


cdef Layout _REQUEST = records.REQUEST
cdef Layout _FEEDBACK = records.FEEDBACK


# -- the values events.py accepts, in their plain form -----------------------------------

cdef inline double _wall_clock() noexcept:
    """``time.time()``."""
    cdef timespec now
    clock_gettime(CLOCK_REALTIME, &now)
    return <double>(now.tv_sec * 1000000000 + now.tv_nsec) / 1e9


cdef enum:  # the keys the parsers know
    EXPERIMENT_KEY, UNIT_KEY, REQUEST_ID_KEY, CONTEXT_KEY, TS_KEY, LOSS_KEY, REWARD_KEY, \
        ARM_KEY, TYPE_KEY, N_KEYS

#: their names, in that order
cdef tuple _KEY_NAMES = (
    "experiment", "unit", "request_id", "context", "ts", "loss", "reward", "arm", "type"
)
cdef enum:
    MAX_NUMBER = 64  # characters of a float the scanner reads (longer: orjson reads it)


cdef class _Message:
    """The known fields of the message at hand, and how many keys it has: read by a
    scanner of the plain form (``scan``), else from orjson's dict (``read``)."""

    cdef PyObject* values[N_KEYS]  # owned references, NULL where the key is absent
    cdef Py_ssize_t n_keys

    def __dealloc__(self):
        self.clear()

    cdef void clear(self) noexcept:
        cdef Py_ssize_t i
        for i in range(N_KEYS):
            Py_XDECREF(self.values[i])
            self.values[i] = NULL
        self.n_keys = 0

    cdef inline object get(self, int key, Py_ssize_t* known):
        """The field's value (None if absent), counting the keys the parser knows."""
        cdef PyObject* value = self.values[key]
        if value is NULL:
            return None
        known[0] += 1
        return <object>value

    cdef int read(self, dict data) except -1:
        """The fields of orjson's dict of the message."""
        cdef PyObject* value
        cdef Py_ssize_t i
        self.clear()
        for i in range(N_KEYS):
            value = PyDict_GetItemWithError(data, _KEY_NAMES[i])
            if value is not NULL:
                Py_INCREF(<object>value)
                self.values[i] = value
        self.n_keys = len(data)
        return 0

    cdef bint scan(self, const char* p, Py_ssize_t size) except -1:
        """Read a message of the plain form, giving the values orjson gives: one JSON
        object of known keys, each once, whose values are ASCII strings without escapes,
        null, or numbers (an int of at most 18 digits, a finite float of at most
        ``MAX_NUMBER`` characters). False for anything else: orjson reads it."""
        cdef const char* end = p + size
        cdef const char* start
        cdef int key
        self.clear()
        p = _space(p, end)
        if p == end or p[0] != 123:  # {
            return False
        p = _space(p + 1, end)
        if p < end and p[0] == 125:  # }
            return _space(p + 1, end) == end
        while True:
            if p == end or p[0] != 34:  # "
                return False
            start = p + 1
            p = _string_end(start, end)
            if p == NULL:
                return False
            key = _key(start, p - start)
            if key < 0 or self.values[key] is not NULL:  # unknown, or said twice
                return False
            p = _space(p + 1, end)
            if p == end or p[0] != 58:  # :
                return False
            p = self._value(key, _space(p + 1, end), end)
            if p == NULL:
                return False
            self.n_keys += 1
            p = _space(p, end)
            if p == end:
                return False
            if p[0] == 125:  # }
                return _space(p + 1, end) == end
            if p[0] != 44:  # ,
                return False
            p = _space(p + 1, end)

    cdef const char* _value(self, int key, const char* p, const char* end) except? NULL:
        """Read one value into ``key``; where it ends, or NULL if it is not plain."""
        cdef const char* stop
        cdef object value
        cdef bint fraction
        if p == end:
            return NULL
        if p[0] == 34:  # "
            stop = _string_end(p + 1, end)
            if stop == NULL:
                return NULL
            value = PyUnicode_New(stop - p - 1, 127)
            memcpy(PyUnicode_DATA(value), p + 1, stop - p - 1)
            stop += 1
        elif p[0] == 110:  # n
            if end - p < 4 or memcmp(p, b"null", 4) != 0:
                return NULL
            value, stop = None, p + 4
        else:
            stop = _number_end(p, end, &fraction)
            if stop == NULL:
                return NULL
            value = _number_of(p, stop - p, fraction)
            if value is None:
                return NULL
        Py_INCREF(value)
        self.values[key] = <PyObject*>value
        return stop


cdef inline const char* _space(const char* p, const char* end) noexcept:
    """Past JSON's whitespace."""
    while p < end and (p[0] == 32 or p[0] == 10 or p[0] == 13 or p[0] == 9):
        p += 1
    return p


cdef inline const char* _string_end(const char* p, const char* end) noexcept:
    """The closing quote of a string of printable ASCII without escapes from ``p``; NULL
    for anything else (an escape, a control character, a byte past ASCII, no end)."""
    while p < end:
        if p[0] == 34:
            return p
        if p[0] == 92 or <unsigned char>p[0] < 0x20 or <unsigned char>p[0] > 0x7E:
            return NULL
        p += 1
    return NULL


cdef int _key(const char* p, Py_ssize_t n) noexcept:
    """The number of a known key's text (``EXPERIMENT_KEY``...), or -1."""
    cdef Py_ssize_t i
    for i in range(N_KEYS):
        if _KEY_LENGTHS[i] == n and memcmp(_KEY_TEXTS[i], p, n) == 0:
            return i
    return -1


cdef tuple _KEY_BYTES = tuple(name.encode() for name in _KEY_NAMES)  # held: _KEY_TEXTS
cdef const char* _KEY_TEXTS[N_KEYS]
cdef Py_ssize_t _KEY_LENGTHS[N_KEYS]


cdef void _fill_key_texts() noexcept:
    cdef Py_ssize_t i
    cdef bytes name
    for i in range(N_KEYS):
        name = _KEY_BYTES[i]
        _KEY_TEXTS[i], _KEY_LENGTHS[i] = name, len(name)


_fill_key_texts()


cdef inline bint _digit(char c) noexcept:
    return 48 <= c <= 57


cdef const char* _number_end(const char* p, const char* end, bint* fraction) noexcept:
    """The end of a JSON number from ``p`` (RFC 8259's grammar), or NULL; ``fraction``
    says whether it has a fraction or an exponent (a float) or not (an int)."""
    fraction[0] = False
    if p < end and p[0] == 45:  # -
        p += 1
    if p == end or not _digit(p[0]):
        return NULL
    if p[0] == 48:  # a leading 0 stands alone
        p += 1
    else:
        while p < end and _digit(p[0]):
            p += 1
    if p < end and p[0] == 46:  # .
        fraction[0] = True
        p += 1
        if p == end or not _digit(p[0]):
            return NULL
        while p < end and _digit(p[0]):
            p += 1
    if p < end and (p[0] == 101 or p[0] == 69):  # e E
        fraction[0] = True
        p += 1
        if p < end and (p[0] == 43 or p[0] == 45):
            p += 1
        if p == end or not _digit(p[0]):
            return NULL
        while p < end and _digit(p[0]):
            p += 1
    return p


cdef object _number_of(const char* p, Py_ssize_t n, bint fraction):
    """The int (at most 18 digits) or finite float a JSON number's text stands for, as
    orjson reads it; None when orjson should read it (longer, or out of range)."""
    cdef char text[MAX_NUMBER + 1]
    cdef Py_ssize_t i
    cdef long long whole = 0
    cdef bint negative = p[0] == 45
    cdef double value
    if not fraction:
        if n - negative > 18:
            return None
        for i in range(negative, n):
            whole = whole * 10 + (p[i] - 48)
        return PyLong_FromLongLong(-whole if negative else whole)
    if n > MAX_NUMBER:
        return None
    memcpy(text, p, n)
    text[n] = 0
    value = PyOS_string_to_double(text, NULL, NULL)
    if not isfinite(value):
        return None
    return PyFloat_FromDouble(value)


cdef class _Lane:
    """One batch's fast lane: ``taken`` is a message's (key, experiment, event), its
    shard in ``shard``, or None when the Python path must decide."""

    cdef Kind kind
    cdef double window
    cdef bint plain_window  # a float: ``ts`` is compared to it as events.py does
    cdef dict experiments  # None: not a plain ``Registry``, no message takes the lane
    cdef object experiment  # the last experiment seen, and what its instance key needs
    cdef str name
    cdef bint per_unit
    cdef object experiment_id, unit, request_id, ts  # the message at hand's common fields
    cdef object shard  # the shard of the message taken last
    cdef Py_ssize_t shards  # the flow's shard count, and its shards' names
    cdef tuple names
    cdef _Message message

    def __cinit__(self, Kind kind, object window, object registry, Py_ssize_t shards):
        self.kind = kind
        self.shards, self.names = shards, shard_names(shards)
        self.message = _Message()
        self.plain_window = PyFloat_CheckExact(window)
        self.window = window if self.plain_window else 0.0
        if type(registry) is _REGISTRY and PyDict_CheckExact(registry.experiments):
            self.experiments = registry.experiments

    cdef object taken(self, object raw, object origin):
        cdef Py_ssize_t known = 0  # the keys read so far that the message has
        cdef Kind kind = self.kind
        if self.experiments is None or not PyBytes_CheckExact(raw) or not size_accepted(len(<bytes>raw)):
            return None
        cdef _Message data = self.message
        if not data.scan(<const char*><bytes>raw, len(<bytes>raw)):
            parsed = _loads(raw)
            if not PyDict_CheckExact(parsed):
                return None
            data.read(parsed)
        if kind == EVENT:
            kind = _event_kind(data.get(TYPE_KEY, &known))
        if kind == REQUEST:
            return self._request(data, known, raw, origin)
        if kind == FEEDBACK:
            return self._feedback(data, known, raw, origin)
        return None

    cdef object _request(self, _Message data, Py_ssize_t known, object raw, object origin):
        if not self._common(data, &known):
            return None
        context = data.get(CONTEXT_KEY, &known)
        if not _index(context) or known != data.n_keys:  # an unread key: the parser decides
            return None
        key = self._instance_key()
        if key is None:
            return None
        return self._routed(key, _REQUEST.built((
            self.experiment_id, self.unit, self.request_id, context, self.ts, raw, origin, None
        )))

    cdef object _feedback(self, _Message data, Py_ssize_t known, object raw, object origin):
        if not self._common(data, &known):
            return None
        loss = _loss(data, &known)
        arm = data.get(ARM_KEY, &known)
        if loss is None or not _arm(arm) or known != data.n_keys:
            return None
        key = self._instance_key()
        if key is None:
            return None
        return self._routed(key, _FEEDBACK.built((
            self.experiment_id, self.unit, self.request_id, loss, arm, self.ts, raw, origin, None
        )))

    cdef object _routed(self, object key, object event):
        """(key, experiment, event), its shard in ``shard``; none of it walked by the
        cyclic GC: a batch in flight holds strings, numbers and records only (see
        ``_records.kept``)."""
        self.shard = self.names[shard_index(key, self.shards)]
        return kept((key, self.experiment, kept(event)))

    cdef bint _common(self, _Message data, Py_ssize_t* known) except -1:
        """Reads the identifiers and ``ts`` into the lane; False if one is not plain."""
        self.experiment_id = data.get(EXPERIMENT_KEY, known)
        self.unit = data.get(UNIT_KEY, known)
        self.request_id = data.get(REQUEST_ID_KEY, known)
        if not (_identifier(self.experiment_id) and _identifier(self.request_id)):
            return False
        if self.unit is not None and not _identifier(self.unit):
            return False
        self.ts = data.get(TS_KEY, known)
        if self.ts is not None:
            self.ts = self._timestamp(self.ts)
            return self.ts is not None
        return True

    cdef object _timestamp(self, object value):
        """``float(ts)`` within the window of the wall clock, else None."""
        cdef double ts
        if not self.plain_window or not _number(value, &ts):
            return None
        if not time_in_window(ts, self.window, _wall_clock()):
            return None
        return ts

    cdef object _instance_key(self):
        """``route``: the key of a known experiment's instance (its unit when per unit),
        else None; ``self.experiment`` is then that experiment."""
        cdef PyObject* found = PyDict_GetItemWithError(self.experiments, self.experiment_id)
        if found is NULL:
            return None
        if <object>found is not self.experiment:
            experiment = <object>found
            if type(experiment) is not _EXPERIMENT or not PyUnicode_CheckExact(experiment.name):
                return None
            self.experiment, self.name = experiment, experiment.name
            self.per_unit = experiment.per_unit
        if not self.per_unit:
            return self.name
        if self.unit is None:
            return None
        return f"{self.name}{_SEPARATOR}{self.unit}"


def lane_reads(type registry, type experiment) -> None:
    """Name the registry and experiment classes the lane reads directly (a subclass of
    either, or any other class, takes the Python path); the registry's module does, once.

    >>> from flows.service.instances.registry import Experiment, Registry
    >>> lane_reads(Registry, Experiment)
    """
    global _REGISTRY, _EXPERIMENT
    _REGISTRY, _EXPERIMENT = registry, experiment


cdef Kind _event_kind(object kind):
    """The kind a combined stream's ``type`` names; EVENT for anything else."""
    if PyUnicode_CheckExact(kind):
        if kind == "request":
            return REQUEST
        if kind == "feedback":
            return FEEDBACK
    return EVENT


cdef object _loss(_Message data, Py_ssize_t* known):
    """The loss of exactly one finite ``loss`` or ``reward`` within range, else None."""
    cdef double value
    loss = data.get(LOSS_KEY, known)
    reward = data.get(REWARD_KEY, known)
    if (loss is None) == (reward is None):
        return None
    if not _number(reward if loss is None else loss, &value):
        return None
    if not loss_in_range(value):
        return None
    return -value if loss is None else value


cdef inline bint _by_source(object parse):
    """Whether ``parse`` is the internal topic's ``ParseBySource`` itself (a subclass
    may parse otherwise: it has no lane)."""
    return type(parse) is ParseBySource


def has_lane(parse) -> bool:
    """Whether ``parse`` is one this lane stands for: a standard parser
    (``FAST_PARSERS``) or the internal topic's ``ParseBySource``."""
    return _by_source(parse) or parse in FAST_PARSERS


def parse_and_route(
    parse, route, window, registry, batch, bint grouped=True, Py_ssize_t shards=DEFAULT_SHARDS
):
    """``dataflow.parse_and_route(parse, guards, live, batch, grouped, shards)`` for a
    parser with a lane (``has_lane``) and no skipped offsets: ``window`` is
    ``guards.ts_window``, ``registry`` is ``live.current``, and ``route`` is
    ``dataflow.route``, called with the Python parser's events and the flow's shard count
    ``shards``. The routed events come grouped by shard, as
    ``dataflow.by_shard`` groups them, or (not ``grouped``) as (key, experiment, event)
    in the batch's order."""
    cdef _Lane lane, requests_lane = None, feedback_lane = None
    cdef object requests = None
    if _by_source(parse):  # each message's kind is its origin's
        requests = parse.requests
        requests_lane = _Lane(REQUEST, window, registry, shards)
        feedback_lane = _Lane(FEEDBACK, window, registry, shards)
    else:
        lane = _Lane(FAST_PARSERS[parse], window, registry, shards)
    cdef dict grouping = {}
    cdef list dead = [], routed = []
    cdef PyObject* events
    for raw, origin in batch:
        if requests is not None:
            lane = requests_lane if origin.source == requests else feedback_lane
        try:
            item = lane.taken(raw, origin)
        except Exception:  # orjson's refusal, or anything else the reference decides
            item = None
        if item is not None:
            shard = lane.shard
        else:
            item = parse(raw, origin, ts_window=window)
            if not isinstance(item, DeadLetter):
                item = route(registry, item, shards)
            if isinstance(item, DeadLetter):
                dead.append(item)
                continue
            shard, item = item
        if not grouped:
            routed.append(item)
            continue
        events = PyDict_GetItemWithError(grouping, shard)
        if events is NULL:
            grouping[shard] = [item]
        else:
            (<list>events).append(item)
    return (in_groups(list(grouping.items()), shards) if grouped else routed), dead
