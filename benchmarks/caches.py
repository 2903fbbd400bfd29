"""Cache helpers the benchmarks share: deterministic sources, writing a cache with datasetrt or
dataset-rt, many small caches, opening a dataset over them, and one timed read pass.

Boundary: `lib` is the datasetrt or dataset_rt module (same API shape), chosen by the caller
(`rt_lib`); each library is imported only inside the function that needs it, so a peer's child
process never imports the other.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path


def rt_lib(contender: str):
    """The library module of a datasetrt / dataset-rt contender: dataset_rt for a label starting
    with "dataset-rt", datasetrt otherwise."""
    if contender.startswith("dataset-rt"):
        import dataset_rt as lib
    else:
        import datasetrt as lib
    return lib


class PayloadSource:
    """A CacheSource of `count` payloads of `payload_bytes` each, content (position u64, index u64)
    repeated, as dataset-rt's own benchmark; metadata {benchmark_position: int, wide: str}."""

    def __init__(self, name: str, count: int, payload_bytes: int, make_input: Callable) -> None:
        self.name = name
        self.count = count
        self.payload_bytes = payload_bytes
        self.make_input = make_input

    def __iter__(self):
        reps = self.payload_bytes // 16 + 1
        for i in range(self.count):
            payload = ((i).to_bytes(8, "little") + (i * 7919).to_bytes(8, "little")) * reps
            yield self.make_input(payload[: self.payload_bytes], {"benchmark_position": i, "wide": f"w{i % 97:04d}"})


def write_cache(lib, runtime, base: Path, source, algo: str, typed: dict | None = None) -> Path:
    """`runtime.write_cache([source], base)` with `algo` shard compression and no progress bar.
    Returns the written cache's path. `typed` ({"dtype": "<i4", "shape": [512]}) records
    `WriterConfig(payload_spec=PayloadSpec(...))` when `lib` has PayloadSpec (datasetrt's typed
    payloads); otherwise it is ignored and the cache holds the same bytes untyped."""
    spec = (
        {"payload_spec": lib.PayloadSpec(typed["dtype"], tuple(typed["shape"]))}
        if typed and hasattr(lib, "PayloadSpec")
        else {}
    )
    cfg = lib.WriterConfig(show_progress=False, shard_compression=lib.ShardCompression(algo=algo), **spec)
    [result] = runtime.write_cache([source], base, writer_config=cfg)
    assert isinstance(result, lib.CacheWriteSuccess), result
    return Path(result.path)


def write_once(lib, base: Path, count: int, payload_bytes: int, algo: str, name: str = "bench") -> Path:
    """A one-thread runtime (`num_workers=1`) writing a PayloadSource of `count` x `payload_bytes`."""
    return write_cache(
        lib, lib.DatasetRuntime(num_workers=1), base, PayloadSource(name, count, payload_bytes, lib.CacheInput), algo
    )


def make_many_caches(workdir: Path, how_many: int) -> list[Path]:
    """`how_many` valid caches under `workdir/many` (named c00000, c00001, ...): hard links of one
    small cache's files (8 records of 64 bytes), each with its own manifest (source_name and v3
    cache_id rewritten), so ids are distinct and every directory is a real cache."""
    import datasetrt
    import datasetrt.format.layout

    seed = write_once(datasetrt, workdir / "seed", 8, 64, "none", name="seed")
    manifest = json.loads((seed / "manifest.json").read_text())
    base = workdir / "many"
    base.mkdir()
    paths = []
    for i in range(how_many):
        name = f"c{i:05d}"
        d = base / name
        (d / "shards").mkdir(parents=True)
        for rel in (
            "index.bin",
            "metadata.arrow",
            "checksums.xxh3",
            *(f"shards/{s['name']}" for s in manifest["shards"]),
        ):
            os.link(seed / rel, d / rel)
        doc = dict(manifest, source_name=name, cache_id=datasetrt.format.layout.cache_id_for(name))
        (d / "manifest.json").write_text(json.dumps(doc, indent=2))
        paths.append(d)
    return paths


def open_caches(lib, runtime, paths: list[Path]) -> int:
    """Open one dataset over `paths` (seed 1, no shuffle) and return its length: with a runtime,
    `runtime.cached_dataset(paths, ...)`; with `runtime=None` (datasetrt only; dataset-rt always
    needs a runtime), `CachedDataset(paths, ..., runtime=None)`. datasetrt builds the dataset the
    same way in both cases; its workers start only at the first parallel read."""
    cfg = lib.ReaderConfig(seed=1)
    ds = (
        lib.CachedDataset(paths, reader_config=cfg, runtime=None)
        if runtime is None
        else runtime.cached_dataset(paths, reader_config=cfg)
    )
    return len(ds)


def datasetrt_pass(ds, batches: bool, batch: int, on_sample=None) -> tuple[int, int, float, list[float], float | None]:
    """One window of a datasetrt (or dataset-rt) dataset: per-sample (`iter(ds)`) or
    `ds.iter_batches(batch)`. Returns (samples, payload bytes, t0, a timestamp per `batch`
    samples, time of the first sample). `on_sample(data, cache_id, sample_id)` sees every sample
    in order when given (for digests)."""
    n = nbytes = 0
    stamps: list[float] = []
    first_at = None
    t0 = time.perf_counter()
    if batches:
        for b in ds.iter_batches(batch, with_metadata=True):
            if first_at is None:
                first_at = time.perf_counter()
            n += len(b)
            nbytes += len(b.data)
            stamps.append(time.perf_counter())
            if on_sample is not None:
                for i in range(len(b)):
                    on_sample(bytes(b.payload(i)), int(b.cache_id[i]), int(b.sample_id[i]))
    else:
        for sample in ds:
            if first_at is None:
                first_at = time.perf_counter()
            n += 1
            nbytes += len(sample.data)
            if n % batch == 0:
                stamps.append(time.perf_counter())
            if on_sample is not None:
                on_sample(sample.data, sample.cache_id, sample.sample_id)
    return n, nbytes, t0, stamps, first_at
