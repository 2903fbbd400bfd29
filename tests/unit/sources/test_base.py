"""Schema drift across the parts of one source (datasetrt/sources/base.py): a file whose metadata
names or kinds differ from the first file's is refused at its first row, naming that file, its
file-relative row, the source-wide sample and every differing column; files that agree pass."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datasetrt.errors import SourceInputError
from datasetrt.sources import ParquetSource


def _files(tmp_path, *tables):
    for k, table in enumerate(tables):
        pq.write_table(table, tmp_path / f"{k}.parquet")
    return tmp_path


def test_a_metadata_kind_that_changes_between_files_names_the_file_and_row(tmp_path):
    _files(
        tmp_path,
        pa.table({"p": [b"a", b"b", b"c"], "n": [1, 2, 3], "s": ["x", "y", "z"]}),
        pa.table({"p": [b"d"], "n": [1.5], "s": [7]}),
    )
    with pytest.raises(SourceInputError) as info:
        list(ParquetSource("d", tmp_path))
    message = str(info.value)
    assert message.startswith(f"{tmp_path / '1.parquet'}: row group 0, row 0 ")
    assert "sample 3 of the source" in message
    assert "metadata field 'n' expected int, got float; metadata field 's' expected string, got int" in message
    assert f"'n' is double here, int64 in {tmp_path / '0.parquet'}" in message


def test_metadata_keys_that_change_between_files_name_the_file(tmp_path):
    _files(tmp_path, pa.table({"p": [b"a", b"b"], "n": [1, 2]}), pa.table({"p": [b"c"], "n": [3], "m": [4]}))
    with pytest.raises(SourceInputError, match=r"metadata keys must be identical for every sample") as info:
        list(ParquetSource("k", tmp_path))
    assert str(info.value).startswith(f"{tmp_path / '1.parquet'}: row group 0, row 0 ")
    assert "keys ['m', 'n'] here, expected ['n'] as in" in str(info.value)


def test_kinds_that_agree_pass_and_empty_files_are_not_refused(tmp_path):
    _files(
        tmp_path,
        pa.table({"p": pa.array([], pa.binary()), "n": pa.array([], pa.string())}),  # no rows: fixes nothing
        pa.table({"p": [b"a"], "n": pa.array([1], pa.int32()), "f": pa.array([0.5], pa.float32())}),
        pa.table({"p": [b"b"], "n": pa.array([2], pa.uint8()), "f": [1.5]}),  # other widths, same kinds
    )
    out = [(bytes(d), m) for d, m in ParquetSource("ok", tmp_path)]
    assert out == [(b"a", {"n": 1, "f": 0.5}), (b"b", {"n": 2, "f": 1.5})]
