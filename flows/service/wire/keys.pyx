# cython: language_level=3, boundscheck=False, wraparound=False
"""Instance keys and shard addressing: which instance an event belongs to, which shard
holds it. One module, compiled, which the parser's compiled lane calls too.

An instance key is the experiment's name, or experiment + ``UNIT_SEPARATOR`` + unit (one
bandit per unit). Instances are routed to a flow's number of shards (fixed for its
store's life; ``DEFAULT_SHARDS`` for a new one) by the CRC-32 of the key's UTF-8 (zlib's:
stable across processes and machines, never the salted built-in ``hash``), and each shard
is named with the count, so a store written with another count is recognised by its names
(``shard_layout``).

>>> split_key(instance_key("home", "u7")), shown_key(instance_key("home", "u7"))
(('home', 'u7'), 'home/u7')
>>> shard_of("home:u1", 32) == shard_of("home:u1", 32), shard_of("home:u1", shards=1)
(True, 'shard-000-of-001')
"""

from cpython.object cimport PyObject
from libc.stdint cimport uint32_t

UNIT_SEPARATOR = "\x1f"  # cannot appear in a valid experiment name

#: The shard count of a new store (a flow's count is its store's or changelog's,
#: ``flows.service.runtime.shard_count``). An instance's shard must not change while its
#: state is kept. The shards are what members and workers divide between them: 128 serve
#: up to 128 members; fewer bring each shard call more events (bench/RESULTS.md, "32
#: shards instead of 256").
DEFAULT_SHARDS = 128


cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object text)
    unsigned char* PyUnicode_DATA(object text)


def instance_key(experiment: str, unit: str | None) -> str:
    """The key of an instance: the experiment's name, or experiment + unit (per unit)."""
    return experiment if unit is None else f"{experiment}{UNIT_SEPARATOR}{unit}"


def split_key(key: str) -> tuple:
    """(experiment, unit or None) of an instance key."""
    experiment, separator, unit = key.partition(UNIT_SEPARATOR)
    return experiment, unit if separator else None


def shown_key(key: str) -> str:
    """An instance key as people write it: ``experiment/unit``."""
    return key.replace(UNIT_SEPARATOR, "/")


def shard_name(index: int, shards: int) -> str:
    """The name (Bytewax key, log file) of shard ``index`` of ``shards``.

    >>> shard_name(7, 32)
    'shard-007-of-032'
    """
    return f"shard-{index:03d}-of-{shards:03d}"


cdef dict _NAMES = {}  # shard count: its shards' names, built once
cdef Py_ssize_t _LAST_COUNT = 0  # the count named last, and its names
cdef tuple _LAST_NAMES = ()


cpdef tuple shard_names(Py_ssize_t shards):
    """The names of the ``shards`` shards of a flow, by index (built once per count).

    >>> shard_names(2)
    ('shard-000-of-002', 'shard-001-of-002')
    """
    global _LAST_COUNT, _LAST_NAMES
    if shards == _LAST_COUNT:
        return _LAST_NAMES
    if shards < 1:
        raise ValueError(f"shards must be 1 or more, got {shards}")
    names = _NAMES.get(shards)
    if names is None:
        names = _NAMES[shards] = tuple([shard_name(index, shards) for index in range(shards)])
    _LAST_COUNT, _LAST_NAMES = shards, names
    return names


def shard_layout(shard: str) -> tuple | None:
    """(index, count) of a shard's name (``shard_name``); None for a name that is not one
    (a name without the count, ``shard-NNN``, is of an older layout).

    >>> shard_layout("shard-007-of-032"), shard_layout("shard-100"), shard_layout("shard-040-of-032")
    ((7, 32), None, None)
    """
    head, _, count = shard.partition("-of-")
    index = head[6:]
    if not (head.startswith("shard-") and index.isdigit() and count.isdigit()):
        return None
    if int(index) >= int(count) or shard != shard_name(int(index), int(count)):
        return None
    return int(index), int(count)


def of_layout(shard: str, shards: int) -> bool:
    """Whether ``shard`` is one of the shards of a flow of ``shards`` (not of a store
    written with another shard count, nor a name without the count, ``shard-NNN``).

    >>> of_layout("shard-000-of-032", 32), of_layout("shard-000-of-032", 128)
    (True, False)
    """
    layout = shard_layout(shard)
    return layout is not None and layout[1] == shards


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


cpdef Py_ssize_t shard_index(str key, Py_ssize_t shards=DEFAULT_SHARDS) except -1:
    """The index of an instance key's shard of ``shards``: zlib's CRC-32 of its UTF-8,
    modulo ``shards``. With ``p`` dividing ``shards``, the index modulo ``p`` is the key's
    index of ``p`` shards: an internal partition does not depend on the shard count.

    >>> shard_index("home\x1fu1", 128) % 32 == shard_index("home\x1fu1", 32)
    True
    """
    cdef bytes utf8
    cdef uint32_t crc
    if shards < 1:
        raise ValueError(f"shards must be 1 or more, got {shards}")
    if PyUnicode_IS_ASCII(key):  # its characters are its UTF-8 bytes
        crc = _crc32(PyUnicode_DATA(key), len(key))
    else:
        utf8 = key.encode()
        crc = _crc32(utf8, len(utf8))
    return crc % shards


cpdef Py_ssize_t internal_partition(Py_ssize_t shard, Py_ssize_t partitions) except -1:
    """The internal topic's partition that carries shard index ``shard``'s events, of its
    ``partitions``: the shard modulo them (so with as many partitions as shards, shard s is
    partition s). Members own shards by it (``flows.service.runtime.members``).

    >>> internal_partition(7, 4), internal_partition(7, 32)
    (3, 7)
    """
    if partitions < 1:
        raise ValueError(f"partitions must be 1 or more, got {partitions}")
    return shard % partitions


cpdef str shard_of(str key, Py_ssize_t shards=DEFAULT_SHARDS):
    """The shard (Bytewax key) of an instance key, of ``shards`` (``shard_index``)."""
    cdef Py_ssize_t index = shard_index(key, shards)
    return <str>shard_names(shards)[index]
