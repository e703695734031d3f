# cython: language_level=3, boundscheck=False, wraparound=False
"""Parsing and routing of message batches, compiled: the fast lane of
``flows.service.dataflow.parse_and_route``.

``flows.service.events`` is the reference. This module accepts only what it can decide
exactly and hands everything else to it: a message takes the lane when it is ``bytes``
within the size limit, orjson reads it as an object whose keys are all known to its
parser, each holding a plain valid value, and it names a known experiment (with its unit
when the experiment keeps one bandit per unit). The lane then builds the same ``Request``
or ``Feedback``, instance key and shard as ``events.parse_*`` and ``dataflow.route``. Any
other message (every refusal, anything unusual) goes through the Python parser and
``route``, so each dead letter is the one ``events.py`` writes; the tests run generated
messages through both and compare.

>>> from flows.service.dataflow import route
>>> from flows.service.events import Origin
>>> from flows.service.registry import Registry
>>> registry = Registry.from_toml('[experiments.home]\\narms = ["a", "b"]')
>>> batch = [(b'{"experiment":"home","request_id":"r1"}', Origin("t")), (b'[]', Origin("t"))]
>>> routed, dead = parse_and_route(parse_request, route, 3600.0, registry, batch)
>>> [(shard, key, event.request_id) for shard, (key, _, event) in routed], dead[0].reason
([('shard-208', 'home', 'r1')], 'not_an_object')
"""

from cpython.dict cimport PyDict_GetItemWithError
from cpython.object cimport PyObject
from libc.math cimport fabs, isfinite
from libc.stdint cimport uint32_t
from posix.time cimport CLOCK_REALTIME, clock_gettime, timespec

import orjson

from flows.service.events import (
    MAX_ABS_LOSS,
    MAX_ID_LENGTH,
    MAX_MESSAGE_BYTES,
    DeadLetter,
    ParseBySource,
    parse_event,
    parse_feedback,
    parse_request,
)
from flows.service._records cimport Layout, kept
from flows.service import _records as records
from flows.service.logic import SHARD_NAMES, SHARDS
from flows.service.registry import UNIT_SEPARATOR, Experiment, Registry


cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object text)
    const unsigned char* PyUnicode_DATA(object text)


cdef enum Kind:
    REQUEST, FEEDBACK, EVENT

#: the parsers this lane stands for, with the kind of message each reads
FAST_PARSERS = {parse_request: REQUEST, parse_feedback: FEEDBACK, parse_event: EVENT}

cdef object _loads = orjson.loads
cdef Py_ssize_t _MAX_BYTES = MAX_MESSAGE_BYTES
cdef Py_ssize_t _MAX_ID = MAX_ID_LENGTH
cdef double _MAX_LOSS = MAX_ABS_LOSS
cdef tuple _SHARD_NAMES = SHARD_NAMES
cdef uint32_t _SHARDS = SHARDS
cdef str _SEPARATOR = UNIT_SEPARATOR


cdef Layout _REQUEST = records.REQUEST
cdef Layout _FEEDBACK = records.FEEDBACK


# -- the shard: logic.shard_of, zlib's CRC-32 of the key's UTF-8 ------------------------

if len(SHARD_NAMES) != SHARDS:
    raise ImportError("logic.SHARD_NAMES must name SHARDS shards")

cdef uint32_t _CRC_TABLE[256]


cdef void _fill_crc_table() noexcept:
    cdef uint32_t n, k, c
    for n in range(256):
        c = n
        for k in range(8):
            c = (c >> 1) ^ 0xEDB88320u if c & 1 else c >> 1
        _CRC_TABLE[n] = c


_fill_crc_table()


cdef uint32_t _crc32(const unsigned char* data, Py_ssize_t size) noexcept:
    cdef uint32_t c = 0xFFFFFFFFu
    cdef Py_ssize_t i
    for i in range(size):
        c = _CRC_TABLE[(c ^ data[i]) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFFu


cdef object _shard(str key):
    """``logic.shard_of(key)``."""
    cdef bytes utf8
    if PyUnicode_IS_ASCII(key):  # its characters are its UTF-8 bytes
        return _SHARD_NAMES[_crc32(PyUnicode_DATA(key), len(key)) % _SHARDS]
    utf8 = key.encode()
    return _SHARD_NAMES[_crc32(utf8, len(utf8)) % _SHARDS]


# -- the values events.py accepts, in their plain form -----------------------------------

cdef inline bint _identifier(object value):
    return type(value) is str and 0 < len(<str>value) <= _MAX_ID


cdef inline bint _index(object value):
    """None or an int >= 0 (orjson's ints are never bools)."""
    return value is None or (type(value) is int and value >= 0)


cdef inline bint _arm(object value):
    return _identifier(value) or _index(value)


cdef inline bint _number(object value, double* out) except -1:
    """``float(value)`` of an int or float (orjson's ints fit in 64 bits: no overflow)."""
    if type(value) is float or type(value) is int:
        out[0] = value
        return True
    return False


cdef inline double _wall_clock() noexcept:
    """``time.time()``."""
    cdef timespec now
    clock_gettime(CLOCK_REALTIME, &now)
    return <double>(now.tv_sec * 1000000000 + now.tv_nsec) / 1e9


cdef inline object _field(dict data, str name, Py_ssize_t* known):
    """``data.get(name)``, counting the keys the parser knows."""
    cdef PyObject* value = PyDict_GetItemWithError(data, name)
    if value is NULL:
        return None
    known[0] += 1
    return <object>value


cdef class _Lane:
    """One batch's fast lane: ``taken`` is a message's (shard, (key, experiment, event)),
    or None when the Python path must decide."""

    cdef Kind kind
    cdef double window
    cdef bint plain_window  # a float: ``ts`` is compared to it as events.py does
    cdef dict experiments  # None: not a plain ``Registry``, no message takes the lane
    cdef object experiment  # the last experiment seen, and what its instance key needs
    cdef str name
    cdef bint per_unit
    cdef object experiment_id, unit, request_id, ts  # the message at hand's common fields

    def __cinit__(self, Kind kind, object window, object registry):
        self.kind = kind
        self.plain_window = type(window) is float
        self.window = window if self.plain_window else 0.0
        if type(registry) is Registry and type(registry.experiments) is dict:
            self.experiments = registry.experiments

    cdef object taken(self, object raw, object origin):
        cdef Py_ssize_t known = 0  # the keys read so far that the message has
        cdef Kind kind = self.kind
        if self.experiments is None or type(raw) is not bytes or len(<bytes>raw) > _MAX_BYTES:
            return None
        data = _loads(raw)
        if type(data) is not dict:
            return None
        if kind == EVENT:
            kind = _event_kind(_field(data, "type", &known))
        if kind == REQUEST:
            return self._request(data, known, raw, origin)
        if kind == FEEDBACK:
            return self._feedback(data, known, raw, origin)
        return None

    cdef object _request(self, dict data, Py_ssize_t known, object raw, object origin):
        if not self._common(data, &known):
            return None
        context = _field(data, "context", &known)
        if not _index(context) or known != len(data):  # an unread key: the parser decides
            return None
        key = self._instance_key()
        if key is None:
            return None
        return self._routed(key, _REQUEST.built((
            self.experiment_id, self.unit, self.request_id, context, self.ts, raw, origin
        )))

    cdef object _feedback(self, dict data, Py_ssize_t known, object raw, object origin):
        if not self._common(data, &known):
            return None
        loss = _loss(data, &known)
        arm = _field(data, "arm", &known)
        if loss is None or not _arm(arm) or known != len(data):
            return None
        key = self._instance_key()
        if key is None:
            return None
        return self._routed(key, _FEEDBACK.built((
            self.experiment_id, self.unit, self.request_id, loss, arm, self.ts, raw, origin
        )))

    cdef object _routed(self, object key, object event):
        """(shard, (key, experiment, event)), none of it walked by the cyclic GC: a batch in
        flight holds strings, numbers and records only (see ``_records.kept``)."""
        return kept((_shard(key), kept((key, self.experiment, kept(event)))))

    cdef bint _common(self, dict data, Py_ssize_t* known) except -1:
        """Reads the identifiers and ``ts`` into the lane; False if one is not plain."""
        self.experiment_id = _field(data, "experiment", known)
        self.unit = _field(data, "unit", known)
        self.request_id = _field(data, "request_id", known)
        if not (_identifier(self.experiment_id) and _identifier(self.request_id)):
            return False
        if self.unit is not None and not _identifier(self.unit):
            return False
        self.ts = _field(data, "ts", known)
        if self.ts is not None:
            self.ts = self._timestamp(self.ts)
            return self.ts is not None
        return True

    cdef object _timestamp(self, object value):
        """``float(ts)`` within the window of the wall clock, else None."""
        cdef double ts
        if not self.plain_window or not _number(value, &ts) or not isfinite(ts):
            return None
        if fabs(ts - _wall_clock()) > self.window:
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
            if type(experiment) is not Experiment or type(experiment.name) is not str:
                return None
            self.experiment, self.name = experiment, experiment.name
            self.per_unit = experiment.per_unit
        if not self.per_unit:
            return self.name
        if self.unit is None:
            return None
        return f"{self.name}{_SEPARATOR}{self.unit}"


cdef Kind _event_kind(object kind):
    """The kind a combined stream's ``type`` names; EVENT for anything else."""
    if type(kind) is str:
        if kind == "request":
            return REQUEST
        if kind == "feedback":
            return FEEDBACK
    return EVENT


cdef object _loss(dict data, Py_ssize_t* known):
    """The loss of exactly one finite ``loss`` or ``reward`` within range, else None."""
    cdef double value
    loss = _field(data, "loss", known)
    reward = _field(data, "reward", known)
    if (loss is None) == (reward is None):
        return None
    if not _number(reward if loss is None else loss, &value):
        return None
    if not isfinite(value) or fabs(value) > _MAX_LOSS:
        return None
    return -value if loss is None else value


def has_lane(parse) -> bool:
    """Whether ``parse`` is one this lane stands for: a standard parser
    (``FAST_PARSERS``) or the internal topic's ``ParseBySource``."""
    return type(parse) is ParseBySource or parse in FAST_PARSERS


def parse_and_route(parse, route, window, registry, batch):
    """``dataflow.parse_and_route(parse, guards, live, batch)`` for a parser with a lane
    (``has_lane``) and no skipped offsets: ``window`` is ``guards.ts_window``,
    ``registry`` is ``live.current``, and ``route`` is ``dataflow.route``, called with
    the Python parser's events."""
    cdef _Lane lane, requests_lane = None, feedback_lane = None
    cdef object requests = None
    if type(parse) is ParseBySource:  # each message's kind is its origin's
        requests = parse.requests
        requests_lane = _Lane(REQUEST, window, registry)
        feedback_lane = _Lane(FEEDBACK, window, registry)
    else:
        lane = _Lane(FAST_PARSERS[parse], window, registry)
    cdef list routed = [], dead = []
    for raw, origin in batch:
        if requests is not None:
            lane = requests_lane if origin.source == requests else feedback_lane
        try:
            item = lane.taken(raw, origin)
        except Exception:  # orjson's refusal, or anything else the reference decides
            item = None
        if item is None:
            item = parse(raw, origin, ts_window=window)
            if not isinstance(item, DeadLetter):
                item = route(registry, item)
        if isinstance(item, DeadLetter):
            dead.append(item)
        else:
            routed.append(item)
    return routed, dead
