"""format/files.py: regular files only, links judged by where they resolve, reads bounded by the
declared size. FIFOs here always have a writer held open by the test, so even a regressed opener
would not block: what is checked is that they are refused, not read."""

from __future__ import annotations

import errno
import hashlib
import os

import pytest

from datasetrt.errors import CacheFormatError, CacheIOError
from datasetrt.format import files


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "fifo"
    os.mkfifo(path)
    fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)  # a reader and writer: nothing can block on it
    yield path
    os.close(fd)


def test_read_regular_reads_exactly_the_declared_size(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    data, st = files.read_regular(path, size=100)
    assert data == b"x" * 100 and st.st_size == 100
    assert files.read_regular(path, max_bytes=100)[0] == data
    with pytest.raises(CacheFormatError, match=f"changed on disk since it was opened \\(100 bytes, was 99\\): {path}"):
        files.read_regular(path, size=99)
    with pytest.raises(CacheFormatError, match=f"100 bytes, more than the 99 it may hold: {path}"):
        files.read_regular(path, max_bytes=99)
    (tmp_path / "empty").touch()
    assert files.read_regular(tmp_path / "empty", size=0)[0] == b""


def test_read_regular_refuses_special_files(fifo):
    with pytest.raises(CacheFormatError, match=f"cache file is a FIFO, not a regular file: {fifo}"):
        files.read_regular(fifo)
    with pytest.raises(CacheFormatError, match="cache file is a character device, not a regular file: /dev/zero"):
        files.read_regular("/dev/zero", max_bytes=10)
    with pytest.raises(CacheFormatError, match="a character device"):
        files.sha256_regular("/dev/zero", 0)


def test_directories_are_eisdir_and_missing_files_enoent(tmp_path):
    with pytest.raises(CacheIOError) as info:
        files.read_regular(tmp_path)
    assert info.value.errno == errno.EISDIR and info.value.path == str(tmp_path)
    with pytest.raises(CacheIOError) as info:
        files.check_file(str(tmp_path / "absent"), None)
    assert info.value.errno == errno.ENOENT


def test_check_file_follows_links_inside_and_refuses_links_out(tmp_path, fifo):
    root = tmp_path / "cache"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "real").write_bytes(b"abc")
    (root / "inside").symlink_to(root / "sub" / "real")
    (root / "relative").symlink_to("sub/real")
    outside = tmp_path / "outside"
    outside.write_bytes(b"abc")
    (root / "out").symlink_to(outside)
    (root / "fifo").symlink_to(fifo)
    inside = files.resolved_dir(root)
    assert files.check_file(str(root / "inside"), inside).st_size == 3
    assert files.check_file(str(root / "relative"), inside).st_size == 3
    with pytest.raises(CacheFormatError, match=f"symbolic link to {outside}, outside the cache directory {inside}"):
        files.check_file(str(root / "out"), inside)
    assert files.check_file(str(root / "out"), None).st_size == 3  # allowed: any target, still a regular file
    with pytest.raises(CacheFormatError, match="is a FIFO"):
        files.check_file(str(root / "fifo"), None)
    # a sibling whose name merely starts like the cache directory is outside it
    (tmp_path / "cache2").mkdir()
    (tmp_path / "cache2" / "f").write_bytes(b"")
    (root / "sibling").symlink_to(tmp_path / "cache2" / "f")
    with pytest.raises(CacheFormatError, match="outside the cache directory"):
        files.check_file(str(root / "sibling"), inside)


def test_check_dir(tmp_path):
    root = tmp_path / "cache"
    (root / "real").mkdir(parents=True)
    (root / "shards").symlink_to(root / "real")
    files.check_dir(str(root / "shards"), files.resolved_dir(root))
    (root / "away").symlink_to(tmp_path)
    with pytest.raises(CacheFormatError, match="symbolic link to"):
        files.check_dir(str(root / "away"), files.resolved_dir(root))
    (root / "file").write_bytes(b"")
    with pytest.raises(CacheFormatError, match="not a directory"):
        files.check_dir(str(root / "file"), None)


def test_sha256_regular_reads_at_most_the_declared_size(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"y" * 1000)
    assert files.sha256_regular(path, 1000) == hashlib.sha256(b"y" * 1000).hexdigest()
    with pytest.raises(CacheFormatError, match="changed on disk since it was opened"):
        files.sha256_regular(path, 999)


def test_kind_of_names_each_kind():
    import stat

    kinds = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device"}
    kinds |= {stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket", stat.S_IFLNK: "a symbolic link"}
    for mode, words in kinds.items():
        assert files.kind_of(mode) == words


def test_resolved_dir_with_a_memo_equals_realpath(tmp_path, monkeypatch):
    real = tmp_path / "real"
    (real / "a").mkdir(parents=True)
    (real / "b").mkdir()
    os.symlink(real, tmp_path / "via")  # a parent that is a link
    os.symlink(real / "a", tmp_path / "link_a")  # a cache directory that is itself a link
    monkeypatch.chdir(tmp_path)
    memo: dict[str, str] = {}
    paths = [
        tmp_path / "via" / "a",
        tmp_path / "via" / "b",
        "via/a",
        "via/./b/",
        tmp_path / "link_a",
        tmp_path / "via" / "a" / ".." / "b",
        tmp_path / "missing",
    ]
    for path in paths:
        assert files.resolved_dir(path, memo) == os.path.realpath(path), path
    assert memo == {str(tmp_path / "via"): str(real)}  # one parent resolved, once


def test_check_dir_missing_ok_passes_only_a_missing_entry(tmp_path):
    files.check_dir(str(tmp_path / "shards"), str(tmp_path), missing_ok=True)
    with pytest.raises(CacheIOError) as info:
        files.check_dir(str(tmp_path / "shards"), str(tmp_path))
    assert info.value.errno == errno.ENOENT
    os.symlink(tmp_path / "gone", tmp_path / "dangling")  # a link is judged, even when it dangles
    with pytest.raises(CacheIOError):
        files.check_dir(str(tmp_path / "dangling"), str(tmp_path), missing_ok=True)
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(CacheFormatError, match="not a directory"):
        files.check_dir(str(tmp_path / "file"), str(tmp_path), missing_ok=True)
