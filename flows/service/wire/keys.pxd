# Instance keys and shard addressing, compiled: see keys.pyx.

cpdef str shard_of(str key, Py_ssize_t shards=*)
