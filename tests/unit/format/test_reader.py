"""datasetrt.format.reader: the checks `CacheHandle.open` runs (shapes, no content read) and the
decode of metadata.arrow, compared at the Arrow level (what the reader returns, before Polars).

One small cache is written per module and copied per test; each test edits the copy and rehashes
what it must (tests/integrity/corrupt.py), so the check under test is the one that fires.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

import datasetrt as drt
from datasetrt.errors import CacheFormatError, CacheIOError, DatasetRTError, IntegrityError
from datasetrt.format.reader import CacheHandle
from tests.conftest import ListSource, sample_items, writer_config
from tests.integrity.corrupt import METADATA_FRAMINGS, edit_manifest, rehash

N = 7


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    with drt.DatasetRuntime(num_workers=1) as rt:
        [res] = rt.write_cache(
            ListSource("r", sample_items(N, tag="r")),
            tmp_path_factory.mktemp("reader"),
            writer_config=writer_config("lz4", max_shard_bytes=512),
        )
    return Path(res.path)


@pytest.fixture
def cache(template, tmp_path):
    return Path(shutil.copytree(template, tmp_path / "r"))


def stored_table(cache: Path) -> pa.Table:
    return ipc.open_file(pa.py_buffer((cache / "metadata.arrow").read_bytes())).read_all()


def rewrite_metadata(cache: Path, table: pa.Table) -> None:
    with ipc.new_file(cache / "metadata.arrow", table.schema) as writer:
        writer.write_table(table)
    rehash(cache)  # the manifest now records this file: only the type rules decide


def with_label_type(table: pa.Table, type_: pa.DataType) -> pa.Table:
    i = table.schema.get_field_index("label")
    if pa.types.is_list(type_):  # one-element lists of the labels (strings cast to no list type)
        return table.set_column(i, "label", pa.array([[v] for v in table.column("label").to_pylist()], type_))
    return table.set_column(i, "label", table.column("label").cast(type_))


# -- metadata.arrow: string columns --------------------------------------------------------------


@pytest.mark.parametrize("type_", [pa.large_string(), pa.string_view()], ids=["large_string", "string_view"])
@pytest.mark.parametrize("validating", [False, True], ids=["default", "validate_cache"])
def test_large_and_view_strings_on_disk_are_accepted_as_utf8(cache, type_, validating):
    """docs/storage-format.md: string columns may be stored as large/view strings (normalised to
    utf8). Checked on the reader's Arrow table, where the stored type is still visible."""
    original = stored_table(cache)
    rewrite_metadata(cache, with_label_type(original, type_))
    assert stored_table(cache).schema.field("label").type == type_  # the file really holds it
    table = CacheHandle.open(cache).read_metadata(validating=validating)
    assert table.schema.field("label").type == pa.string()
    assert table.to_pydict() == original.to_pydict()


def test_large_strings_reach_get_metadata_and_validate_cache(cache):
    original = stored_table(cache)
    rewrite_metadata(cache, with_label_type(original, pa.large_string()))
    for validate in (False, True):
        ds = drt.CachedDataset([cache], reader_config=drt.ReaderConfig(seed=0, validate_cache=validate))
        assert ds.get_metadata()["label"].to_list() == original.column("label").to_pylist()


@pytest.mark.parametrize(
    "type_",
    [pa.binary(), pa.large_binary(), pa.dictionary(pa.int32(), pa.string()), pa.list_(pa.string())],
    ids=["binary", "large_binary", "dictionary", "list"],
)  # a list cannot even be cast to utf8
def test_other_types_for_a_string_column_are_refused(cache, type_):
    rewrite_metadata(cache, with_label_type(stored_table(cache), type_))
    handle = CacheHandle.open(cache)
    with pytest.raises(CacheFormatError, match="metadata column 'label' does not match manifest schema"):
        handle.read_metadata()
    with pytest.raises(CacheFormatError, match="metadata 'label' is not string"):
        handle.read_metadata(validating=True)


def test_an_int32_column_for_int_is_refused(cache):
    table = stored_table(cache)
    rewrite_metadata(cache, table.set_column(0, "index", table.column("index").cast(pa.int32())))
    with pytest.raises(CacheFormatError, match="metadata column 'index' does not match manifest schema"):
        CacheHandle.open(cache).read_metadata()


def test_columns_come_back_in_manifest_order(cache):
    table = stored_table(cache)
    rewrite_metadata(cache, table.select(list(reversed(table.column_names))))
    assert CacheHandle.open(cache).read_metadata().column_names == table.column_names


def test_null_in_a_column_is_refused(cache):
    table = stored_table(cache)
    labels = table.column("label").to_pylist()
    labels[3] = None
    rewrite_metadata(cache, table.set_column(table.schema.get_field_index("label"), "label", pa.array(labels)))
    with pytest.raises(CacheFormatError, match="metadata column 'label' contains null"):
        CacheHandle.open(cache).read_metadata()


def test_an_extra_or_renamed_column_is_refused(cache):
    table = stored_table(cache)
    rewrite_metadata(cache, table.append_column("extra", pa.array([1] * N)))
    with pytest.raises(CacheFormatError, match="metadata batch column count does not match manifest"):
        CacheHandle.open(cache).read_metadata()
    rewrite_metadata(cache, table.rename_columns(["index", "kept", "name", "score"]))
    with pytest.raises(CacheFormatError, match="metadata column 'label' does not match manifest schema"):
        CacheHandle.open(cache).read_metadata()


def test_row_count_and_hash(cache):
    table = stored_table(cache)
    rewrite_metadata(cache, table.slice(0, N - 1))
    with pytest.raises(CacheFormatError, match=f"expected {N}, got {N - 1}"):
        CacheHandle.open(cache).read_metadata()
    rewrite_metadata(cache, table)
    edit_manifest(cache, lambda d: d.__setitem__("metadata_sha256", "0" * 64))
    handle = CacheHandle.open(cache)
    with pytest.raises(IntegrityError, match="checksum mismatch for"):
        handle.read_metadata()
    assert handle.read_metadata(validating=True).to_pydict() == table.to_pydict()  # validate_cache hashes at open


@pytest.mark.parametrize(
    "data, cls, message", [f[1:] for f in METADATA_FRAMINGS], ids=[f[0] for f in METADATA_FRAMINGS]
)
def test_framing(cache, data, cls, message):
    (cache / "metadata.arrow").write_bytes(data)
    with pytest.raises(cls, match=message):
        CacheHandle.open(cache).read_metadata()


def test_a_footer_right_after_the_leading_magic_has_a_plausible_length(cache):
    """The longest plausible footer fills the file between the leading magic + padding (8 bytes) and
    the trailer (10): a file of only a footer (the schema, no batches) decodes to 0 rows, as in
    dataset-rt 0.4.8, so the refusal is the row count, not the framing."""
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, stored_table(cache).schema):
        pass
    empty = sink.getvalue().to_pybytes()
    footer_len = int.from_bytes(empty[-10:-6], "little")
    data = b"ARROW1\0\0" + empty[-10 - footer_len : -10] + footer_len.to_bytes(4, "little") + b"ARROW1"
    assert footer_len == len(data) - 18
    (cache / "metadata.arrow").write_bytes(data)
    with pytest.raises(CacheFormatError, match=f"expected {N}, got 0"):
        CacheHandle.open(cache).read_metadata()


def test_a_footer_that_fails_verification_is_a_typed_error(cache):
    """pyarrow reports a footer that is not a valid flatbuffer as a bare OSError (not an
    ArrowException): it must still come out as a datasetrt error naming the file."""
    path = cache / "metadata.arrow"
    data = bytearray(path.read_bytes())
    footer_len = int.from_bytes(data[-10:-6], "little")
    data[-10 - footer_len : -10] = b"\xff" * footer_len
    path.write_bytes(bytes(data))
    with pytest.raises(OSError, match="Verification of flatbuffer-encoded Footer failed"):
        ipc.open_file(pa.py_buffer(bytes(data)))  # the raw error this test is about
    with pytest.raises(DatasetRTError, match=f"Verification of flatbuffer-encoded Footer failed.*: {path}$"):
        CacheHandle.open(cache).read_metadata()


def test_a_column_name_that_is_not_utf8_is_a_typed_error(cache):
    """A name that is not UTF-8 decodes (pyarrow checks no strings) until the name is read, as a
    bare UnicodeDecodeError: it must come out as a datasetrt error naming the file."""
    table = stored_table(cache).rename_columns(["index", "kept", "zzzzz", "score"])
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    data = sink.getvalue().to_pybytes()
    assert data.count(b"zzzzz") == 2  # the schema message and the footer
    path = cache / "metadata.arrow"
    path.write_bytes(data.replace(b"zzzzz", b"\xc0zzzz"))
    with pytest.raises(DatasetRTError, match=f"can't decode byte 0xc0.*: {path}$"):
        CacheHandle.open(cache).read_metadata()


@pytest.mark.parametrize("damage", ["removed", "a-directory"])
def test_metadata_gone_after_open_is_a_cache_io_error(cache, damage):
    handle = CacheHandle.open(cache)
    (cache / "metadata.arrow").unlink()
    if damage == "a-directory":
        (cache / "metadata.arrow").mkdir()
    with pytest.raises(CacheIOError, match=f"I/O error: .* \\(os error \\d+\\): {cache / 'metadata.arrow'}$") as info:
        handle.read_metadata()
    assert info.value.errno in (errno.ENOENT, errno.EISDIR) and info.value.path == str(cache / "metadata.arrow")


# -- open: shapes against the manifest ---------------------------------------------------------------


def test_open_records_identity_and_maps_lazily(cache):
    handle = CacheHandle.open(str(cache))
    assert handle.path == cache and handle.sample_count == N
    st_m, st_i = (cache / "manifest.json").stat(), (cache / "index.bin").stat()
    assert handle.identity == (st_m.st_dev, st_m.st_ino, st_m.st_mtime_ns, st_i.st_dev, st_i.st_ino, st_i.st_mtime_ns)
    assert handle.index_array().shape == (N, 3)
    assert handle.checksum_map().size == 8 * N
    assert [p.name for p in handle.shard_paths()] == sorted(p.name for p in (cache / "shards").iterdir())


def test_open_reads_a_file_url_as_its_local_path(cache):
    handle = CacheHandle.open(cache.as_uri())
    assert handle.path == cache and handle.remote is None
    assert handle.identity == CacheHandle.open(cache).identity


def test_index_size_checks(cache):
    index = cache / "index.bin"
    data = index.read_bytes()
    index.write_bytes(data + b"\0")
    with pytest.raises(CacheFormatError, match="index length is not divisible by row size"):
        CacheHandle.open(cache)
    index.write_bytes(data[:-24])
    with pytest.raises(CacheFormatError, match=f"has {N - 1} rows, manifest sample_count is {N}"):
        CacheHandle.open(cache)
    index.write_bytes(data)
    handle = CacheHandle.open(cache)
    index.write_bytes(data + b"\0" * 24)  # grows after open, before the first map
    with pytest.raises(CacheFormatError, match="changed on disk"):
        handle.index_map()


def test_index_replaced_after_open_by_one_of_the_same_size_is_refused_at_first_map(cache):
    """An index.bin replaced after open by another valid index of the same size (its rows
    reversed: other records under the same positions) is refused by the handle's identity (inode,
    mtime), which the size checks cannot see; nothing of it is read."""
    handle = CacheHandle.open(cache)
    index = cache / "index.bin"
    data = index.read_bytes()
    swapped = cache / "index.bin.new"
    swapped.write_bytes(b"".join(reversed([data[k : k + 24] for k in range(0, len(data), 24)])))
    os.replace(swapped, index)
    with pytest.raises(CacheFormatError, match=f"cache changed on disk since it was opened: {cache}"):
        handle.index_map()


def test_shard_and_sidecar_sizes(cache):
    shard = sorted((cache / "shards").iterdir())[0]
    data = shard.read_bytes()
    shard.write_bytes(data[:-1])
    with pytest.raises(CacheFormatError, match=f"shard length mismatch for {shard}"):
        CacheHandle.open(cache)
    shard.write_bytes(data)
    sidecar = cache / "checksums.xxh3"
    side = sidecar.read_bytes()
    sidecar.write_bytes(side[:-8])
    with pytest.raises(CacheFormatError, match="checksum sidecar length mismatch"):
        CacheHandle.open(cache)
    sidecar.write_bytes(side)
    handle = CacheHandle.open(cache)
    sidecar.write_bytes(side + b"\0" * 8)
    with pytest.raises(CacheFormatError, match="checksum sidecar length mismatch"):
        handle.checksum_map()


@pytest.mark.parametrize("name", ["metadata.arrow", "index.bin"])
def test_missing_files_at_open(cache, name):
    (cache / name).unlink()
    with pytest.raises(CacheIOError, match=f"No such file or directory.*{name}"):
        CacheHandle.open(cache)


def test_validate_deep_checks_every_index_entry(cache):
    import struct

    handle = CacheHandle.open(cache)
    handle.validate_deep()  # a clean cache passes
    rows = list(struct.iter_unpack("<QQQ", (cache / "index.bin").read_bytes()))
    shard_len = (cache / "shards" / "000000.bin").stat().st_size
    cases = [
        ((len(list((cache / "shards").iterdir())), 0, 8), "index references missing shard"),
        ((0, shard_len - 7, 8), "lies outside its shard"),  # one byte past the end
        ((0, shard_len + 1, 8), "lies outside its shard"),
        ((0, 0, 7), "lies outside its shard"),  # shorter than a record header
    ]
    for row, message in cases:
        (cache / "index.bin").write_bytes(b"".join(struct.pack("<QQQ", *r) for r in [*rows[:2], row, *rows[3:]]))
        rehash(cache)
        with pytest.raises(CacheFormatError, match=f"{message}.*(row 2|index.bin)"):
            CacheHandle.open(cache).validate_deep()
    # Two bad rows: the message names the first (with its own shard id).
    shards = len(list((cache / "shards").iterdir()))
    for bad, message in [
        ({2: (shards + 5, 0, 8), 4: (shards + 9, 0, 8)}, f"missing shard {shards + 5}: .*index.bin row 2$"),
        ({2: (0, 0, 7), 4: (0, 0, 6)}, "index row 2 lies outside its shard"),
    ]:
        (cache / "index.bin").write_bytes(b"".join(struct.pack("<QQQ", *bad.get(i, r)) for i, r in enumerate(rows)))
        rehash(cache)
        with pytest.raises(CacheFormatError, match=message):
            CacheHandle.open(cache).validate_deep()
    last = (0, shard_len - 8, 8)  # exactly at the end: in range
    (cache / "index.bin").write_bytes(b"".join(struct.pack("<QQQ", *r) for r in [*rows[:2], last, *rows[3:]]))
    rehash(cache)
    CacheHandle.open(cache).validate_deep()
    assert (
        hashlib.sha256((cache / "index.bin").read_bytes()).hexdigest() == CacheHandle.open(cache).manifest.index_sha256
    )
