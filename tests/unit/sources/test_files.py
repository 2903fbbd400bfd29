"""File sources (datasetrt/sources/files.py): Parquet, Arrow IPC / Feather, JSON Lines; locations
in errors; path listing and dispatch (datasetrt/sources/__init__.py)."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from datasetrt import PayloadSpec
from datasetrt.errors import ConfigError, SourceInputError
from datasetrt.sources import (
    ArrowSource,
    JsonLinesSource,
    ParquetSource,
    default_name,
    open_path,
)


def table(n: int, start: int = 0) -> pa.Table:
    return pa.table(
        {
            "text": [f"doc {i} " * (i % 7) for i in range(start, start + n)],
            "label": [i % 3 for i in range(start, start + n)],
            "lang": [("en", "de", "fr")[i % 3] for i in range(start, start + n)],
            "tokens": [list(range(i % 5)) for i in range(start, start + n)],
        }
    )


def expected(t: pa.Table, payload: str = "text", metadata=("label", "lang")) -> list:
    rows = t.to_pylist()
    return [(r[payload].encode(), {m: r[m] for m in metadata}) for r in rows]


def as_items(source) -> list:
    return [(bytes(memoryview(d)), m) for d, m in source]


@pytest.mark.parametrize("codec", ["none", "snappy", "gzip", "brotli", "zstd", "lz4"])
def test_parquet_row_groups_in_order_for_every_codec(tmp_path, codec):
    t = table(250)
    path = tmp_path / "a.parquet"
    pq.write_table(t, path, row_group_size=60, compression=codec)
    source = ParquetSource("a", path, payload="text", metadata=["label", "lang"], batch_bytes=512)
    assert len(source) == 250
    assert as_items(source) == expected(t)


def test_parquet_directory_reads_its_files_sorted_and_only_the_chosen_columns(tmp_path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    parts = [table(30, 0), table(20, 30), table(10, 50)]
    pq.write_table(parts[0], tmp_path / "d" / "part-0.parquet")
    pq.write_table(parts[1], tmp_path / "d" / "part-1.parquet")
    pq.write_table(parts[2], tmp_path / "d" / "sub" / "part-2.parquet")
    (tmp_path / "d" / "_SUCCESS").write_text("")
    source = ParquetSource("d", tmp_path / "d", payload="text", metadata=["label"])
    assert [p.name for p in source.files] == ["part-0.parquet", "part-1.parquet", "part-2.parquet"]
    assert as_items(source) == expected(pa.concat_tables(parts), metadata=("label",))
    assert len(source) == 60


def test_parquet_errors_name_file_row_group_and_row(tmp_path):
    t = table(100)
    text = t.column("text").to_pylist()
    text[73] = None
    pq.write_table(t.set_column(0, "text", pa.array(text)), tmp_path / "bad.parquet", row_group_size=30)
    with pytest.raises(SourceInputError) as info:
        list(ParquetSource("bad", tmp_path / "bad.parquet", payload="text", metadata=["label"]))
    assert str(info.value) == (
        f"{tmp_path / 'bad.parquet'}: row group 2, row 73 (row 13 of the row group): "
        f"payload column 'text' (string) is null"
    )


def test_parquet_list_payload_is_typed(tmp_path):
    t = table(12)
    pq.write_table(t, tmp_path / "t.parquet")
    source = ParquetSource("t", tmp_path / "t.parquet", payload="tokens", metadata=["label"])
    out = list(source)
    assert source.payload_spec == PayloadSpec("int64", (None,))
    assert [d.tolist() for d, _ in out] == t.column("tokens").to_pylist()


def test_unreadable_files_are_named(tmp_path):
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(SourceInputError, match=r"junk.parquet: cannot read: ArrowInvalid"):
        list(ParquetSource("j", tmp_path / "junk.parquet", payload="x"))
    (tmp_path / "junk.arrow").write_bytes(b"not arrow at all")
    with pytest.raises(SourceInputError, match=r"junk.arrow \(neither an Arrow IPC file nor stream"):
        list(ArrowSource("j", tmp_path / "junk.arrow", payload="x"))


def test_paths_missing_or_without_matching_files_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such file or directory"):
        ParquetSource("x", tmp_path / "missing.parquet")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"no Parquet files \(\*\.parquet"):
        ParquetSource("x", tmp_path / "empty")


@pytest.mark.parametrize("kind", ["file", "stream", "feather-lz4", "feather-zstd"])
def test_arrow_ipc_files_streams_and_feather(tmp_path, kind):
    t = table(90)
    batches = t.to_batches(max_chunksize=25)
    path = tmp_path / ("t.arrows" if kind == "stream" else "t.arrow")
    if kind == "file":
        with ipc.new_file(path, t.schema) as w:
            for b in batches:
                w.write_batch(b)
    elif kind == "stream":
        with ipc.new_stream(path, t.schema) as w:
            for b in batches:
                w.write_batch(b)
    else:
        path = tmp_path / "t.feather"
        feather.write_feather(t, path, compression=kind.split("-")[1], chunksize=25)
    source = ArrowSource("t", path, payload="text", metadata=["label", "lang"], batch_bytes=300)
    assert as_items(source) == expected(t)


def test_arrow_errors_name_the_record_batch(tmp_path):
    t = table(50)
    labels = t.column("label").to_pylist()
    labels[31] = None
    t = t.set_column(1, "label", pa.array(labels))
    with ipc.new_file(tmp_path / "t.arrow", t.schema) as w:
        for b in t.to_batches(max_chunksize=20):
            w.write_batch(b)
    with pytest.raises(SourceInputError) as info:
        list(ArrowSource("t", tmp_path / "t.arrow", payload="text", metadata=["label"]))
    assert str(info.value).endswith(
        "t.arrow: record batch 1, row 31 (row 11 of the record batch): metadata column 'label' (int64) is null"
    )


def write_jsonl(path, rows, opener=open):
    with opener(path, "wt") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".ndjson"])
def test_json_lines_plain_and_gzipped_in_blocks(tmp_path, suffix):
    rows = [{"text": f"line {i} " * (i % 9), "label": i % 4, "score": i / 8} for i in range(400)]
    path = tmp_path / f"d{suffix}"
    write_jsonl(path, rows, gzip.open if suffix.endswith(".gz") else open)
    source = JsonLinesSource("d", path, payload="text", batch_bytes=1 << 16)
    assert as_items(source) == [(r["text"].encode(), {"label": r["label"], "score": r["score"]}) for r in rows]


def test_json_lines_column_types_and_typed_tokens(tmp_path):
    rows = [{"tokens": list(range(i % 6)), "id": i} for i in range(20)]
    write_jsonl(tmp_path / "t.jsonl", rows)
    source = JsonLinesSource("t", tmp_path / "t.jsonl", payload="tokens", column_types={"tokens": pa.list_(pa.int32())})
    out = list(source)
    assert source.payload_spec == PayloadSpec("int32", (None,))
    assert [(d.tolist(), m) for d, m in out] == [(r["tokens"], {"id": r["id"]}) for r in rows]


def test_json_lines_errors_name_the_record(tmp_path):
    rows = [{"text": "a", "meta": 1}] * 5 + [{"text": "b", "meta": {"nested": True}}]
    write_jsonl(tmp_path / "n.jsonl", rows)
    with pytest.raises(
        SourceInputError, match=r"n.jsonl: record 5: column .meta.: cannot read: ArrowInvalid: .*changed"
    ):
        list(JsonLinesSource("n", tmp_path / "n.jsonl", payload="text"))
    write_jsonl(tmp_path / "s.jsonl", [{"text": "a", "meta": {"nested": 1}}])
    with pytest.raises(SourceInputError, match=r"nested metadata: column 'meta' has type struct<nested: int64>"):
        list(JsonLinesSource("s", tmp_path / "s.jsonl", payload="text"))
    write_jsonl(tmp_path / "z.jsonl", [{"text": "a", "k": 1}, {"text": None, "k": 2}])
    with pytest.raises(SourceInputError) as info:
        list(JsonLinesSource("z", tmp_path / "z.jsonl", payload="text"))
    assert str(info.value).endswith("z.jsonl: record 1: payload column 'text' (string) is null")


def test_empty_json_lines_file_yields_nothing(tmp_path):
    (tmp_path / "e.jsonl").write_text("")
    assert list(JsonLinesSource("e", tmp_path / "e.jsonl", payload="text")) == []


def test_open_path_dispatch_and_default_names(tmp_path):
    pq.write_table(table(3), tmp_path / "train.parquet")
    write_jsonl(tmp_path / "dev.jsonl.gz", [{"text": "x", "n": 1}], gzip.open)
    (tmp_path / "mixed").mkdir()
    pq.write_table(table(3), tmp_path / "mixed" / "a.parquet")
    write_jsonl(tmp_path / "mixed" / "b.jsonl", [{"text": "x"}])
    (tmp_path / "notes.txt").write_text("")
    assert isinstance(open_path(tmp_path / "train.parquet"), ParquetSource)
    assert open_path(tmp_path / "dev.jsonl.gz").name == "dev"
    assert isinstance(open_path(tmp_path / "dev.jsonl.gz"), JsonLinesSource)
    assert default_name(tmp_path / "train.parquet") == "train"
    assert default_name(tmp_path / "mixed") == "mixed"
    with pytest.raises(ConfigError, match="cannot tell which source"):
        open_path(tmp_path / "mixed")
    with pytest.raises(ConfigError, match="unknown file type"):
        open_path(tmp_path / "notes.txt")
