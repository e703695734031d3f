# Instance keys and shard addressing, compiled: see keys.pyx.

cpdef Py_ssize_t shard_index(str key, Py_ssize_t shards=*) except -1
cpdef str shard_of(str key, Py_ssize_t shards=*)
