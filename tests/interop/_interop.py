"""Shared helpers for the interop suite: one vocabulary over both libraries.

`LIBS` maps a short label to the module: "rt" is the real dataset-rt 0.4.8, "drt" is datasetrt.
Sources, writers and sample keys here work with either, so every test can say "write with A,
read with B" without caring which is which.

Sample keys (`sample_key`) compare exactly: payload bytes, metadata items *in dict order* with the
Python type and, for floats, the bit pattern (so -0.0 != 0.0), cache_id and sample_id.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import dataset_rt as rt
import numpy as np
import polars as pl
from polars.testing import assert_frame_equal

import datasetrt as drt

LIBS = {"rt": rt, "drt": drt}

# serde_json/ryu formatting edge cases (reference §4): decimal for 1e-5 <= |x| < 1e16, else exponent.
TRICKY_FLOATS = [
    1e-5,
    9.9e-6,
    1e-7,
    0.000025,
    1e15,
    1e16,
    1.2345678901234568e17,
    5e-324,
    -0.0,
    0.0,
    0.1,
    1.0,
    -1.5,
    9999999999999998.0,
    1.5e-5,
    0.0001,
    123456.789,
    -2.5e-300,
    1.7976931348623157e308,
    2.2250738585072014e-308,
    1e100,
    -1e-10,
    3.141592653589793,
]
TRICKY_STRINGS = [
    "",
    "plain",
    "ünïcødé é",
    "emoji 😀 and 𝄞",
    'quote " back \\ slash',
    "ctl \n\t\r\b\f",
    "low \x00\x01\x1f high \x7f",
    "/<>&'",
    "line\u2028para\u2029",
    "日本語テキスト",
    " lead and trail ",
]
TRICKY_INTS = [0, -1, 1, -(2**63), 2**63 - 1, 42, -123456789, 2**53 + 1, -(2**31)]
PAYLOAD_SIZES = [0, 1, 17, 300, 0, 2048, 4096, 5000, 3]


def tricky_items(n: int, tag: str) -> list[tuple[bytes, dict]]:
    """n deterministic (payload, metadata) pairs with all four kinds and hard values."""
    items = []
    for i in range(n):
        size = PAYLOAD_SIZES[i % len(PAYLOAD_SIZES)]
        if i % 2:
            payload = bytes((i * 31 + j * 7) % 256 for j in range(size))
        else:
            payload = (f"{tag}:{i};".encode() * (size + 1))[:size]
        meta = {
            "zf": TRICKY_FLOATS[i % len(TRICKY_FLOATS)],
            "s": TRICKY_STRINGS[i % len(TRICKY_STRINGS)] + ("" if i % 3 else f" {tag}"),
            "i": TRICKY_INTS[i % len(TRICKY_INTS)],
            "b": i % 2 == 0,
            "Name": f"{tag}-{i}",
        }
        items.append((payload, meta))
    return items


def plain_items(n: int, tag: str) -> list[tuple[bytes, dict]]:
    """n small samples with simple metadata (for ordering tests)."""
    return [
        (
            f"{tag}/{i}".encode() * (i % 4),
            {"index": i, "kept": i % 3 != 0, "label": f"{tag}-{i % 5}", "score": i * 0.25},
        )
        for i in range(n)
    ]


class Source:
    """A CacheSource yielding `lib.CacheInput`s. `poisoned=True` fails the test if iterated."""

    def __init__(self, lib: Any, name: str, items: list, *, poisoned: bool = False) -> None:
        self.lib, self.name, self.items, self.poisoned = lib, name, list(items), poisoned
        self.iterations = 0

    def __iter__(self):
        self.iterations += 1
        if self.poisoned:
            raise AssertionError(f"source {self.name!r} must not be iterated (its cache exists)")
        for data, metadata in self.items:
            yield self.lib.CacheInput(data, metadata)


def writer_config(lib: Any, algo: str = "none", **kw: Any) -> Any:
    return lib.WriterConfig(show_progress=False, shard_compression=lib.ShardCompression(algo=algo), **kw)


def write(runtime: Any, lib: Any, spec: dict[str, list], base: Path, algo: str = "none", **kw: Any) -> list[Path]:
    """Write {name: items} with `lib`; assert every source succeeded; paths in spec order."""
    sources = [Source(lib, name, items) for name, items in spec.items()]
    results = runtime.write_cache(sources, base, writer_config=writer_config(lib, algo, **kw))
    assert [type(r).__name__ for r in results] == ["CacheWriteSuccess"] * len(spec), results
    assert [r.source_name for r in results] == list(spec)
    return [Path(r.path) for r in results]


def open_ds(runtime: Any, lib: Any, paths: list, **reader_kw: Any) -> Any:
    reader_kw.setdefault("seed", 0)
    return runtime.cached_dataset(list(paths), reader_config=lib.ReaderConfig(**reader_kw))


def float_bits(value: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", value))[0]


def sample_key(sample: Any) -> tuple:
    data, metadata, cache_id, sample_id = sample
    assert type(data) is bytes, type(data)
    meta = tuple((k, type(v).__name__, float_bits(v) if type(v) is float else v) for k, v in metadata.items())
    return (data, meta, cache_id, sample_id)


def take(ds: Any, iterators: int = 1) -> list[tuple]:
    """Sample keys of `iterators` successive full iterators."""
    out: list[tuple] = []
    for _ in range(iterators):
        out.extend(sample_key(s) for s in ds)
    return out


def identities(keys: list[tuple]) -> list[tuple[int, int]]:
    return [(k[2], k[3]) for k in keys]


def assert_frames_identical(a: pl.DataFrame, b: pl.DataFrame) -> None:
    """Same columns, dtypes, rows and float bit patterns (so -0.0 and 0.0 differ)."""
    assert a.schema == b.schema
    assert_frame_equal(a, b)
    for name, dtype in a.schema.items():
        if dtype in (pl.Float64, pl.Float32):
            assert np.array_equal(
                a[name].to_numpy().view(np.uint64 if dtype == pl.Float64 else np.uint32),
                b[name].to_numpy().view(np.uint64 if dtype == pl.Float64 else np.uint32),
            ), name


def expected_keys(spec: dict[str, list], cache_ids: list[int]) -> list[tuple]:
    """The physical-order sample keys the source items must read back as."""
    out = []
    for (_name, items), cid in zip(spec.items(), cache_ids):
        for sid, (data, meta) in enumerate(items):
            out.append(sample_key((bytes(data), dict(sorted(meta.items())), cid, sid)))
    return out


def read_manifest(path: Path) -> dict:
    return json.loads((Path(path) / "manifest.json").read_text())


def rewrite_as_v2(cache: Path) -> None:
    """Rewrite a cache's manifest as format_version 2 without cache_id (pretty JSON)."""
    doc = read_manifest(cache)
    doc.pop("cache_id")
    doc["format_version"] = 2
    (Path(cache) / "manifest.json").write_text(json.dumps(doc, indent=2, ensure_ascii=False))
