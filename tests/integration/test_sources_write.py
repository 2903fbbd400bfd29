"""Sources through the real writer: caches from every adapter equal caches written from a
hand-written CacheSource of the same items, and a source that fails on its input becomes a
per-source CacheWriteError naming the file, row group and row, with nothing published."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import datasetrt as drt
from datasetrt.sources import ArrowSource, JsonLinesSource, NumpySource, ParquetSource
from tests.conftest import ListSource, writer_config


def cache_files(path: Path) -> dict:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def corpus(n: int) -> pa.Table:
    return pa.table(
        {
            "data": [bytes((i * 7 + j) % 256 for j in range(i % 200)) for i in range(n)],
            "label": [i % 4 for i in range(n)],
            "split": [("train", "dev")[i % 2] for i in range(n)],
            "score": [i / 16 for i in range(n)],
        }
    )


def reference(t: pa.Table, rename=None) -> list:
    rename = rename or {}
    return [(r.pop("data"), {rename.get(k, k): v for k, v in r.items()}) for r in t.to_pylist()]


@pytest.mark.parametrize("algo", ["none", "lz4", "zstd"])
def test_parquet_cache_equals_the_hand_written_source_cache(tmp_path, runtime, algo):
    t = corpus(700)
    pq.write_table(t, tmp_path / "c.parquet", row_group_size=128)
    config = writer_config(algo, max_shard_bytes=20_000)
    (ours,) = runtime.write_cache(
        [ParquetSource("c", tmp_path / "c.parquet", payload="data", rename={"split": "part"}, batch_bytes=4096)],
        tmp_path / "from_source",
        writer_config=config,
    )
    (theirs,) = runtime.write_cache(
        [ListSource("c", reference(t, {"split": "part"}))], tmp_path / "by_hand", writer_config=config
    )
    assert isinstance(ours, drt.CacheWriteSuccess) and isinstance(theirs, drt.CacheWriteSuccess)
    assert cache_files(ours.path) == cache_files(theirs.path)


def test_every_file_kind_reads_back(tmp_path, runtime):
    t = corpus(90)
    pq.write_table(t, tmp_path / "p.parquet", row_group_size=40)
    with pa.ipc.new_file(tmp_path / "a.arrow", t.schema) as w:
        w.write_table(t, max_chunksize=33)
    text = t.set_column(0, "data", pa.array([d.hex() for d in t.column("data").to_pylist()]))
    text.to_pandas().to_json(tmp_path / "j.jsonl", orient="records", lines=True)
    sources = [
        ParquetSource("p", tmp_path / "p.parquet", payload="data"),
        ArrowSource("a", tmp_path / "a.arrow", payload="data"),
        JsonLinesSource("j", tmp_path / "j.jsonl", payload="data"),
    ]
    results = runtime.write_cache(sources, tmp_path / "caches", writer_config=writer_config())
    assert all(isinstance(r, drt.CacheWriteSuccess) for r in results), results
    ds = drt.CachedDataset([r.path for r in results], reader_config=drt.ReaderConfig(seed=0, shuffle=False))
    samples = list(ds)
    want = reference(t)
    assert [(s.data, s.metadata) for s in samples[:90]] == want
    assert [(s.data, s.metadata) for s in samples[90:180]] == want
    assert [(s.data.decode(), s.metadata) for s in samples[180:]] == [(d.hex(), m) for d, m in want]


def test_typed_numpy_payloads_are_stored_as_their_bytes(tmp_path, runtime):
    tokens = np.arange(1000, dtype=np.int32)
    offsets = np.array([0, 10, 10, 500, 1000])
    (result,) = runtime.write_cache(
        [NumpySource("tok", tokens, offsets=offsets, index_column="row")], tmp_path, writer_config=writer_config("zstd")
    )
    ds = drt.CachedDataset([result.path], reader_config=drt.ReaderConfig(seed=0, shuffle=False))
    got = [np.frombuffer(s.data, np.int32) for s in ds]
    assert [g.tolist() for g in got] == [tokens[a:b].tolist() for a, b in itertools.pairwise(offsets)]


def test_a_failing_source_is_a_cache_write_error_and_nothing_is_half_written(tmp_path, runtime):
    t = corpus(600)
    labels = t.column("label").to_pylist()
    labels[450] = None
    pq.write_table(t.set_column(1, "label", pa.array(labels)), tmp_path / "bad.parquet", row_group_size=200)
    pq.write_table(t.slice(0, 50), tmp_path / "good.parquet")
    base = tmp_path / "caches"
    bad, good = runtime.write_cache(
        [
            ParquetSource("bad", tmp_path / "bad.parquet", payload="data", batch_bytes=2048),
            ParquetSource("good", tmp_path / "good.parquet", payload="data"),
        ],
        base,
        writer_config=writer_config(max_shard_bytes=4096),
    )
    assert isinstance(bad, drt.CacheWriteError) and bad.source_name == "bad"
    assert bad.message == (
        f"Python error: SourceInputError: {tmp_path / 'bad.parquet'}: row group 2, row 450 "
        f"(row 50 of the row group): metadata column 'label' (int64) is null"
    )
    assert isinstance(good, drt.CacheWriteSuccess)
    assert sorted(os.listdir(base)) == ["good"]  # nothing of "bad", and no staging root


def test_a_corrupt_file_after_good_ones_fails_the_source(tmp_path, runtime):
    (tmp_path / "d").mkdir()
    pq.write_table(corpus(40), tmp_path / "d" / "0.parquet")
    (tmp_path / "d" / "1.parquet").write_bytes(b"PAR1 truncated")
    (result,) = runtime.write_cache(
        [ParquetSource("d", tmp_path / "d", payload="data")], tmp_path / "out", writer_config=writer_config()
    )
    assert isinstance(result, drt.CacheWriteError)
    assert f"{tmp_path / 'd' / '1.parquet'}: cannot read" in result.message
    assert os.listdir(tmp_path / "out") == []  # no cache, no staging dir, no staging root


def typed_table(n: int) -> pa.Table:
    return pa.table(
        {
            "tokens": pa.array([list(range(i, i + i % 9)) for i in range(n)], pa.list_(pa.int32())),
            "xyz": pa.array([[i, i / 4, -i] for i in range(n)], pa.list_(pa.float32(), 3)),
            "points": pa.array(
                [[[i, -j] for j in range(i % 4)] for i in range(n)], pa.large_list(pa.list_(pa.int16(), 2))
            ),
            "doc": list(range(n)),
        }
    )


@pytest.mark.parametrize(
    "column, spec",
    [
        ("tokens", drt.PayloadSpec("int32", (None,))),
        ("xyz", drt.PayloadSpec("float32", (3,))),
        ("points", drt.PayloadSpec("int16", (None, 2))),
    ],
)
def test_typed_parquet_columns_round_trip_through_the_manifest_spec(tmp_path, runtime, column, spec):
    t = typed_table(260)
    pq.write_table(t, tmp_path / "t.parquet", row_group_size=100)
    source = ParquetSource(column, tmp_path / "t.parquet", payload=column, metadata=["doc"], batch_bytes=1024)
    assert source.payload_spec == spec  # read from the footer, before iteration
    (result,) = runtime.write_cache(
        [source],
        tmp_path / "c",
        writer_config=writer_config("zstd", payload_spec=source.payload_spec, max_shard_bytes=2048),
    )
    ds = drt.CachedDataset([result.path], reader_config=drt.ReaderConfig(seed=0, shuffle=False))
    assert ds.payload_spec == spec
    rows = [ds.payload_spec.decode(s.data) for s in ds]
    assert all(r.dtype == np.dtype(spec.dtype) for r in rows)
    assert [r.tolist() for r in rows] == t.column(column).to_pylist()


def test_numpy_2d_input_round_trips_as_a_dense_spec(tmp_path, runtime):
    data = np.arange(200 * 6, dtype=np.float64).reshape(200, 6) / 3
    source = NumpySource("m", data, index_column="row", batch_bytes=512)
    (result,) = runtime.write_cache([source], tmp_path, writer_config=writer_config(payload_spec=source.payload_spec))
    ds = drt.CachedDataset([result.path], reader_config=drt.ReaderConfig(seed=0, shuffle=False))
    assert ds.payload_spec == drt.PayloadSpec("float64", (6,))
    np.testing.assert_array_equal(np.stack([ds.payload_spec.decode(s.data) for s in ds]), data)


def test_records_that_do_not_fit_the_spec_fail_the_source_naming_file_row_and_column(tmp_path, runtime):
    tokens = [[i, i + 1, i + 2, i + 3] for i in range(120)]
    tokens[37] = [1, 2, 3, 4, 5]
    pq.write_table(pa.table({"tokens": tokens, "doc": range(120)}), tmp_path / "t.parquet", row_group_size=30)
    wide = [[0] * 4 for _ in range(120)]
    wide[99] = [0, 0, 70_000, 0]
    pq.write_table(pa.table({"tokens": wide, "doc": range(120)}), tmp_path / "w.parquet", row_group_size=50)
    spec = drt.PayloadSpec("int16", (4,))
    base = tmp_path / "caches"
    shape, dtype = runtime.write_cache(
        [
            ParquetSource(name, tmp_path / f"{name[0]}.parquet", payload="tokens", payload_spec=spec)
            for name in ("t", "w")
        ],
        base,
        writer_config=writer_config(payload_spec=spec),
    )
    assert isinstance(shape, drt.CacheWriteError) and isinstance(dtype, drt.CacheWriteError)
    assert shape.message == (
        f"Python error: SourceInputError: {tmp_path / 't.parquet'}: row group 1, row 37 (row 7 of "
        f"the row group): payload column 'tokens' holds 5 elements; payload spec int16[4] needs "
        f"4 elements"
    )
    assert dtype.message == (
        f"Python error: SourceInputError: {tmp_path / 'w.parquet'}: row group 1, row 99 (row 49 "
        f"of the row group): payload column 'tokens' value 70000 (int64) does not fit payload "
        f"spec dtype int16"
    )
    assert os.listdir(base) == []  # no cache, no staging dir, no staging root


def test_files_of_one_source_with_different_specs_are_refused(tmp_path, runtime):
    (tmp_path / "d").mkdir()
    pq.write_table(pa.table({"ids": pa.array([[1]], pa.list_(pa.int32())), "n": [0]}), tmp_path / "d" / "0.parquet")
    pq.write_table(pa.table({"ids": pa.array([[2]], pa.list_(pa.int64())), "n": [1]}), tmp_path / "d" / "1.parquet")
    source = ParquetSource("d", tmp_path / "d", payload="ids")
    (result,) = runtime.write_cache(
        [source], tmp_path / "out", writer_config=writer_config(payload_spec=source.payload_spec)
    )
    assert isinstance(result, drt.CacheWriteError)
    assert result.message == (
        f"Python error: SourceInputError: {tmp_path / 'd' / '1.parquet'}: payload spec "
        f"int64[None] differs from int32[None] of {tmp_path / 'd' / '0.parquet'}; give a "
        f"payload_spec to cast them to one"
    )


def test_schema_drift_between_files_fails_the_source_naming_file_and_row(tmp_path, runtime):
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"p": [b"a", b"b"], "n": [1, 2]}), tmp_path / "in" / "a.parquet")
    pq.write_table(pa.table({"p": [b"c", b"d"], "n": [1.5, 2.5]}), tmp_path / "in" / "b.parquet")
    (result,) = runtime.write_cache(
        [ParquetSource("drift", tmp_path / "in")], tmp_path / "out", writer_config=writer_config()
    )
    assert isinstance(result, drt.CacheWriteError)
    assert (
        f"{tmp_path / 'in' / 'b.parquet'}: row group 0, row 0 (row 0 of the row group), sample 2 of the source: "
        "metadata field 'n' expected int, got float" in result.message
    )
    assert not (tmp_path / "out" / "drift").exists()
