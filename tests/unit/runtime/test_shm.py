"""runtime/shm.py: anonymous shared memory (no name anywhere) and descriptor passing over a task
socket, as the pool and the workers use them."""

from __future__ import annotations

import errno
import gc
import os
from pathlib import Path

import multiprocess as mp
import pytest

from datasetrt.errors import ResourceLimitError
from datasetrt.runtime.shm import (
    attach_shared_memory,
    create_shared_memory,
    recv_fd,
    reserve_shared_memory,
    send_fd,
)

SIZE = 3 * 4096 + 100


@pytest.fixture
def channel():
    """A task channel as the pool makes one: a duplex multiprocess Pipe (a Unix socket pair)."""
    parent_end, worker_end = mp.Pipe(duplex=True)
    yield parent_end, worker_end
    parent_end.close()
    worker_end.close()


def mapped_names() -> set[str]:
    return {
        line.split()[-2] for line in Path("/proc/self/maps").read_text().splitlines() if "/memfd:datasetrt-" in line
    }


def test_shared_memory_has_no_name_and_its_pages_are_reserved():
    mapping, fd = create_shared_memory("unit-ring", SIZE)
    try:
        st = os.fstat(fd)
        assert st.st_size == SIZE and st.st_nlink == 0  # a file no directory names
        assert st.st_blocks * 512 >= SIZE  # posix_fallocate reserved every page up front
        assert f"/memfd:datasetrt-{os.getpid()}-unit-ring" in mapped_names()
        assert not list(Path("/dev/shm").glob(f"datasetrt-{os.getpid()}-*"))
        assert os.readlink(f"/proc/self/fd/{fd}").startswith(f"/memfd:datasetrt-{os.getpid()}-unit-ring")
    finally:
        mapping.close()
        os.close(fd)
    gc.collect()
    assert f"/memfd:datasetrt-{os.getpid()}-unit-ring" not in mapped_names()


def test_unreserved_shared_memory_is_sized_and_reserved_range_by_range():
    """reserve=False (a ring): the file has its size and no page until a range is reserved."""
    mapping, fd = create_shared_memory("unit-lazy", 4 * 65536, reserve=False)
    try:
        assert os.fstat(fd).st_size == 4 * 65536 and os.fstat(fd).st_blocks == 0
        reserve_shared_memory(fd, 65536, 65536, "unit-lazy slot 1")
        assert 65536 <= os.fstat(fd).st_blocks * 512 < 2 * 65536
        assert os.fstat(fd).st_size == 4 * 65536
    finally:
        mapping.close()
        os.close(fd)


def test_a_descriptor_sent_over_the_task_socket_maps_the_same_memory(channel):
    parent_end, worker_end = channel
    mapping, fd = create_shared_memory("unit-pass", SIZE)
    try:
        parent_end.send_bytes(b"OpenRun")  # a message, then the descriptor: the worker's order
        send_fd(parent_end, fd)
        parent_end.send_bytes(b"ReadTask")
        assert worker_end.recv_bytes() == b"OpenRun"
        received = recv_fd(worker_end)
        assert received != fd and os.fstat(received).st_ino == os.fstat(fd).st_ino
        assert worker_end.recv_bytes() == b"ReadTask"  # the stream stays in step
        view = attach_shared_memory(received, writable=True)
        with pytest.raises(OSError):
            os.fstat(received)  # attach closed it: the mapping alone keeps the memory
        view[SIZE - 5 : SIZE] = b"hello"
        assert mapping[SIZE - 5 : SIZE] == b"hello"
        view.close()
    finally:
        mapping.close()
        os.close(fd)


def test_recv_fd_refuses_a_plain_message_without_leaking(channel):
    parent_end, worker_end = channel
    before = len(os.listdir("/proc/self/fd"))
    parent_end.send_bytes(b"not a descriptor")
    with pytest.raises(OSError, match="expected one shared-memory descriptor from the parent, got 0"):
        recv_fd(worker_end)
    assert len(os.listdir("/proc/self/fd")) == before


def test_recv_fd_raises_eof_when_the_sender_is_gone(channel):
    parent_end, worker_end = channel
    parent_end.close()
    with pytest.raises(EOFError):
        recv_fd(worker_end)


def test_memory_that_cannot_be_reserved_is_a_resource_limit_naming_the_os_error(monkeypatch):
    def no_space(fd, offset, size):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    with pytest.raises(ResourceLimitError) as info:
        create_shared_memory("unit-ring", 3 << 20)
    assert str(info.value) == (
        "cannot reserve 3.0 MiB of shared memory for the reader's unit-ring: "
        "No space left on device (os error 28); lower prefetch_size / num_workers"
    )


def test_a_reservation_past_what_the_kernel_can_give_is_refused_before_any_page_is_reserved(monkeypatch):
    """Past what the kernel can give, posix_fallocate on a memfd does not fail: it waits on
    reclaim and the OOM killer ends some process. So the size is checked first."""
    import psutil

    def must_not_reserve(fd, offset, size):
        raise AssertionError(f"{size} bytes reserved before the size was checked")

    monkeypatch.setattr(os, "posix_fallocate", must_not_reserve)
    size = psutil.virtual_memory().total + psutil.swap_memory().total + (1 << 30)
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(ResourceLimitError, match=r"the kernel can give [0-9.]+ MiB now") as info:
        create_shared_memory("unit-huge", size)
    assert f"cannot reserve {size / 2**20:.1f} MiB of shared memory for the reader's unit-huge" in str(info.value)
    assert len(os.listdir("/proc/self/fd")) == before


def test_the_reservation_check_uses_the_kernels_figure(monkeypatch):
    from datasetrt.runtime import shm

    monkeypatch.setattr(shm, "reservable_bytes", lambda: 1 << 20)
    with pytest.raises(ResourceLimitError) as info:
        create_shared_memory("unit-ring", 3 << 20)
    assert str(info.value) == (
        "cannot reserve 3.0 MiB of shared memory for the reader's unit-ring: the kernel can give 1.0 MiB now "
        "(available memory and swap, within the memory cgroup's limit); lower prefetch_size / num_workers, "
        "or free memory"
    )
    monkeypatch.setattr(shm, "reservable_bytes", lambda: None)  # unknown: the reservation decides
    mapping, fd = create_shared_memory("unit-ring", 3 << 20)
    mapping.close()
    os.close(fd)
