"""Memory and time are bounded by the input: a small crafted cache can make datasetrt neither
allocate gigabytes nor scan terabytes. Each case is refused with a typed error naming the file (or
the cache and sample) before anything is allocated for it.

Cases that would exhaust memory run in a child process capped by RLIMIT_AS (tests/integrity/
hostile.py `probe_bounded`), so a reader that fails to bound them fails there, with a MemoryError
or a different message, and never reaches the OOM killer on the test machine.
"""

from __future__ import annotations

import pyarrow.ipc as ipc
import pytest

import datasetrt as drt
from datasetrt.errors import ArrowFormatError, CacheFormatError
from datasetrt.format.reader import CacheHandle
from datasetrt.runtime.run import planned_record_bytes
from tests.conftest import ListSource, sample_items, writer_config
from tests.integrity.corrupt import (
    INDEX_ROW,
    drop_sidecar,
    edit_manifest,
    make_record,
    read_record,
    rehash,
    replace_records,
    shard_file,
    split_record,
)
from tests.integrity.hostile import (
    assert_refused,
    inflate_metadata_buffer,
    point_at_new_record,
    probe_bounded,
    sparse_sample_count,
    zstd_rle_frame,
)

GIB, MIB = 1 << 30, 1 << 20
SCAN_ROWS = 1 << 20  # at most this many index rows are read to plan a ring (runtime/run.py PLAN_SCAN_ROWS)
CAP = 3 * GIB  # the children's address space: every bomb here declares more than it can hold


# -- metadata.arrow: compressed IPC buffers ----------------------------------------------------------


def test_the_generator_declares_what_pyarrow_then_allocates(fresh_cache):
    """Sanity of `inflate_metadata_buffer`, at a harmless size: pyarrow decodes the rewritten file,
    and the inflated buffer has the declared size."""
    path = inflate_metadata_buffer(fresh_cache, "label", 2, 1 * MIB)
    table = ipc.open_file(path).read_all()
    assert table.column("label").chunks[0].buffers()[2].size == 1 * MIB
    assert path.stat().st_size < 64 * 1024


def test_metadata_compressed_buffers_within_their_rows_decode(fresh_cache):
    """A compressed metadata.arrow whose buffers declare what their rows need reads as before
    (dataset-rt and pyarrow can write compressed IPC files)."""
    before = drt.CachedDataset([fresh_cache], reader_config=drt.ReaderConfig(seed=0)).get_metadata()
    inflate_metadata_buffer(fresh_cache, "score", 1, 40)  # 5 float64 values: 40 bytes, as declared
    ds = drt.CachedDataset([fresh_cache], reader_config=drt.ReaderConfig(seed=0, validate_cache=True))
    after = ds.get_metadata()
    assert after.drop("score").equals(before.drop("score")) and after["score"].to_list() == [0.0] * 5


@pytest.mark.parametrize("validate", [False, True], ids=["get_metadata", "validate_cache"])
@pytest.mark.parametrize(("column", "buffer"), [("index", 1), ("score", 1), ("kept", 0), ("label", 1)])
def test_metadata_buffer_declaring_more_than_its_rows_is_refused(fresh_cache, validate, column, buffer):
    """A ~60 KB metadata.arrow whose fixed-width buffer (values, validity, offsets) of a 5-row
    column is a zstd frame decoding to 1.6 GB: refused from the declared size, naming column,
    size and file, before pyarrow allocates it (at open under validate_cache)."""
    path = inflate_metadata_buffer(fresh_cache, column, buffer, 1_600_000_000)
    assert path.stat().st_size < 100_000
    report = probe_bounded(fresh_cache, action="metadata", config={"validate_cache": validate}, address_space=CAP)
    stage = "open" if validate else "read"
    assert_refused(report, stage, "ArrowFormatError", f"column '{column}'", "declares 1600000000 decoded bytes", path)
    assert issubclass(ArrowFormatError, RuntimeError)


@pytest.mark.parametrize("validate", [False, True], ids=["get_metadata", "validate_cache"])
def test_metadata_string_data_over_the_memory_limit_is_refused(fresh_cache, validate):
    """String data has no size its rows imply: its declared decoded size is held to the
    reader's memory limit (ResourceLimitError naming metadata.arrow)."""
    path = inflate_metadata_buffer(fresh_cache, "label", 2, 1_600_000_000)
    config = {"validate_cache": validate, "memory_limit_bytes": 256 * MIB}
    report = probe_bounded(fresh_cache, action="metadata", config=config, address_space=CAP)
    assert_refused(
        report,
        "open" if validate else "read",
        "ResourceLimitError",
        "compressed buffers declare 16000",
        f"memory limit of {256 * MIB} bytes",
        path,
    )
    assert report["maxrss_kib"] < 1024 * 1024  # nothing near the declared size was allocated


def test_metadata_string_data_within_the_memory_limit_decodes(fresh_cache):
    """The same bound lets legitimate string data through: 8 MiB declared under a 256 MiB limit
    (offsets stay in range: the data is longer than the strings need, which Arrow allows)."""
    inflate_metadata_buffer(fresh_cache, "label", 2, 8 * MIB)
    config = drt.ReaderConfig(seed=0, memory_limit_bytes=256 * MIB)
    assert drt.CachedDataset([fresh_cache], reader_config=config).get_metadata().height == 5


def test_metadata_rows_beyond_sample_count_are_refused_before_decoding(fresh_cache):
    """Declared rows past the manifest's sample_count are the row-count error, from the batch
    headers: a file cannot size its buffers by rows the cache does not have."""
    path = fresh_cache / "metadata.arrow"
    table = ipc.open_file(path).read_all()
    with ipc.new_file(path, table.schema) as writer:
        writer.write_table(table)
        writer.write_table(table.slice(0, 1))
    rehash(fresh_cache)
    ds = drt.CachedDataset([fresh_cache], reader_config=drt.ReaderConfig(seed=0))
    with pytest.raises(CacheFormatError, match="metadata row count .* expected 5, got at least 6"):
        ds.get_metadata()


# -- records: decoded and stored sizes against the memory limit ---------------------------------------

READ_PATHS = [("none", "iter"), ("inprocess", "iter"), ("parallel", "iter"), ("none", "batches"),
              ("parallel", "batches"), ("none", "item")]  # fmt: skip


@pytest.fixture
def write(tmp_path, opener):
    """write(name, algo) -> the path of a fresh 5-sample cache."""

    def _write(name: str, algo: str = "none"):
        sources = [ListSource(name, sample_items(5, tag=name))]
        (result,) = opener.write_cache(sources, tmp_path / "caches", writer_config=writer_config(algo))
        return result.path

    return _write


@pytest.fixture
def zstd_bomb(write):
    """A zstd cache whose sample 2 is a valid 64 KiB zstd frame decoding to 2 GiB (RLE blocks),
    its shard's uncompressed_byte_len raised to allow it: only the memory limit can refuse it."""
    cache = write("bomb", "zstd")
    json_bytes, _ = split_record(read_record(cache, 2))
    frame = zstd_rle_frame(2 * GIB)
    assert len(frame) < 70_000
    replace_records(cache, {2: make_record(json_bytes, frame)}, rehash_all=False)
    edit_manifest(cache, lambda d: d["shards"][0].__setitem__("uncompressed_byte_len", 3 * GIB))
    rehash(cache)
    return cache


# In-process readers get a 256 MiB limit. Reader workers plan their ring from the manifest's
# claimed sizes (16 MiB records: 1.5 GiB of ring), so they get a limit the ring fits but the
# 2 GiB record does not; the worker hands that record back and the parent refuses it.
LIMITS = {"none": 256 * MIB, "inprocess": 256 * MIB, "parallel": 1792 * MIB}
CAPS = {"none": CAP, "inprocess": CAP, "parallel": 6 * GIB}


@pytest.mark.parametrize(("mode", "action"), READ_PATHS, ids=["-".join(p) for p in READ_PATHS])
def test_zstd_frame_decoding_past_the_memory_limit_is_refused(zstd_bomb, mode, action):
    """Every read path (no runtime, in-process runtime, reader workers; samples, batches,
    get_item) refuses the 2 GiB frame under its limit before allocating for it."""
    config = {"memory_limit_bytes": LIMITS[mode]}
    report = probe_bounded(zstd_bomb, action=action, mode=mode, sample=2, config=config, address_space=CAPS[mode])
    assert_refused(report, "read", "ResourceLimitError", "memory_limit_bytes", f"{zstd_bomb} sample 2")
    assert "MemoryError" in report["mro"]
    assert report["maxrss_kib"] < 1024 * 1024


def test_zstd_frame_decoding_past_the_memory_limit_in_a_torch_worker(zstd_bomb):
    """A torch DataLoader worker reads in-process under the dataset's reader config: the same
    refusal crosses back to the parent."""
    pytest.importorskip("torch")
    report = probe_bounded(zstd_bomb, action="torch", config={"memory_limit_bytes": 256 * MIB}, address_space=8 * GIB)
    assert_refused(report, "read", "ResourceLimitError", "memory_limit_bytes", f"{zstd_bomb} sample 2")


@pytest.mark.parametrize("algo", ["none", "zstd"])
@pytest.mark.parametrize(("mode", "action"), READ_PATHS, ids=["-".join(p) for p in READ_PATHS])
def test_stored_record_larger_than_the_memory_limit_is_refused(write, algo, mode, action):
    """A 96 MiB stored record (a hole in a sparse shard) under a 64 MiB limit: refused from the
    index entry, before it is read or staged, on every read path (reader workers: already when
    the ring is planned for it)."""
    cache = write(f"big-{algo}", algo)
    drop_sidecar(cache)  # (the structural check, not a checksum, must refuse it)
    point_at_new_record(cache, 2, 96 * MIB)
    report = probe_bounded(cache, action=action, mode=mode, sample=2, config={"memory_limit_bytes": 64 * MIB})
    assert_refused(report, "read", "ResourceLimitError", "memory_limit_bytes")
    if not report["message"].startswith("reader memory bound exceeds"):  # (a worker ring refused at planning)
        assert f"{cache} sample 2" in report["message"]


def test_records_within_the_memory_limit_still_read(write):
    """The bound is the limit, not the planned size: a 12 MiB record under a 64 MiB limit reads
    in-process, through a buffer grown for it."""
    cache = write("fits")
    point_at_new_record(cache, 2, 12 * MIB)
    ds = drt.CachedDataset([cache], reader_config=drt.ReaderConfig(seed=0, shuffle=False, memory_limit_bytes=64 * MIB))
    assert [len(s.data) for s in ds][2] == 12 * MIB


# -- planning: bounded by what was read, not by sample_count -------------------------------------------


def _mapped_rss_kib(path) -> int:
    """Resident KiB of this process's mappings of `path` (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5:
                inside = line.rstrip("\n").endswith(str(path))
            elif inside and head and head[0] == "Rss:":
                total += int(head[1])
    return total


def test_planning_touches_a_bounded_part_of_a_huge_sparse_index(fresh_cache):
    """A manifest claiming 16M samples over a sparse 384 MiB index.bin: planning the ring reads at
    most SCAN_ROWS rows of it (in blocks), so what it maps in is bounded whatever the claim."""
    rows = 16 * SCAN_ROWS
    sparse_sample_count(fresh_cache, rows)
    handle = CacheHandle.open(fresh_cache)
    assert planned_record_bytes([handle]) >= 8  # the real records are in the first block
    touched = _mapped_rss_kib(fresh_cache / "index.bin")
    assert touched < 4 * 24 * SCAN_ROWS // 1024, f"{touched} KiB of a {24 * rows // 1024} KiB index mapped"


def test_a_dataset_over_a_huge_sparse_index_fails_at_its_first_bad_row(fresh_cache):
    """A DatasetRuntime reading that cache (reader workers) plans in bounded time and refuses the
    first all-zero index row (sample 5) as an invalid record, as the in-process path does."""
    sparse_sample_count(fresh_cache, 16 * SCAN_ROWS)
    for mode in ("parallel", "inprocess"):
        report = probe_bounded(fresh_cache, action="iter", mode=mode)
        assert_refused(report, "read", "CacheFormatError", "invalid binary record", f"{fresh_cache} sample 5")


def test_planning_finds_the_largest_record_in_a_scanned_block(fresh_cache):
    """Past SCAN_ROWS rows the scan samples blocks; the first and the last rows are always
    in one, so a large record there is planned for."""
    rows = 4 * SCAN_ROWS
    sparse_sample_count(fresh_cache, rows)
    whole = shard_file(fresh_cache).stat().st_size
    with open(fresh_cache / "index.bin", "r+b") as f:
        f.seek((rows - 1) * INDEX_ROW.size)
        f.write(INDEX_ROW.pack(0, 0, whole))  # the last row: the whole shard as one record
    assert planned_record_bytes([CacheHandle.open(fresh_cache)]) == whole
