"""Hostile-cache generators: caches that pass every check validate_cache=True makes at open
(manifest, shapes, every sha256, the XXH3 sidecar) and still hold something a reader must refuse
or handle as a typed error, never a bare Python exception.

- `empty_cache`: a cache of 0 samples (dataset-rt's writer refuses to make one; a hand-made or
  foreign writer's cache can be one): no shard, an empty index and sidecar, a 0-row metadata.arrow
  of the same schema;
- `huge_int_record`: one record whose embedded JSON holds an integer of `digits` digits (more than
  Python converts by default: `sys.get_int_max_str_digits()`, 4,300).

Each starts from a cache the datasetrt writer made (`tests.reliability.write_template`) and
rewrites its files, then every sha256 the manifest records (`tests.integrity.corrupt.rehash`).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from tests.integrity import corrupt
from tests.reliability import write_template


def empty_cache(base: Path, name: str) -> Path:
    """A self-consistent cache of 0 samples under base/name (it opens with validate_cache=True)."""
    cache = write_template(base, name, 3)
    with pa.memory_map(str(cache / "metadata.arrow")) as source:
        table = ipc.open_file(source).read_all()
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table.slice(0, 0))
    (cache / "metadata.arrow").write_bytes(sink.getvalue().to_pybytes())
    corrupt.write_index(cache, [])
    sidecar = corrupt.sidecar_path(cache)
    if sidecar is not None:
        sidecar.write_bytes(b"")
    doc = corrupt.load_manifest(cache)
    for shard in doc["shards"]:
        (cache / "shards" / shard["name"]).unlink()
    doc["sample_count"], doc["shards"] = 0, []
    corrupt.save_manifest(cache, doc)
    corrupt.rehash(cache)
    return cache


def huge_int_record(base: Path, name: str, *, digits: int = 100_000, sample_id: int = 1, n: int = 3) -> Path:
    """A cache of `n` samples whose record `sample_id` embeds {"index": <`digits` nines>, ...}
    instead of its index; every checksum (sidecar and sha256) is recomputed to match."""
    cache = write_template(base, name, n)
    json_bytes, payload = corrupt.split_record(corrupt.read_record(cache, sample_id))
    head, sep, rest = json_bytes.partition(b'"index":')
    assert sep, json_bytes
    tail = rest[rest.index(b",") :]
    hostile = head + sep + b"9" * digits + tail
    corrupt.replace_records(cache, {sample_id: corrupt.make_record(hostile, payload)})
    return cache
