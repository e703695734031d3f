# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, embedsignature=True
"""An instance's row as bytes and back (``Bandit.pack``): the layout stored states keep.

Every layout starts with a head of 48 bytes: ψ, V/D² and D's mantissa as float64, then
D's exponent and the update and round counters as int64, all little-endian. The top byte
of the rounds counter names the layout of what follows (a count is at most 2^53, so that
byte of a count is 0):

- 0, **columns**: the rest of the row as float64: the class's state, then with several
  contexts (the Tsallis learner) each context's clock, mean and count, then (the Tsallis
  learner) the number of arms with a gap, each arm's mean squared gap and its count of
  gaps. Bytes of earlier releases, which lack the blocks added since, are told apart by
  their size and get them from what they hold (``Kernel.fill_clocks``, ``fill_means``,
  ``fill_arm_stats``).
- 1, **compact arms** (what the Tsallis learner writes): the state and the contexts'
  columns as float64, then for each arm its count of gaps as a varint (7 bits a byte, low
  first, the shortest form) and, only if that count is above 0, its mean squared gap as
  float64. The number of arms with a gap is how many counts are above 0. An arm's count
  takes 8 bytes as a column and 1 to 3 as a varint for counts below 2^21.

>>> from tsi_core import Bandit
>>> len(Bandit(10, variant="robust").pack()), len(Bandit(10).pack())
(128, 138)
>>> b = Bandit(10); b.update(b.select(u=0.1), 1.0); b.update(b.select(u=0.9), 3.0)
>>> len(b.pack())  # one arm has a gap: its count (1 byte) and its mean square (8)
146
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.math cimport INFINITY, isnan
from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memcpy

from tsi_core._kernel cimport (
    C_D_EXP, C_D_MANT, C_HEAD, C_N_ROUNDS, C_N_UPDATES, C_PSI, C_VN, Kernel,
)

MAX_COUNT = 2**53  # counters live in the kernel's float64 rows: exact up to here
cdef int64_t _MAX_COUNT = MAX_COUNT
cdef enum:
    PACKED_HEAD = 48  # ψ, V/D², D's mantissa (float64); D's exponent, updates, rounds (int64)
    LAYOUT_AT = 47    # the layout's tag: the top byte of the rounds counter
    COLUMNS = 0
    COMPACT_ARMS = 1
cdef uint64_t ROUNDS_MASK = (<uint64_t>1 << 56) - 1


cdef inline void _put_u64(unsigned char* at, uint64_t value) noexcept:
    """``value`` little-endian at ``at`` (one store on a little-endian machine)."""
    cdef int i
    for i in range(8):
        at[i] = (value >> (8 * i)) & 0xFF


cdef inline uint64_t _get_u64(const unsigned char* at) noexcept:
    cdef uint64_t value = 0
    cdef int i
    for i in range(8):
        value |= (<uint64_t>at[i]) << (8 * i)
    return value


cdef inline void _put_double(unsigned char* at, double value) noexcept:
    cdef uint64_t bits
    memcpy(&bits, &value, 8)
    _put_u64(at, bits)


cdef inline double _get_double(const unsigned char* at) noexcept:
    cdef uint64_t bits = _get_u64(at)
    cdef double value
    memcpy(&value, &bits, 8)
    return value


cdef inline Py_ssize_t _columns_before_arms(Kernel kernel) noexcept:
    """The row's columns after the head and before the arms' block."""
    cdef Py_ssize_t a = kernel.n_arm_stats
    return kernel.width - C_HEAD - (2 * a + 1 if a else 0)


cdef Py_ssize_t _arms_size(const double* counts, Py_ssize_t m) noexcept:
    """The bytes of the compact arms' block whose gap counts are ``counts``."""
    cdef Py_ssize_t i, size = 0
    cdef uint64_t count
    for i in range(m):
        count = <uint64_t>counts[i]
        size += 9 if count else 1
        while count >= 0x80:
            count >>= 7
            size += 1
    return size


cdef bytes packed_row(Kernel kernel, const double* row):
    """The bytes of the instance ``row``: compact arms for the Tsallis learner, columns
    for every other."""
    cdef Py_ssize_t i, m = kernel.n_arm_stats, n = _columns_before_arms(kernel)
    cdef const double* squares = row + C_HEAD + n + 1
    cdef uint64_t count, tag = COMPACT_ARMS if m else COLUMNS
    cdef bytes out = PyBytes_FromStringAndSize(
        NULL, PACKED_HEAD + 8 * n + (_arms_size(squares + m, m) if m else 0))
    cdef unsigned char* at = <unsigned char*>PyBytes_AS_STRING(out)
    _put_double(at, row[C_PSI])
    _put_double(at + 8, row[C_VN])
    _put_double(at + 16, row[C_D_MANT])
    _put_u64(at + 24, <uint64_t><int64_t>row[C_D_EXP])
    _put_u64(at + 32, <uint64_t><int64_t>row[C_N_UPDATES])
    _put_u64(at + 40, <uint64_t><int64_t>row[C_N_ROUNDS] | tag << 56)
    for i in range(n):
        _put_double(at + PACKED_HEAD + 8 * i, row[C_HEAD + i])
    at += PACKED_HEAD + 8 * n
    for i in range(m):
        count = <uint64_t>squares[m + i]
        while count >= 0x80:
            at[0] = (count & 0x7F) | 0x80
            count >>= 7
            at += 1
        at[0] = count
        at += 1
        if squares[m + i] > 0.0:
            _put_double(at, squares[i])
            at += 8
    return out


cdef Py_ssize_t _read_count(const unsigned char** at, const unsigned char* end) except -1:
    """The varint at ``*at`` (moved past it); ValueError if it runs past ``end``, is not
    in its shortest form or is above 2^53."""
    cdef uint64_t count = 0, byte = 0x80
    cdef int shift = 0
    while byte & 0x80:
        if at[0] == end or shift > 56:
            raise ValueError("packed arm gap counts end early or run past 2^63")
        byte = at[0][0]
        at[0] += 1
        if byte == 0 and shift:
            raise ValueError("a packed arm gap count is not in its shortest form")
        count |= (byte & 0x7F) << shift
        shift += 7
    if count > <uint64_t>_MAX_COUNT:
        raise ValueError(f"a packed arm gap count is above 2^53: {count}")
    return <Py_ssize_t>count


cdef int _read_compact_arms(Kernel kernel, const unsigned char* at, const unsigned char* end,
                            double* block) except -1:
    """The arms' block (the number with a gap, the mean squares, the counts) from the
    compact arms at ``at``, which must end at ``end``."""
    cdef Py_ssize_t i, m = kernel.n_arm_stats, count
    block[0] = 0.0
    for i in range(m):
        count = _read_count(&at, end)
        block[1 + m + i], block[1 + i] = count, 0.0
        if count and end - at < 8:
            raise ValueError(f"packed arm statistics end early, at arm {i}")
        if count:
            block[1 + i] = _get_double(at)
            block[0] += 1.0
            at += 8
    if at != end:
        raise ValueError(f"{end - at} bytes after the packed arm statistics")
    return 0


cdef Py_ssize_t _stored_columns(Kernel kernel, Py_ssize_t size, object shape) except -1:
    """The columns after the head that ``size`` bytes of columns hold: the kernel's every
    one, or as many as a row written before the arms' gap statistics had (and before the
    context means, or also the clocks); ValueError for any other size."""
    cdef Py_ssize_t n_state = kernel.width - C_HEAD, c = kernel.n_clocks
    cdef Py_ssize_t n_old = _columns_before_arms(kernel)
    cdef tuple older = (n_old, n_old - 2 * c, n_old - 3 * c)  # no arms (means, clocks)
    if size == PACKED_HEAD + 8 * n_state:
        return n_state
    if (c or n_old < n_state) and size in [PACKED_HEAD + 8 * n for n in older]:
        return (size - PACKED_HEAD) // 8
    raise ValueError(f"a packed {shape} bandit is {PACKED_HEAD + 8 * n_state} bytes, got {size}")


cdef int _read_columns(Kernel kernel, const unsigned char* at, Py_ssize_t size, double* row,
                       object shape) except -1:
    """The columns of bytes of layout 0 into ``row``, the blocks they lack filled in."""
    cdef Py_ssize_t i, c = kernel.n_clocks, n_old = _columns_before_arms(kernel)
    cdef Py_ssize_t n_stored = _stored_columns(kernel, size, shape)
    for i in range(n_stored):
        row[C_HEAD + i] = _get_double(at + PACKED_HEAD + 8 * i)
    if n_stored < n_old - 2 * c:
        kernel.fill_clocks(row[C_VN], row + C_HEAD + kernel.n_state)
    if n_stored < n_old:
        kernel.fill_means(row[C_PSI], row + C_HEAD + kernel.n_state + c)
    if n_stored < kernel.width - C_HEAD:
        kernel.fill_arm_stats(row[C_D_MANT] != 0.0, row + C_HEAD + n_old)
    return 0


cdef int _read_body(Kernel kernel, bytes blob, double* row, object shape) except -1:
    """The columns after the head, in the layout the head's tag names."""
    cdef Py_ssize_t i, size = len(blob), n = _columns_before_arms(kernel)
    cdef const unsigned char* at = <const unsigned char*>PyBytes_AS_STRING(blob)
    cdef int tag = at[LAYOUT_AT]
    if tag == COLUMNS:
        return _read_columns(kernel, at, size, row, shape)
    if tag != COMPACT_ARMS or not kernel.n_arm_stats or size < PACKED_HEAD + 8 * n:
        raise ValueError(f"packed bytes of layout {tag} and {size} bytes: a packed {shape} "
                         f"bandit has layout {COMPACT_ARMS if kernel.n_arm_stats else COLUMNS}"
                         f" and at least {PACKED_HEAD + 8 * n} bytes")
    for i in range(n):
        row[C_HEAD + i] = _get_double(at + PACKED_HEAD + 8 * i)
    return _read_compact_arms(kernel, at + PACKED_HEAD + 8 * n, at + size, row + C_HEAD + n)


cdef int _check_row(Kernel kernel, const double* row, int64_t n_updates,
                    int64_t n_rounds) except -1:
    """ValueError naming the first value of ``row`` (its counters as read) no instance can
    hold."""
    cdef Py_ssize_t c = kernel.n_clocks, n_old = _columns_before_arms(kernel)
    counted = 0 <= n_updates <= _MAX_COUNT and 0 <= n_rounds <= _MAX_COUNT
    problem = kernel.state_problem_of(row + C_HEAD)
    if problem is None and c:
        problem = kernel.clocks_problem_of(row + C_HEAD + kernel.n_state)
    if problem is None and c and counted:
        problem = kernel.means_problem_of(row + C_HEAD + kernel.n_state + c, n_updates)
    if problem is None and kernel.n_arm_stats and counted:
        problem = kernel.arm_stats_problem_of(row + C_HEAD + n_old, n_updates)
    if not counted or problem is not None:
        raise ValueError(
            f"packed counters or weights invalid: {n_updates}, {n_rounds}, {problem}"
        )
    return 0


cdef int row_from_bytes(Kernel kernel, object blob, double* row, object shape) except -1:
    """Fill ``row`` (``kernel.width`` values) from ``packed_row`` bytes of any release;
    ValueError for bytes of another layout or size, or values no instance can hold
    (``shape``, the class's state shape, names the bandit in the message)."""
    if type(blob) is not bytes or len(<bytes>blob) < PACKED_HEAD:
        raise ValueError(f"a packed {shape} bandit is bytes of a known layout, got {blob!r:.80}")
    cdef const unsigned char* at = <const unsigned char*>PyBytes_AS_STRING(blob)
    cdef double psi = _get_double(at), vn = _get_double(at + 8), d_mant = _get_double(at + 16)
    if isnan(psi) or not (0.0 <= vn < INFINITY) or not (0.0 <= d_mant < 1.0):
        raise ValueError(f"packed statistics out of range: psi={psi}, vn={vn}, d={d_mant}")
    row[C_PSI], row[C_VN], row[C_D_MANT] = psi, vn, d_mant
    cdef int64_t n_updates = <int64_t>_get_u64(at + 32)
    cdef int64_t n_rounds = <int64_t>(_get_u64(at + 40) & ROUNDS_MASK)
    row[C_D_EXP] = <int64_t>_get_u64(at + 24)
    row[C_N_UPDATES], row[C_N_ROUNDS] = n_updates, n_rounds
    _read_body(kernel, <bytes>blob, row, shape)
    return _check_row(kernel, row, n_updates, n_rounds)
