# cython: language_level=3, boundscheck=False, wraparound=False
"""Instance keys and shard addressing: which instance an event belongs to, which shard
holds it. One module, compiled, which the parser's compiled lane calls too.

An instance key is the experiment's name, or experiment + ``UNIT_SEPARATOR`` + unit (one
bandit per unit). Instances are routed to a flow's number of shards (fixed for its
store's life; ``DEFAULT_SHARDS`` for a new one) by the CRC-32 of the key's UTF-8 (zlib's:
stable across processes and machines, never the salted built-in ``hash``), and each shard
is named with the count, so a store written with another count is recognised by its names
(``shard_layout``).

Shards are grouped into Bytewax keys (Flink's key groups): the stateful step's key is a
*group* of shards, and one call of a group's logic handles the events of all its shards
in a batch. Shard ``i`` of a flow belongs to group ``i % groups``, ``groups`` being
``KEY_GROUPS`` (or the shard count, if fewer). The count is a constant, not the number
of workers or processes: Bytewax keeps a key's state under its name and places keys by
hashing them, so a key must mean the same shards at every restart, whatever the
cluster's shape. ``KEY_GROUPS`` keys still spread over the workers of a process (they
bound its useful worker count), while each call gets the events of many shards, so
Bytewax's cost per key and per call is paid per group, not per shard.

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
#: The Bytewax keys a flow's shards are grouped into (fewer if it has fewer shards); a
#: constant, so that a key holds the same shards whatever the cluster (see above).
KEY_GROUPS = 8


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
    partition s). Members own shards by it (``flows.service.connectors.members``).

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


cpdef Py_ssize_t group_count(Py_ssize_t shards) except -1:
    """The number of key groups of a flow of ``shards``: ``KEY_GROUPS``, or fewer.

    >>> group_count(128), group_count(3)
    (8, 3)
    """
    if shards < 1:
        raise ValueError(f"shards must be 1 or more, got {shards}")
    return min(KEY_GROUPS, shards)


def group_name(index: int, groups: int) -> str:
    """The name (Bytewax key) of key group ``index`` of ``groups``.

    >>> group_name(3, 8)
    'group-003-of-008'
    """
    return f"group-{index:03d}-of-{groups:03d}"


cdef dict _GROUP_OF = {}  # shard count: {shard name: its group's name}, built once


cdef dict _groups_of(Py_ssize_t shards):
    """{shard name: its group's name} of a flow of ``shards`` (built once per count)."""
    found = _GROUP_OF.get(shards)
    if found is None:
        groups = group_count(shards)
        names = [group_name(index, groups) for index in range(groups)]
        found = _GROUP_OF[shards] = {
            name: names[index % groups] for index, name in enumerate(shard_names(shards))
        }
    return <dict>found


cpdef str group_of(str shard, Py_ssize_t shards=DEFAULT_SHARDS):
    """The key group of shard ``shard`` in a flow of ``shards``: its index modulo the
    group count (a shard of another layout, kept as it is, by its own index).

    >>> group_of("shard-011-of-128", 128), group_of("shard-011-of-032", 4), group_of("shard-013")
    ('group-003-of-008', 'group-003-of-004', 'group-005-of-008')
    """
    found = _groups_of(shards).get(shard)
    if found is not None:
        return <str>found
    index = shard.partition("-of-")[0][6:]
    if not (shard.startswith("shard-") and index.isdigit()):
        raise ValueError(f"{shard!r} is not a shard name (shard-NNN-of-MMM)")
    groups = group_count(shards)
    return group_name(int(index) % groups, groups)


cpdef list in_groups(list parts, Py_ssize_t shards=DEFAULT_SHARDS):
    """(shard, events) items of a flow of ``shards`` as one item per key group: (group,
    [(shard, events), ...]), the groups and each group's shards in their first order.

    >>> in_groups([("shard-001-of-004", [1]), ("shard-002-of-004", [2])], 4)
    [('group-001-of-004', [('shard-001-of-004', [1])]), ('group-002-of-004', [('shard-002-of-004', [2])])]
    >>> in_groups([("shard-008-of-009", [8]), ("shard-000-of-009", [0])], 9)
    [('group-000-of-008', [('shard-008-of-009', [8]), ('shard-000-of-009', [0])])]
    """
    cdef dict groups = {}
    cdef dict names = _groups_of(shards)
    for part in parts:
        shard = part[0]
        group = names.get(shard)
        if group is None:
            group = group_of(shard, shards)
        held = groups.get(group)
        if held is None:
            groups[group] = [part]
        else:
            (<list>held).append(part)
    return list(groups.items())
