"""A cache is data, never a way out: every file of a cache is a regular file inside it.

- Special files (a FIFO, `/dev/zero`) where a cache file should be are refused at open, naming the
  file and what it is, never waited on (a FIFO has no writer) or read without end (`/dev/zero`),
  on default opens and under validate_cache=True (which hashes every file). These run in a child
  process with a hang guard (tests/integrity/hostile.py `probe_bounded`): a reader that blocks
  fails the test instead of hanging it.
- Symbolic links that leave the cache directory (any cache file, or `shards/` itself) are refused
  at open, naming the link and its target, unless the reader opts in with
  `ReaderConfig(allow_external_links=True)`; links that stay inside the cache are always read.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pyarrow.ipc as ipc
import pytest

import datasetrt as drt
from datasetrt.errors import CacheFormatError
from tests.conftest import ListSource, json_like_items
from tests.integrity.corrupt import (
    assert_fault,
    edit_manifest,
    load_manifest,
    manifest_path,
    probe,
    rehash,
    shard_file,
    sidecar_path,
    write_index,
)
from tests.integrity.hostile import assert_refused, probe_bounded

OPT_IN = {"allow_external_links": True}


def _replace_with_fifo(path: Path) -> Path:
    path.unlink()
    os.mkfifo(path)
    return path


def _replace_with_link(path: Path, target: str | Path) -> Path:
    path.unlink()
    path.symlink_to(target)
    return path


@pytest.fixture
def dict_cache(tmp_path, opener):
    """A zstd_dict cache (it has a dictionary file)."""
    comp = drt.ShardCompression(algo="zstd_dict", dict_bytes=1024)
    config = drt.WriterConfig(show_progress=False, shard_compression=comp)
    (result,) = opener.write_cache(ListSource("dict", json_like_items(40)), tmp_path / "d", writer_config=config)
    return Path(result.path)


@pytest.fixture
def empty_cache(fresh_cache):
    """A cache of 0 samples with one empty shard: index.bin, the sidecar and the shard are 0 bytes,
    so a FIFO or /dev/zero (whose size is 0) put in their place passes every size check."""
    write_index(fresh_cache, [])
    sidecar_path(fresh_cache).write_bytes(b"")
    shard_file(fresh_cache).write_bytes(b"")
    path = fresh_cache / "metadata.arrow"
    table = ipc.open_file(path).read_all().slice(0, 0)
    with ipc.new_file(path, table.schema) as writer:
        writer.write_table(table)

    def empty(doc):
        doc["sample_count"] = 0
        doc["shards"][0]["byte_len"] = 0

    edit_manifest(fresh_cache, empty)
    rehash(fresh_cache)
    ds = drt.CachedDataset([fresh_cache], reader_config=drt.ReaderConfig(seed=0, validate_cache=True))
    assert ds.get_metadata().height == 0  # a valid cache as it is
    return fresh_cache


# -- special files: FIFOs and devices --------------------------------------------------------------

FIFO_FILES = {
    "manifest": lambda c: manifest_path(c),
    "metadata": lambda c: c / "metadata.arrow",
    "index": lambda c: c / "index.bin",
    "sidecar": lambda c: sidecar_path(c),
    "shard": lambda c: shard_file(c),
}


@pytest.mark.parametrize("validate", [False, True], ids=["default", "validate"])
@pytest.mark.parametrize("name", list(FIFO_FILES))
def test_fifo_in_place_of_a_cache_file_is_refused_at_open(empty_cache, name, validate):
    """dataset-rt (and datasetrt before) opened a FIFO manifest or metadata.arrow and waited for a
    writer forever; with validate_cache=True it did so for every file it hashes."""
    path = _replace_with_fifo(FIFO_FILES[name](empty_cache))
    report = probe_bounded(empty_cache, action="metadata", config={"validate_cache": validate})
    assert_refused(report, "open", "CacheFormatError", "is a FIFO, not a regular file", path)


def test_fifo_in_place_of_the_dictionary_is_refused_at_open(dict_cache):
    entry = load_manifest(dict_cache)["datasetrt"]["zstd_dictionary"]
    path = _replace_with_fifo(dict_cache / entry["file"])
    report = probe_bounded(dict_cache, action="iter")
    assert_refused(report, "open", "CacheFormatError", "is a FIFO, not a regular file", path)


@pytest.mark.parametrize("validate", [False, True], ids=["default", "validate"])
@pytest.mark.parametrize("name", list(FIFO_FILES))
def test_dev_zero_in_place_of_a_cache_file_is_refused_at_open(empty_cache, name, validate):
    """A link to /dev/zero: refused by the link rule by default, and, for a reader that allows
    external links, as a character device (before: read or hashed without end, or, for the
    manifest and metadata.arrow, read into memory until the process died)."""
    path = _replace_with_link(FIFO_FILES[name](empty_cache), "/dev/zero")
    report = probe_bounded(empty_cache, action="metadata", config={"validate_cache": validate})
    assert_refused(report, "open", "CacheFormatError", "symbolic link to /dev/zero", path)
    report = probe_bounded(empty_cache, action="metadata", config={"validate_cache": validate, **OPT_IN})
    assert_refused(report, "open", "CacheFormatError", "is a character device, not a regular file", path)


def test_directory_in_place_of_a_shard_is_refused_at_open(opener, fresh_cache):
    path = shard_file(fresh_cache)
    path.unlink()
    path.mkdir()
    out = probe(opener, fresh_cache, validate=False)
    assert_fault(out, "open", drt.errors.CacheIOError, RuntimeError, "Is a directory", path)


# -- symbolic links --------------------------------------------------------------------------------


def _outside_copy(cache: Path, tmp_path: Path, name: str) -> Path:
    """A copy of cache file `name` outside the cache directory."""
    target = tmp_path / "elsewhere" / name.replace("/", "_")
    target.parent.mkdir(exist_ok=True)
    shutil.copyfile(cache / name, target)
    return target


LINKABLE = ["manifest.json", "metadata.arrow", "index.bin", "checksums.xxh3", "shards/000000.bin"]


@pytest.mark.parametrize("name", LINKABLE)
def test_link_out_of_the_cache_is_refused_unless_allowed(opener, fresh_cache, tmp_path, name):
    """Each file as a link to an identical copy outside the cache (a shard linked so returned
    its samples, and any file could be read from anywhere): refused by default (both validate
    modes) naming the link and its target; read as the same cache when allowed."""
    assert (fresh_cache / name).exists()
    target = _outside_copy(fresh_cache, tmp_path, name)
    link = _replace_with_link(fresh_cache / name, target)
    for validate in (False, True):
        out = probe(opener, fresh_cache, validate=validate)
        assert_fault(out, "open", CacheFormatError, ValueError, "symbolic link to", str(target), str(link), "outside")
    config = drt.ReaderConfig(seed=0, shuffle=False, validate_cache=True, **OPT_IN)
    samples = list(opener.cached_dataset([fresh_cache], reader_config=config))
    assert len(samples) == 5


def test_shards_directory_linked_out_of_the_cache(runtime, fresh_cache, tmp_path):
    """shards/ itself as a link to a directory elsewhere: refused by default; with the opt-in,
    read by both read paths (reader workers reopen the cache as the parent allowed it)."""
    moved = tmp_path / "elsewhere-shards"
    shutil.move(fresh_cache / "shards", moved)
    (fresh_cache / "shards").symlink_to(moved)
    out = probe(runtime, fresh_cache, validate=False)
    assert_fault(out, "open", CacheFormatError, ValueError, "symbolic link to", str(moved), "shards")
    config = drt.ReaderConfig(seed=0, shuffle=False, **OPT_IN)
    assert len(list(runtime.cached_dataset([fresh_cache], reader_config=config))) == 5


@pytest.mark.parametrize("name", ["index.bin", "metadata.arrow", "shards/000000.bin"])
def test_link_to_etc_passwd_is_refused(opener, fresh_cache, name):
    link = _replace_with_link(fresh_cache / name, "/etc/passwd")
    out = probe(opener, fresh_cache, validate=False)
    assert_fault(out, "open", CacheFormatError, ValueError, "symbolic link to /etc/passwd", link)


def test_links_inside_the_cache_are_read(runtime, fresh_cache):
    """Links that resolve inside the cache directory (relative or absolute, through a
    subdirectory or a chain) are ordinary: no opt-in needed."""
    store = fresh_cache / "store"
    store.mkdir()
    shutil.move(shard_file(fresh_cache), store / "000000.bin")
    (fresh_cache / "hop").symlink_to(store / "000000.bin")  # absolute, inside
    shard_file(fresh_cache).symlink_to(Path("..") / "hop")  # relative, then a chain
    shutil.move(fresh_cache / "index.bin", store / "index.bin")
    (fresh_cache / "index.bin").symlink_to(Path("store") / "index.bin")
    for validate in (False, True):
        out = probe(runtime, fresh_cache, validate=validate)
        assert out.stage is None, out.error
        assert len(out.samples) == 5


def test_link_leaving_through_a_chain_is_refused(opener, fresh_cache, tmp_path):
    """A link to a link inside the cache that points outside: judged by where it resolves."""
    target = _outside_copy(fresh_cache, tmp_path, "index.bin")
    (fresh_cache / "hop").symlink_to(target)
    _replace_with_link(fresh_cache / "index.bin", fresh_cache / "hop")
    out = probe(opener, fresh_cache, validate=False)
    assert_fault(out, "open", CacheFormatError, ValueError, "symbolic link to", str(target))


def test_cache_directory_reached_through_a_link(runtime, fresh_cache, tmp_path):
    """The path a user passes may itself be a link: the rule is about the files inside."""
    alias = tmp_path / "alias"
    alias.symlink_to(fresh_cache)
    out = probe(runtime, alias, validate=True)
    assert out.stage is None, out.error
    assert len(out.samples) == 5


def test_allow_external_links_is_a_reader_config_field():
    assert drt.ReaderConfig(seed=0).allow_external_links is False
    assert drt.ReaderConfig(seed=0, allow_external_links=True).allow_external_links is True
    with pytest.raises(ValueError):
        drt.ReaderConfig(seed=0, allow_external_links="sometimes")


def test_a_shard_replaced_by_a_fifo_after_open_is_an_error_not_a_wait(fresh_cache):
    """Shards are opened lazily, at the first read that needs them: one replaced by a FIFO after
    the cache opened must fail that read (the open does not wait for a writer that never comes)."""
    import threading

    from datasetrt.errors import DatasetRTError

    ds = drt.CachedDataset([fresh_cache], reader_config=drt.ReaderConfig(seed=0, shuffle=False), runtime=None)
    fifo = _replace_with_fifo(shard_file(fresh_cache))
    outcome: dict[str, BaseException] = {}

    def read() -> None:
        try:
            list(ds)
        except BaseException as exc:  # reported to the test thread
            outcome["error"] = exc

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(120)  # a hang guard, not a timing assertion
    if reader.is_alive():  # blocked in open(): give it a writer so the thread can end
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        pytest.fail("the read waited on a FIFO shard")
    assert isinstance(outcome.get("error"), DatasetRTError), outcome
