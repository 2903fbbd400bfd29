# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Whole files mapped read-only (`MappedFile`): how readers hold a cache's index.bin and checksum
sidecar.

Boundary: one path in, one read-only mapping out; knows no cache layout, no tables, no processes.

A mapping keeps no file descriptor (it is closed right after `mmap`), so any number of open caches
cost no descriptors; it is MAP_SHARED, so every process reading the same file shares its pages
through the page cache. Only files checked against their manifest are mapped (`CacheHandle`): a
mapped file truncated under a reader raises SIGBUS in the process touching it, which is why shards
are read with `pread` in the user's processes and mapped only in reader workers, whose death the
parent reports (runtime/gatherer.py `map_shards`).
"""

from cpython.buffer cimport PyBUF_WRITABLE
from libc.errno cimport errno
from posix.fcntl cimport O_CLOEXEC, O_NONBLOCK, O_RDONLY, open
from posix.mman cimport MAP_FAILED, MAP_SHARED, PROT_READ, mmap, munmap
from posix.stat cimport S_ISREG, fstat, struct_stat
from posix.unistd cimport close

from datasetrt.errors import CacheFormatError, CacheIOError


cdef class MappedFile:
    """A whole file mapped read-only and shared (MAP_SHARED), holding no file descriptor.

    Invariant: `size` is the file size at map time; the mapping lives until `close()` or
    deallocation. Exposes the buffer protocol as read-only bytes (numpy.frombuffer works).
    A zero-length file maps to an empty buffer (`address` 0). An OS failure (open, fstat, mmap)
    is a CacheIOError carrying its `errno` and `path`. Only a regular file is mapped: it is opened
    without blocking (a FIFO put in its place returns at once) and anything else is a
    CacheFormatError naming it.
    """
    cdef void* addr
    cdef readonly Py_ssize_t size
    cdef readonly str path
    cdef Py_ssize_t _exports
    cdef Py_ssize_t _shape[1]

    def __cinit__(self, path):
        self.addr = NULL
        self.size = 0
        self._exports = 0
        self.path = str(path)
        encoded = self.path.encode()
        cdef const char* c_path = encoded
        cdef int fd
        cdef struct_stat st
        with nogil:
            fd = open(c_path, O_RDONLY | O_NONBLOCK | O_CLOEXEC)
        if fd < 0:
            raise CacheIOError.from_os(errno, self.path)
        try:
            if fstat(fd, &st) != 0:
                raise CacheIOError.from_os(errno, self.path)
            if not S_ISREG(st.st_mode):
                raise CacheFormatError(f"cache file is not a regular file: {self.path}")
            self.size = st.st_size
            if self.size > 0:
                self.addr = mmap(NULL, <size_t>self.size, PROT_READ, MAP_SHARED, fd, 0)
                if self.addr == MAP_FAILED:
                    self.addr = NULL
                    raise CacheIOError.from_os(errno, self.path)
        finally:
            close(fd)

    @property
    def address(self):
        """Base address of the mapping (0 for an empty file); valid while this object is open."""
        return <size_t>self.addr

    def close(self):
        """Unmap now; refused while a buffer export (numpy view) is alive."""
        if self._exports:
            raise BufferError(f"{self.path}: mapping still exported to {self._exports} buffer(s)")
        if self.addr != NULL:
            munmap(self.addr, <size_t>self.size)
            self.addr = NULL

    def __dealloc__(self):
        if self.addr != NULL:
            munmap(self.addr, <size_t>self.size)
            self.addr = NULL

    def __getbuffer__(self, Py_buffer* view, int flags):
        if flags & PyBUF_WRITABLE:
            raise BufferError("MappedFile is read-only")
        if self.addr == NULL and self.size > 0:
            raise ValueError(f"{self.path}: mapping is closed")
        self._shape[0] = self.size
        view.buf = self.addr if self.addr != NULL else <void*>&self._shape[0]
        view.obj = self
        view.len = self.size
        view.readonly = 1
        view.itemsize = 1
        view.format = "B"
        view.ndim = 1
        view.shape = self._shape
        view.strides = NULL
        view.suboffsets = NULL
        view.internal = NULL
        self._exports += 1

    def __releasebuffer__(self, Py_buffer* view):
        self._exports -= 1
