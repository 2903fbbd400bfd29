# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The reader's table of caches and shards (`CacheTable`): everything the gather kernels read
about where records are, built once per reader (`runtime/gatherer.py` `Gatherer`).

Boundary: numbers, addresses and names per cache and per shard; no I/O, no records, no numpy
(reader worker processes build it). Its declarations are _ext/datasetrt/_native/table.pxd, so
gather.pyx reads the C arrays (`CacheArrays`) directly, with the GIL released.

Ownership: the table owns its arrays, and keeps alive every object it points into (each cache's
`MappedFile`s and `DecodeState`, and the shards mapped with `map_shard`). It borrows the reader's shard descriptor array (int32, -1 for
a closed shard), which the process's descriptor budget (`runtime/descriptors.py`) writes as it
opens and closes shards: the table holds a buffer view of it, so the array cannot be resized
while the table lives, and the kernels see every open and close without a copy.
"""

from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t
from libc.string cimport memset

from faults cimport F_ARGUMENT, F_TYPE, raise_fault

from datasetrt._native.codec import DecodeState
from datasetrt._native.mapped import MappedFile


cdef void* _zeroed(Py_ssize_t n, size_t item) except NULL:
    """n zeroed items of `item` bytes (one at least, so an empty table still has arrays)."""
    cdef size_t nbytes = <size_t>(n if n > 0 else 1) * item
    cdef void* p = PyMem_Malloc(nbytes)
    if p == NULL:
        raise MemoryError()
    memset(p, 0, nbytes)
    return p


cdef class CacheTable:
    """Per cache and per shard tables of one reader, in catalog order (cache c is the reader's c-th
    cache; its shards are consecutive in the flat shard order).

    Built from: `labels` (per cache: the directory named in messages), `index_rows` (per cache:
    its sample_count), `shard_count` (per cache), and per flat shard `shard_len` (byte_len),
    `shard_ulen` (uncompressed_byte_len), `shard_codec` (codec id), `shard_names` (the file named
    in messages) and `shard_fd` (the reader's int32 descriptor array, borrowed: see the module
    docstring). ConfigError when the lengths disagree. A cache is readable once `map_cache` gave
    it its index (`unmapped` counts the caches still waiting); the caller maps every cache a
    gather names before the gather (`unmapped_in`).
    """

    def __cinit__(self, labels, index_rows, shard_count, shard_len, shard_ulen, shard_codec, shard_names,
                  const int32_t[::1] shard_fd not None):
        cdef Py_ssize_t n = len(labels), m = len(shard_names), c, s, base = 0
        cdef CacheArrays* t = &self.arrays
        self._mapped = NULL
        memset(t, 0, sizeof(CacheArrays))
        if len(index_rows) != n or len(shard_count) != n:
            raise_fault(F_ARGUMENT, f"CacheTable: {n} labels need as many index_rows ({len(index_rows)}) "
                                    f"and shard_count ({len(shard_count)}) entries")
        if sum(shard_count) != m or len(shard_len) != m or len(shard_ulen) != m or len(shard_codec) != m \
                or shard_fd.shape[0] != m:
            raise_fault(F_ARGUMENT, f"CacheTable: the caches' {sum(shard_count)} shards need as many names ({m}), "
                                    f"lengths ({len(shard_len)}, {len(shard_ulen)}), codecs ({len(shard_codec)}) "
                                    f"and descriptors ({shard_fd.shape[0]})")
        t.n_caches, t.n_shards = n, m
        t.index = <const uint8_t**>_zeroed(n, sizeof(uint8_t*))
        t.index_rows = <uint64_t*>_zeroed(n, sizeof(uint64_t))
        t.shard_base = <int64_t*>_zeroed(n, sizeof(int64_t))
        t.shard_count = <int64_t*>_zeroed(n, sizeof(int64_t))
        t.checksums = <const uint8_t**>_zeroed(n, sizeof(uint8_t*))
        t.codec_state = <const void**>_zeroed(n, sizeof(void*))
        t.shard_len = <uint64_t*>_zeroed(m, sizeof(uint64_t))
        t.shard_ulen = <uint64_t*>_zeroed(m, sizeof(uint64_t))
        t.shard_codec = <uint8_t*>_zeroed(m, sizeof(uint8_t))
        t.shard_map = <const uint8_t**>_zeroed(m, sizeof(uint8_t*))
        self._mapped = <uint8_t*>_zeroed(n, sizeof(uint8_t))
        for c in range(n):
            if shard_count[c] < 0:
                raise_fault(F_ARGUMENT, f"CacheTable: cache {c} has a negative shard count {shard_count[c]}")
            t.index_rows[c] = index_rows[c]
            t.shard_base[c] = base
            t.shard_count[c] = shard_count[c]
            base += shard_count[c]
        for s in range(m):
            t.shard_len[s] = shard_len[s]
            t.shard_ulen[s] = shard_ulen[s]
            t.shard_codec[s] = shard_codec[s]
        self._fds = shard_fd
        t.shard_fd = &self._fds[0] if m else NULL
        self.labels = [str(x) for x in labels]
        self.shard_names = [str(x) for x in shard_names]
        self._held = [None] * n
        self._shard_maps = [None] * m
        self.unmapped = n

    def __dealloc__(self):
        cdef CacheArrays* t = &self.arrays
        PyMem_Free(t.index)
        PyMem_Free(t.index_rows)
        PyMem_Free(t.shard_base)
        PyMem_Free(t.shard_count)
        PyMem_Free(t.checksums)
        PyMem_Free(t.codec_state)
        PyMem_Free(t.shard_len)
        PyMem_Free(t.shard_ulen)
        PyMem_Free(t.shard_codec)
        PyMem_Free(t.shard_map)
        PyMem_Free(self._mapped)

    @property
    def n_caches(self):
        return self.arrays.n_caches

    @property
    def n_shards(self):
        return self.arrays.n_shards

    def map_cache(self, Py_ssize_t k, index not None, checksums=None, state=None):
        """Point cache k at its mapped index.bin (`index`, a MappedFile of index_rows[k] rows), its
        mapped checksum sidecar (a MappedFile, or None: its records are not verified) and its codec
        state (a `codec.DecodeState`, or None for codecs without one); the table keeps them alive.
        Their sizes are the caller's to check against the manifest (`CacheHandle` does). O(1)."""
        if not 0 <= k < self.arrays.n_caches:
            raise_fault(F_ARGUMENT, f"CacheTable.map_cache: cache {k} is outside [0, {self.arrays.n_caches})")
        if not isinstance(index, MappedFile) or not isinstance(checksums, (MappedFile, type(None))) \
                or not isinstance(state, (DecodeState, type(None))):
            raise_fault(F_TYPE, "CacheTable.map_cache takes MappedFile index and checksums and a DecodeState")
        self.arrays.index[k] = <const uint8_t*><size_t>index.address
        self.arrays.checksums[k] = <const uint8_t*><size_t>checksums.address if checksums is not None else NULL
        self.arrays.codec_state[k] = <const void*><size_t>state.address if state is not None else NULL
        self._held[k] = (index, checksums, state)
        if self._mapped[k] != 1:
            self._mapped[k] = 1
            self.unmapped -= 1

    def map_shard(self, Py_ssize_t s, shard not None):
        """Point flat shard s at `shard`, the whole shard file mapped read-only (a MappedFile the
        table keeps alive), so the kernels copy its uncompressed records out of the mapping instead
        of reading them with pread. Refused (False, nothing changes) when the mapping is shorter
        than the shard's byte_len: every record the index may name must lie inside it. A mapped
        page of a file truncated later raises SIGBUS in the process that touches it, so only a
        process whose death its parent reports maps shards (a reader worker). O(1)."""
        if not 0 <= s < self.arrays.n_shards:
            raise_fault(F_ARGUMENT, f"CacheTable.map_shard: shard {s} is outside [0, {self.arrays.n_shards})")
        if not isinstance(shard, MappedFile):
            raise_fault(F_TYPE, "CacheTable.map_shard takes a MappedFile")
        if <uint64_t>shard.size < self.arrays.shard_len[s] or shard.address == 0:
            return False
        self.arrays.shard_map[s] = <const uint8_t*><size_t>shard.address
        self._shard_maps[s] = shard
        return True

    @property
    def mapped_shards(self):
        """How many shards are read from their mapping (`map_shard`)."""
        return sum(1 for m in self._shard_maps if m is not None)

    def unmapped_in(self, const int64_t[::1] cache_pos not None):
        """The distinct caches named in `cache_pos` (int64 cache positions) that are not mapped yet,
        in order of first appearance (empty once every cache is mapped). ConfigError for a position
        outside the table. O(rows)."""
        cdef Py_ssize_t i, n = cache_pos.shape[0]
        cdef int64_t k
        out = []
        if not self.unmapped:
            return out
        try:
            for i in range(n):
                k = cache_pos[i]
                if k < 0 or k >= self.arrays.n_caches:
                    raise_fault(F_ARGUMENT, f"cache position {k} is outside the reader's {self.arrays.n_caches} caches")
                if self._mapped[k] == 0:
                    self._mapped[k] = 2  # listed already (reset below)
                    out.append(k)
        finally:
            for k in out:
                self._mapped[k] = 0
        return out

    @property
    def index_addr(self):
        """Per cache, the address its index.bin is mapped at (0: not mapped, or an empty index)."""
        return tuple(<size_t>self.arrays.index[c] for c in range(self.arrays.n_caches))

    @property
    def cksum_addr(self):
        """Per cache, the address its checksum sidecar is mapped at (0: none, or not verified)."""
        return tuple(<size_t>self.arrays.checksums[c] for c in range(self.arrays.n_caches))
