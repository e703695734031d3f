# Instance keys and shard addressing, compiled: see keys.pyx.

cpdef Py_ssize_t shard_index(str key, Py_ssize_t shards=*) except -1
cpdef str shard_of(str key, Py_ssize_t shards=*)
cpdef tuple shard_names(Py_ssize_t shards)
cpdef Py_ssize_t internal_partition(Py_ssize_t shard, Py_ssize_t partitions) except -1
cpdef Py_ssize_t group_count(Py_ssize_t shards) except -1
cpdef str group_of(str shard, Py_ssize_t shards=*)
cpdef list in_groups(list parts, Py_ssize_t shards=*)
