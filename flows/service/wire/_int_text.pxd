# Decimal text of an int64 written in C, shared by the compiled modules that write one
# (the draw's seed, the answers' JSON): a .pxd of inline code, no module of its own.


cdef inline Py_ssize_t write_int64(long long v, char* end) noexcept nogil:
    """Writes v in decimal ending just before ``end`` (as str(v)); returns its length."""
    cdef unsigned long long mag = (0ULL - <unsigned long long>v) if v < 0 else <unsigned long long>v
    cdef char* p = end
    while True:
        p -= 1
        p[0] = <char>(48 + mag % 10)
        mag //= 10
        if mag == 0:
            break
    if v < 0:
        p -= 1
        p[0] = 45  # '-'
    return end - p
