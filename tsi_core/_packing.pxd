# cython: language_level=3
"""C-level declarations of the packed layout (``_packing.pyx``), for ``_bandit.pyx``."""

from tsi_core._kernel cimport Kernel

cdef bytes packed_row(Kernel kernel, const double* row)
cdef int row_from_bytes(Kernel kernel, object blob, double* row, object shape) except -1
