"""_native.mapped: whole files mapped read-only, holding no descriptor; OS failures keep their errno."""

from __future__ import annotations

import errno
import os

import pytest

from datasetrt._native.mapped import MappedFile
from datasetrt.errors import CacheIOError


def test_a_file_is_mapped_read_only_and_keeps_no_descriptor(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"abcdef")
    before = len(os.listdir("/proc/self/fd"))
    mapped = MappedFile(path)
    assert len(os.listdir("/proc/self/fd")) == before
    assert (mapped.size, mapped.path, bytes(mapped)) == (6, str(path), b"abcdef") and mapped.address
    with memoryview(mapped) as view:
        assert view.readonly
        with pytest.raises(BufferError, match="still exported"):
            mapped.close()
    mapped.close()
    assert mapped.address == 0


def test_an_empty_file_maps_to_an_empty_buffer(tmp_path):
    path = tmp_path / "empty"
    path.write_bytes(b"")
    mapped = MappedFile(path)
    assert (mapped.size, mapped.address, bytes(mapped)) == (0, 0, b"")


def test_an_os_failure_is_a_cache_io_error_with_its_errno_and_path(tmp_path):
    missing = tmp_path / "missing.bin"
    with pytest.raises(CacheIOError) as info:
        MappedFile(missing)
    assert str(info.value) == f"I/O error: {os.strerror(errno.ENOENT)} (os error {errno.ENOENT}): {missing}"
    assert (info.value.errno, info.value.path) == (errno.ENOENT, str(missing))
