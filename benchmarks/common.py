"""Shared benchmark plumbing: deterministic workloads, repeat-and-median timing, ratio tables.

Speed figures are ratios measured in the same process run against the peers; nothing here asserts
a speed. Medians over repeats, with min and max, because the machine is shared and noisy.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class Measurement:
    """One contender on one workload: `values` are per-repeat rates (higher is better) or seconds."""

    workload: str
    contender: str
    unit: str
    values: list[float] = field(default_factory=list)
    higher_is_better: bool = True

    @property
    def median(self) -> float:
        return statistics.median(self.values)


def repeat(fn: Callable[[], float], repeats: int) -> list[float]:
    """Run `fn` (returns one figure) `repeats` times with a GC between runs."""
    out = []
    for _ in range(repeats):
        gc.collect()
        out.append(fn())
    return out


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


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
    """`runtime.write_cache([source], base)` with `algo` shard compression and no progress bar;
    `lib` is datasetrt or dataset_rt (same API shape). Returns the written cache's path.
    `typed` ({"dtype": "<i4", "shape": [512]}) records `WriterConfig(payload_spec=PayloadSpec(...))`
    when `lib` has PayloadSpec (datasetrt with typed payloads, issue 11); otherwise it is ignored
    and the cache holds the same bytes untyped."""
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


def machine_facts() -> dict:
    import psutil

    return {
        "cpu_count": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


def ratio_table(measurements: list[Measurement], baseline: str) -> str:
    """Markdown table: one row per (workload, contender), median [min-max], ratio of datasetrt to it."""
    by_workload: dict[str, list[Measurement]] = {}
    for m in measurements:
        by_workload.setdefault(m.workload, []).append(m)
    lines = ["| workload | contender | median | min - max | datasetrt / contender |", "|---|---|---:|---:|---:|"]
    for workload, ms in by_workload.items():
        base = next((m for m in ms if m.contender == baseline), None)
        for m in ms:
            if base is None or not m.values:
                ratio = ""
            elif m.higher_is_better:
                ratio = f"{base.median / m.median:.2f}x"
            else:
                ratio = f"{m.median / base.median:.2f}x"
            lines.append(
                f"| {workload} | {m.contender} | {_fmt(m.median)} {m.unit} | {_fmt(min(m.values))} - {_fmt(max(m.values))} | {ratio} |"
            )
    return "\n".join(lines)


def _fmt(x: float) -> str:
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.4f}"


def save_json(path: Path, measurements: list[Measurement], extra: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"machine": machine_facts(), **extra, "measurements": [asdict(m) for m in measurements]}, indent=2)
    )


def exit_on_different_bytes(failures: list[str]) -> None:
    """End of a run: list the byte mismatches and exit 1, or say that every contender agreed."""
    if failures:
        print("\nDIFFERENT BYTES:\n" + "\n".join(failures))
        sys.exit(1)
    print("\nall contenders produced the same bytes")


def p95_ms(t0: float, stamps: list[float]) -> float | None:
    """95th percentile of the gaps between consecutive batch timestamps (first gap from t0), ms."""
    gaps = [b - a for a, b in zip([t0, *stamps], stamps)]
    if not gaps:
        return None
    return 1e3 * (statistics.quantiles(gaps, n=20)[-1] if len(gaps) > 1 else gaps[0])


def record_rep(
    result: dict, rep: int, repeats: int, n: int, nbytes: int, dt: float, t0: float, stamps: list[float]
) -> None:
    """Repeat 0 also computes the digests, so it is timed only when it is the only repeat."""
    if rep > 0 or repeats == 1:
        result["rates"].append(n / dt)
        result["mib"].append(nbytes / 2**20 / dt)
        p = p95_ms(t0, stamps)
        if p is not None:
            result["p95_batch_ms"].append(p)


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
