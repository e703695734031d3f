# cython: language_level=3, boundscheck=False, wraparound=False
"""The service's records built from compiled code: one way to make them, one to keep them.

The events, answers and entries of ``flows.service`` are slots dataclasses. Calling a
frozen one is slow (its ``__init__`` sets each field with ``object.__setattr__``): it
costs more than parsing the message. ``Layout(cls, fields)`` checks once, at import,
that the class still has exactly these fields as plain slots (the Python class is the
reference: a field added there must be added to the compiled code, or the import fails),
and ``built`` then fills a new instance slot by slot, equal to the constructor's and
many times faster than a frozen one's ``__init__``. ``get`` reads a field at its slot's
offset, a few machine instructions where an attribute read from compiled code looks the
descriptor up in the type (bench/RESULTS.md, "Figures behind the code": records built
in C): the fast lane reads some 20 fields an event, through ``field`` (``_records.pxd``), the same
read compiled into the reading module, with no call when the record is of the class.

``kept`` marks a record the service keeps per ticket (an entry, its ticket, its origin)
as one the cyclic GC need not walk: these hold only strings, numbers and each other, so
they can be in no cycle, and with many tickets open the collector would walk them all,
again and again (bench/RESULTS.md, "the compiled hot path"). A batch in flight is marked
too (a message and its origin here, a parsed and routed event in ``_parse``): it is the
bulk of the young generation, which the collector walks every few thousand allocations.

At the edges: ``kafka_batch`` reads a batch of Kafka messages as (bytes, Origin),
``internal_copy`` and ``internal_message`` write and read the internal topic's copies,
and ``split_outputs`` writes a shard's answers as JSON (what ``selection_json``
writes, in C when its texts are plain), setting its dead letters apart.

>>> made = Layout(Origin, ("source", "partition", "offset", "time")).new(("t", 0, 5, 1.5))
>>> made == Origin("t", 0, 5, 1.5)
True
>>> Layout(Origin, ("source", "partition", "offset", "time")).field(made, 2)
5
"""

import copyreg
import dataclasses
import functools
from types import MemberDescriptorType

from cpython.bytes cimport PyBytes_CheckExact, PyBytes_FromStringAndSize
from cpython.float cimport PyFloat_CheckExact
from cpython.long cimport PyLong_CheckExact
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_CheckExact, PyTuple_New, PyTuple_SET_ITEM
from cpython.unicode cimport PyUnicode_CheckExact
from libc.string cimport memcpy

from flows.service.wire._int_text cimport write_int64
from flows.service.wire.keys cimport internal_partition, shard_index

from orjson import dumps

from flows.service.wire.events import DeadLetter, Feedback, Origin, Request, Selection
from flows.service.wire.keys import DEFAULT_SHARDS


cdef extern from *:
    """
    static PyObject *tsi_allocated(PyTypeObject *cls) {
        return cls->tp_alloc(cls, 0);
    }
    static inline void tsi_fill(PyObject *made, Py_ssize_t offset, PyObject *value) {
        Py_INCREF(value);
        *(PyObject **)((char *)made + offset) = value;
    }
    """
    object _allocated "tsi_allocated" (type cls)
    void _fill "tsi_fill" (object made, Py_ssize_t offset, object value) noexcept

cdef extern from "Python.h":
    void PyObject_GC_UnTrack(void* op)
    bint PyUnicode_IS_ASCII(object text)
    const unsigned char* PyUnicode_DATA(object text)
    long long PyLong_AsLongLongAndOverflow(object o, int* overflow) except? -1
    ctypedef struct PyMemberDef:
        int type
        Py_ssize_t offset
        int flags
    ctypedef struct PyMemberDescrObject:
        PyMemberDef *d_member
    enum: T_OBJECT_EX
    enum: READONLY


cdef class Layout:
    """The slots of a dataclass's ``fields`` (or of a plain class's ``__slots__``),
    checked against the class."""

    def __init__(self, type cls, tuple fields):
        if dataclasses.is_dataclass(cls):
            names = tuple(field.name for field in dataclasses.fields(cls))
            plain = cls.__new__ is object.__new__ and not hasattr(cls, "__post_init__")
        else:  # read only: ``built`` would skip its __init__
            names, plain = tuple(cls.__dict__.get("__slots__", ())), True
        slots = tuple(cls.__dict__.get(name) for name in names)
        if names != fields or not plain or not all(
            isinstance(slot, MemberDescriptorType)  # a type no class can derive from
            and (<PyMemberDescrObject*>slot).d_member.type == T_OBJECT_EX
            and not (<PyMemberDescrObject*>slot).d_member.flags & READONLY
            for slot in slots
        ) or len(slots) > MAX_FIELDS:
            raise ImportError(f"compiled code reads {cls.__name__}{fields}, the class has {names}")
        self.cls, self.slots, self.names = cls, slots, names
        for i, slot in enumerate(slots):
            self.offsets[i] = (<PyMemberDescrObject*>slot).d_member.offset

    cdef object built(self, tuple values):
        """A new record with ``values`` in field order (their number is the caller's to
        get right: each compiled caller passes a literal tuple), written at the slots'
        offsets into the fresh, zeroed record: what each slot's descriptor would do
        (``PyMember_SetOne`` of a writable object slot), without its calls."""
        cdef object made = _allocated(self.cls)
        cdef Py_ssize_t i
        for i in range(len(self.slots)):
            _fill(made, self.offsets[i], values[i])
        return made

    cdef object get(self, object record, Py_ssize_t i):
        """Field ``i`` of ``record``: read at its slot's offset when ``record`` is of the
        class (what the slot's descriptor does, without looking it up), else by name."""
        cdef void *value
        if type(record) is not self.cls:
            return getattr(record, self.names[i])
        value = _slot_at(record, self.offsets[i])
        if value == NULL:
            raise AttributeError(f"{self.cls.__name__!r} object has no attribute {self.names[i]!r}")
        return <object>value

    def new(self, tuple values):
        """``built``, from Python (examples and tests)."""
        if len(values) != len(self.slots):
            raise ValueError(f"{self.cls.__name__} has {len(self.slots)} fields, got {values!r}")
        return self.built(values)

    def field(self, record, Py_ssize_t i):
        """``get``, from Python (examples and tests)."""
        if not 0 <= i < len(self.slots):
            raise IndexError(f"{self.cls.__name__} has {len(self.slots)} fields, not {i + 1}")
        return self.get(record, i)


cdef object kept(object record):
    """``record``, no longer walked by the cyclic GC (see the module's docstring)."""
    PyObject_GC_UnTrack(<PyObject*>record)
    return record


# The events' layouts, one each for every compiled module (``cdef Layout _X = X``); their
# field numbers are in _records.pxd.
ORIGIN = Layout(Origin, ("source", "partition", "offset", "time"))
REQUEST = Layout(
    Request, ("experiment", "unit", "request_id", "context", "ts", "raw", "origin", "eligible")
)
FEEDBACK = Layout(
    Feedback,
    ("experiment", "unit", "request_id", "loss", "arm", "ts", "raw", "origin", "guardrails"),
)
SELECTION = Layout(
    Selection,
    ("experiment", "unit", "request_id", "instance", "arm", "arm_name", "prob", "round", "why"),
)
cdef Layout _ORIGIN = ORIGIN
cdef Layout _SELECTION = SELECTION


# Events cross Bytewax processes pickled (its exchange of a shard's items between
# workers). A frozen slots dataclass pickles by setting its fields one by one and
# unpickles by calling its class: slow for every event a cluster hands over
# (bench/RESULTS.md, "a cluster's crossing events").
# Registered here (``copyreg``), an event is written as its layout's number and its field
# values, and read back by ``built`` (kept from the GC, as the batch in flight is).
cdef tuple _PICKLED = (ORIGIN, REQUEST, FEEDBACK)


def unpickled(Py_ssize_t kind, tuple values):
    """The record pickled as ``(kind, values)`` (``_PICKLED[kind]``'s class).

    >>> import pickle
    >>> origin = Origin("t", 0, 5, 1.5)
    >>> pickle.loads(pickle.dumps(origin)) == origin, pickle.dumps(origin).count(b"unpickled")
    (True, 1)
    """
    if not 0 <= kind < len(_PICKLED):
        raise ValueError(f"no record kind {kind}")
    cdef Layout layout = _PICKLED[kind]
    if len(values) != len(layout.slots):
        raise ValueError(f"{layout.cls.__name__} has {len(layout.slots)} fields, got {values!r}")
    return kept(layout.built(values))


def _reduced(Py_ssize_t kind, object record):
    """``copyreg``'s reduction of ``record``, of kind ``kind``: ``unpickled`` and its
    arguments."""
    cdef Layout layout = _PICKLED[kind]
    cdef Py_ssize_t i, n = len(layout.slots)
    cdef tuple values = PyTuple_New(n)
    for i in range(n):
        value = layout.get(record, i)
        Py_INCREF(value)
        PyTuple_SET_ITEM(values, i, value)
    return unpickled, (kind, values)


for _kind, _layout in enumerate(_PICKLED):  # a kind's number is its place in _PICKLED
    copyreg.pickle((<Layout>_layout).cls, functools.partial(_reduced, _kind))


def kafka_message(message, str topic, partition) -> tuple:
    """A Kafka message (without error) as (its bytes, its Origin): the topic, partition
    and offset, and the time Kafka stamped it with in Unix seconds (None if none)."""
    _kind, ms = message.timestamp()
    at = ms / 1000.0 if ms > 0 else None
    return kept((message.value(), kept(_ORIGIN.built((topic, partition, message.offset(), at)))))


def kafka_batch(list messages, str topic, partition, convert, on_error, int eof_code):
    """What one ``consume`` returned, in order: (items, the last offset read or None,
    whether the partition's end was reached). A message becomes ``convert(message)`` or,
    with ``convert`` None, ``kafka_message``; a ``convert`` that returns None drops it (a
    second copy); a message with an error becomes ``on_error(message, error)``; the end
    of the partition (error code ``eof_code``) stops the batch."""
    cdef list out = []
    last, eof = None, False
    for message in messages:
        error = message.error()
        if error is None:
            item = kafka_message(message, topic, partition) if convert is None \
                else convert(message)
            if item is not None:
                out.append(item)
        elif error.code() == eof_code:
            eof = True
            break
        else:
            out.append(on_error(message, error))
        last = message.offset()
    return out, last, eof


def messages_only(list batch) -> bool:
    """Whether a consumed batch holds messages only (``kafka_batch``'s (bytes, Origin)
    tuples), no error item: the common batch, which then needs no splitting.

    >>> messages_only([(b"{}", Origin("t"))]), messages_only([(b"{}", Origin("t")), "error"])
    (True, False)
    """
    for item in batch:
        if not PyTuple_CheckExact(item):
            return False
    return True


#: The headers an internal copy carries: its input's tag, partition and offset (b"r:0:17"),
#: and the time Kafka stamped the input with, in ms.
cdef str _NAMED = "o"
cdef str _STAMPED = "t"


def internal_copy(
    tuple routed, dict tags, Py_ssize_t partitions=0, Py_ssize_t shards=DEFAULT_SHARDS
) -> tuple:
    """The internal copy of a routed input message (key, bytes, Origin), as the sink of
    the internal topic writes it: (key, value, headers), keyed by its instance, naming its
    original in two headers. With the internal topic's ``partitions`` (> 0), the copy names
    its partition too, (key, value, headers, partition): its shard's, of the flow's
    ``shards`` (``keys.internal_partition``), so all the events of a shard meet in one
    partition, whichever process copied them (``flows.service.connectors.members``).

    >>> internal_copy(("e:u1", b"{}", Origin("tsi.requests", 2, 17, 1.5)), {"tsi.requests": b"r"})
    (b'e:u1', b'{}', [('o', b'r:2:17'), ('t', b'1500')])
    >>> internal_copy(("e:u1", b"{}", Origin("tsi.requests", 2, 17)), {"tsi.requests": b"r"}, 4)
    (b'e:u1', b'{}', [('o', b'r:2:17')], 2)
    """
    key, raw, origin = routed
    headers = [(_NAMED, b"%s:%d:%d" % (tags[origin.source], origin.partition, origin.offset))]
    if origin.time is not None:
        headers.append((_STAMPED, b"%d" % round(origin.time * 1000)))
    if partitions > 0:
        return key.encode(), raw, headers, internal_partition(shard_index(key, shards), partitions)
    return key.encode(), raw, headers


cdef object _digits(object text):
    """``text`` (bytes) as a non-negative int, or None unless it is ASCII digits only."""
    if not PyBytes_CheckExact(text) or not 0 < len(<bytes>text) <= 19 or not text.isdigit():
        return None
    return int(text)


def internal_message(dict seen, dict inputs, str topic, partition, message):
    """A ``message`` of the internal topic's ``partition`` as (bytes, the input message's
    Origin); None for a second copy (its input offset no higher than the last one read
    from that input partition, kept in ``seen``); a ``not_a_copy`` dead letter for a
    message whose headers do not name an input message as the service writes them (the
    service writes every message of this topic: anything else is someone else's, set
    apart, never applied and never a reason to stop).

    >>> key, value, headers = internal_copy(
    ...     ("e:u1", b"{}", Origin("tsi.requests", 2, 17, 1.5)), {"tsi.requests": b"r"})
    >>> class Message:
    ...     value = lambda self: value; headers = lambda self: headers
    ...     offset = lambda self: 40; timestamp = lambda self: (1, 1_600)
    >>> seen = {}
    >>> read = lambda seen, inputs: internal_message(seen, inputs, "internal", 0, Message())
    >>> read(seen, {b"r": "tsi.requests"})
    (b'{}', Origin(source='tsi.requests', partition=2, offset=17, time=1.5))
    >>> read(seen, {b"r": "tsi.requests"}) is None
    True
    >>> read({}, {}).reason
    'not_a_copy'
    """
    named = stamped = None
    for header in message.headers() or ():
        if header[0] == _NAMED:
            named = header[1]
        elif header[0] == _STAMPED:
            stamped = header[1]
    if not PyBytes_CheckExact(named):
        return _not_a_copy(message, topic, partition,
                           f"no {_NAMED!r} header naming its input message")
    named_input = _named_input(<bytes>named, inputs)
    if named_input is None:
        return _not_a_copy(message, topic, partition, f"header {_NAMED!r} is {named!r}, "
                           "not TAG:PARTITION:OFFSET of an input topic")
    ms = None if stamped is None else _digits(stamped)
    if stamped is not None and ms is None:
        return _not_a_copy(message, topic, partition,
                           f"header {_STAMPED!r} is {stamped!r}, not a time in ms")
    source, input_partition, offset = named_input
    where = named.rpartition(b":")[0]  # b"r:0": the input partition, as ``seen`` keys it
    if offset <= seen.get(where, -1):
        return None
    seen[where] = offset
    at = None if ms is None else ms / 1000.0
    return kept((message.value(), kept(_ORIGIN.built((source, input_partition, offset, at)))))


cdef object _named_input(bytes named, dict inputs):
    """(input topic, partition, offset) that a copy's header names, or None if it names
    none as the service writes them."""
    parts = named.split(b":")
    if len(parts) != 3 or parts[0] not in inputs:
        return None
    input_partition, offset = _digits(parts[1]), _digits(parts[2])
    if input_partition is None or offset is None:
        return None
    return inputs[parts[0]], input_partition, offset


cdef object _not_a_copy(message, str topic, partition, str problem):
    raw, origin = kafka_message(message, topic, partition)
    detail = f"not a copy the service wrote to its internal topic: {problem}"
    return DeadLetter("not_a_copy", detail, raw or b"", origin)


cpdef bint key_value(tuple item):
    """Whether a tuple is what the Kafka sink writes to its topic: (key, value), (key,
    value, headers list) or (key, value, headers list, partition int).

    >>> key_value(("k", b"v")), key_value(("k", b"v", [("h", b"1")])), key_value(("k", b"v", "x"))
    (True, True, False)
    >>> key_value(("k", b"v", [], 3)), key_value(("k", b"v", [], "3"))
    (True, False)
    """
    cdef Py_ssize_t n = len(item)
    if n == 4:
        return isinstance(item[2], list) and PyLong_CheckExact(item[3])
    return n == 2 or (n == 3 and isinstance(item[2], list))


def producible(list items) -> bool:
    """Whether the Kafka sink can produce every item as it is: each a plain tuple it
    writes (``key_value``), as the shards' answers and the internal topic's copies are;
    a sink with a topic then skips its per-item check.

    >>> producible([("k", b"v"), ("k", b"v", [("h", b"1")])]), producible([("k", b"v", "x")])
    (True, False)
    """
    for item in items:
        if not PyTuple_CheckExact(item) or not key_value(<tuple>item):
            return False
    return True


def split_outputs(list outputs) -> tuple:
    """A shard's outputs (``instance.Output``) as its answers, serialised
    (``selection_json``) and keyed by instance, and its dead letters (each output says
    which it is: ``dead_letter``)."""
    cdef list selections = [], dead = []
    for out in outputs:
        if out.dead_letter:
            dead.append(out)
        else:
            selections.append(
                kept((field(_SELECTION, out, SELECTION_INSTANCE), _selection_json(out)))
            )
    return selections, dead


def selection_json(selection) -> bytes:
    """The JSON of an answer on the selections topic (what ``split_outputs`` writes): its keys
    experiment, unit, request_id, arm, arm_name, prob, round and why.

    >>> from flows.service.wire.events import Selection
    >>> selection_json(Selection("home", None, "r1", "home", 1, "b", 0.5, 3, "bandit"))
    b'{"experiment":"home","unit":null,"request_id":"r1","arm":1,"arm_name":"b","prob":0.5,"round":3,"why":"bandit"}'
    """
    return _selection_json(selection)


cdef object _selection_json(object selection):
    """``selection_json``, its fields read here (no Python call between): written in C
    when every text is plain (``_plain``), the numbers are exact ints within int64 and a
    float, and it fits ``JSON_CAP``; else by orjson from the same dict (the reference; the
    tests compare the two on generated answers). The float is orjson's own writing of it.
    Several times faster than the dict when the answers are kept, as a batch in flight
    keeps them until the sink writes them: orjson starts each output in a larger buffer
    and shrinks it, cheap when the bytes are freed at once, not when thousands are kept
    (bench/RESULTS.md, "Answers' JSON written in C")."""
    cdef Layout at = _SELECTION
    experiment, unit, request_id = at.get(selection, 0), at.get(selection, 1), at.get(selection, 2)
    arm, arm_name = at.get(selection, 4), at.get(selection, 5)
    prob, rounds, why = at.get(selection, 6), at.get(selection, 7), at.get(selection, 8)
    cdef char arm_text[24]
    cdef char round_text[24]
    cdef Py_ssize_t arm_n = _decimal(arm, arm_text)
    cdef Py_ssize_t round_n = _decimal(rounds, round_text)
    cdef _Buffer out
    cdef bytes prob_text
    if (
        arm_n >= 0 and round_n >= 0 and PyFloat_CheckExact(prob)
        and _plain(experiment) and _plain(request_id) and _plain(arm_name) and _plain(why)
        and (unit is None or _plain(unit))
    ):
        prob_text = dumps(prob)
        out.n = 0
        out.full = False
        _put(&out, b'{"experiment":"', 15)
        _put_ascii(&out, experiment)
        if unit is None:
            _put(&out, b'","unit":null,"request_id":"', 28)
        else:
            _put(&out, b'","unit":"', 10)
            _put_ascii(&out, unit)
            _put(&out, b'","request_id":"', 16)
        _put_ascii(&out, request_id)
        _put(&out, b'","arm":', 8)
        _put(&out, arm_text + 24 - arm_n, arm_n)
        _put(&out, b',"arm_name":"', 13)
        _put_ascii(&out, arm_name)
        _put(&out, b'","prob":', 9)
        _put(&out, prob_text, len(prob_text))
        _put(&out, b',"round":', 9)
        _put(&out, round_text + 24 - round_n, round_n)
        _put(&out, b',"why":"', 8)
        _put_ascii(&out, why)
        _put(&out, b'"}', 2)
        if not out.full:
            return PyBytes_FromStringAndSize(out.data, out.n)
    return dumps({
        "experiment": experiment,
        "unit": unit,
        "request_id": request_id,
        "arm": arm,
        "arm_name": arm_name,
        "prob": prob,
        "round": rounds,
        "why": why,
    })


cdef enum:
    JSON_CAP = 512  # the longest answer written in C (longer: orjson writes it)


cdef struct _Buffer:
    char data[JSON_CAP]
    Py_ssize_t n
    bint full  # something did not fit


cdef inline void _put(_Buffer* out, const char* data, Py_ssize_t size) noexcept:
    if out.n + size > JSON_CAP:
        out.full = True
        return
    memcpy(out.data + out.n, data, size)
    out.n += size


cdef inline void _put_ascii(_Buffer* out, str text) noexcept:
    """A ``_plain`` text: its characters are its bytes."""
    _put(out, <const char*>PyUnicode_DATA(text), len(text))


cdef bint _plain(object text) except -1:
    """An exact str of ASCII characters orjson writes as they are (no ``"``, ``\\`` or
    control character): its bytes are its JSON between quotes."""
    cdef const unsigned char* data
    cdef Py_ssize_t i, n
    if not PyUnicode_CheckExact(text) or not PyUnicode_IS_ASCII(text):
        return False
    data = PyUnicode_DATA(text)
    n = len(<str>text)
    for i in range(n):
        if data[i] < 0x20 or data[i] == 0x22 or data[i] == 0x5C:
            return False
    return True


cdef Py_ssize_t _decimal(object value, char* buf) except -2:
    """``str(value)`` of an exact int within int64, written to end at ``buf + 24``: its
    length, or -1 for anything else (orjson decides)."""
    cdef int overflow = 0
    cdef long long v
    if not PyLong_CheckExact(value):
        return -1
    v = PyLong_AsLongLongAndOverflow(value, &overflow)
    if overflow:
        return -1
    return write_int64(v, buf + 24)
