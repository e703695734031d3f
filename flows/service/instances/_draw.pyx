# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: embedsignature=True
"""The request's draw, compiled: ``uniform_draw`` returns the same float, bit for bit, as

    digest = hashlib.blake2b(f"{seed}\\x00{instance}\\x00{request_id}".encode(),
                             digest_size=8).digest()
    (int.from_bytes(digest, "big") >> 11) / float(1 << 53)

for every input (served logs are replayed and must give the same answers), without the
formatting, the bytes object and the hashlib object: the three parts are hashed in place,
one after another, by the C BLAKE2b in ``_blake2b.h`` (adapted from the BLAKE2 reference
implementation, ref/blake2b-ref.c of https://github.com/BLAKE2/BLAKE2, used under CC0 1.0).

Formatting and encoding follow the f-string and ``str.encode()``: an exact ``int`` seed in
int64 is written out in C, any other seed (huge ints, bool, int subclasses, anything) and
any instance or request_id that is not an exact ``str`` go through ``f"{x}"``; text is
encoded as strict UTF-8. Text that cannot be encoded (lone surrogates) is handed to the
hashlib formula itself, so the exception raised is the very one it raises.
"""

import hashlib

from libc.stdint cimport uint8_t, uint64_t

from flows.service.wire._int_text cimport write_int64

cdef extern from "_blake2b.h":
    ctypedef struct tsi_blake2b_state:
        pass
    void tsi_blake2b_init(tsi_blake2b_state *S, uint8_t outlen) noexcept nogil
    void tsi_blake2b_update(tsi_blake2b_state *S, const uint8_t *data, size_t n) noexcept nogil
    uint64_t tsi_blake2b_final_h0(tsi_blake2b_state *S) noexcept nogil
    uint64_t tsi_blake2b_digest8_be(uint64_t h0) noexcept nogil

cdef extern from "Python.h":
    # no except clause: a NULL (lone surrogate) is handled below, not raised from here
    const char *utf8_or_null "PyUnicode_AsUTF8AndSize" (object s, Py_ssize_t *size) noexcept
    bint PyUnicode_CheckExact(object o) noexcept
    bint PyLong_CheckExact(object o) noexcept
    long long PyLong_AsLongLongAndOverflow(object o, int *overflow) noexcept
    void PyErr_Clear() noexcept

cdef const char *NUL = b"\x00"  # a C string literal: static, never freed
cdef double TWO_POW_MINUS_53 = 1.0 / 9007199254740992.0  # exact: 2**-53


def _hashlib_draw(seed, instance, request_id):
    """The reference formula (hashlib), used to raise its own exception on bad text."""
    digest = hashlib.blake2b(
        f"{seed}\x00{instance}\x00{request_id}".encode(), digest_size=8
    ).digest()
    return (int.from_bytes(digest, "big") >> 11) / float(1 << 53)


cpdef double uniform_draw(object seed, object instance, object request_id) except? -1.0:
    """u in [0, 1) hashed from (seed, instance, request_id): a retried or replayed request
    gets the same u. Bit-identical to the hashlib formula (the module's docstring).

    >>> import hashlib
    >>> digest = hashlib.blake2b("7\\x00home\\x00r1".encode(), digest_size=8).digest()
    >>> uniform_draw(7, "home", "r1") == (int.from_bytes(digest, "big") >> 11) / 2.0**53
    True
    >>> uniform_draw(-3, "hôme", "r" * 300) == _hashlib_draw(-3, "hôme", "r" * 300)
    True
    """
    cdef char seed_buf[24]
    cdef const char *seed_p = NULL
    cdef const char *inst_p
    cdef const char *rid_p
    cdef Py_ssize_t seed_n = 0, inst_n = 0, rid_n = 0
    cdef int overflow = 1
    cdef long long v = 0
    cdef tsi_blake2b_state S
    cdef object seed0 = seed, instance0 = instance, request_id0 = request_id

    # format the three parts first, as the f-string does, then encode
    if PyLong_CheckExact(seed):
        v = PyLong_AsLongLongAndOverflow(seed, &overflow)
    if overflow == 0:
        seed_n = write_int64(v, seed_buf + 24)
        seed_p = seed_buf + 24 - seed_n
    else:
        seed = f"{seed}"
    if not PyUnicode_CheckExact(instance):
        instance = f"{instance}"
    if not PyUnicode_CheckExact(request_id):
        request_id = f"{request_id}"

    if overflow != 0:
        seed_p = utf8_or_null(seed, &seed_n)
        if seed_p == NULL:
            PyErr_Clear()
            return _hashlib_draw(seed0, instance0, request_id0)
    inst_p = utf8_or_null(instance, &inst_n)
    if inst_p == NULL:
        PyErr_Clear()
        return _hashlib_draw(seed0, instance0, request_id0)
    rid_p = utf8_or_null(request_id, &rid_n)
    if rid_p == NULL:
        PyErr_Clear()
        return _hashlib_draw(seed0, instance0, request_id0)

    tsi_blake2b_init(&S, 8)
    tsi_blake2b_update(&S, <const uint8_t *> seed_p, <size_t> seed_n)
    tsi_blake2b_update(&S, <const uint8_t *> NUL, 1)
    tsi_blake2b_update(&S, <const uint8_t *> inst_p, <size_t> inst_n)
    tsi_blake2b_update(&S, <const uint8_t *> NUL, 1)
    tsi_blake2b_update(&S, <const uint8_t *> rid_p, <size_t> rid_n)
    return <double> (tsi_blake2b_digest8_be(tsi_blake2b_final_h0(&S)) >> 11) * TWO_POW_MINUS_53
