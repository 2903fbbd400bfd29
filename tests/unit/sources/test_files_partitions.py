"""ParquetSource over a Hive-partitioned directory (`pq.write_to_dataset(..., partition_cols=)`):
the `key=value` directories become columns typed as pyarrow's dataset discovery types them, and a
partition key asked of a file named without its root says so."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from datasetrt.errors import SourceInputError
from datasetrt.sources import ParquetSource


def _partitioned(root, cols=("lang",)):
    t = pa.table(
        {
            "text": [f"doc {i}" for i in range(12)],
            "n": list(range(12)),
            "lang": [("en", "de", "fr")[i % 3] for i in range(12)],
            "year": [2020 + i % 2 for i in range(12)],
            "big": [2**40 if i == 0 else 1 for i in range(12)],
            "odd name": ["a b/c%" if i % 2 else "x" for i in range(12)],
        }
    )
    pq.write_to_dataset(t, root, partition_cols=list(cols))
    return t


def _rows(source):
    return sorted((bytes(memoryview(d)).decode(), m) for d, m in source)


def test_partition_keys_are_metadata_columns(tmp_path):
    t = _partitioned(tmp_path / "ds")
    got = _rows(ParquetSource("p", tmp_path / "ds", payload="text"))
    want = sorted(
        (r["text"], {"n": r["n"], "year": r["year"], "big": r["big"], "odd name": r["odd name"], "lang": r["lang"]})
        for r in t.to_pylist()
    )
    assert got == want
    chosen = _rows(ParquetSource("p", tmp_path / "ds", payload="text", metadata=["lang"], rename={"lang": "language"}))
    assert chosen == sorted((r["text"], {"language": r["lang"]}) for r in t.to_pylist())


def test_partition_types_follow_pyarrow_dataset_discovery(tmp_path):
    """int32 when every value is an int32 integer, else string (the value 2**40 makes `big` a
    string); %-encoded directory names decode as pyarrow writes and reads them."""
    cols = ("year", "big", "odd name")
    _partitioned(tmp_path / "ds", cols)
    source = ParquetSource("p", tmp_path / "ds", payload="text")
    discovered = pads.dataset(tmp_path / "ds", partitioning="hive").schema
    schema = next(iter(source._parts())).schema
    for key in cols:
        assert schema.field(key).type == discovered.field(key).type, key
    assert {schema.field(k).type for k in cols} == {pa.int32(), pa.string()}
    values = {tuple(m[k] for k in cols) for _d, m in source}
    assert values == {(2020 + i % 2, str(2**40) if i == 0 else "1", "a b/c%" if i % 2 else "x") for i in range(12)}


def test_a_partition_key_of_a_file_named_directly_says_partitioning(tmp_path):
    _partitioned(tmp_path / "ds")
    [one] = sorted((tmp_path / "ds" / "lang=en").glob("*.parquet"))
    assert "lang" not in next(iter(ParquetSource("f", one, payload="text")._parts())).schema.names
    with pytest.raises(
        SourceInputError, match=r"'lang' not found \(columns: text, n, .*Hive partition key.*root directory"
    ):
        list(ParquetSource("f", one, payload="text", metadata=["n", "lang"]))


def test_a_partition_key_that_is_also_a_file_column_is_refused(tmp_path):
    (tmp_path / "ds" / "n=1").mkdir(parents=True)
    pq.write_table(pa.table({"text": ["a"], "n": [5]}), tmp_path / "ds" / "n=1" / "f.parquet")
    with pytest.raises(SourceInputError, match=r"partition key 'n' of its directory is also a column"):
        list(ParquetSource("p", tmp_path / "ds", payload="text"))


def test_plain_directories_and_files_have_no_partition_columns(tmp_path):
    (tmp_path / "ds" / "sub").mkdir(parents=True)
    pq.write_table(pa.table({"text": ["a"], "n": [1]}), tmp_path / "ds" / "sub" / "f.parquet")
    source = ParquetSource("p", tmp_path / "ds", payload="text")
    assert source.partitions == {} and _rows(source) == [("a", {"n": 1})]
