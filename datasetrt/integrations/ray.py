"""Distributed cache builds on Ray Data: a `ray.data.Dataset` written as datasetrt caches, one per
group of `rows_per_cache` consecutive rows, by Ray tasks in parallel across the cluster.

Boundary: the only module that imports Ray (users import it as `datasetrt.ray`; the core never
does). Each task writes its group with the ordinary writer (`DatasetRuntime.from_cache_sources`
over a `RecordBatchSource`): staged under <base>/tmp, manifest last, renamed into place; or, for a
base at an object-store URL (`s3://bucket/prefix`), staged on the task's node, uploaded and
published with a create-only manifest (format/upload.py), its result's `path` the cache's URL.
No byte layout is known here.

How a build runs:
  driver: streams the dataset's blocks in order (Ray Data's `iter_internal_ref_bundles`, with
    `preserve_order`), cuts the row stream into groups [k*R, (k+1)*R) by the blocks' row counts
    (no block is fetched by the driver) and submits one task per group, at most
    `max_tasks_in_flight` at a time (the blocks of unsubmitted groups are not produced ahead);
  task k: fetches its block slices one at a time (`ray.get`), converts them with the column
    mapping and writes cache `<prefix>-<build>-<k:05d>`; when that cache already exists (an
    earlier run, or an attempt that died after publishing) it is kept after a check (its manifest
    opens, its source name matches and it holds the group's row count) and nothing is read.
Typed payloads: the build has one PayloadSpec, given (`payload_spec=` or `writer_config.payload_spec`)
or inferred on the driver from the dataset's schema (a list payload column; Ray Data runs at most its
first block to learn it); every task casts and checks its rows against it and every manifest
records it, so `CachedDataset(build.paths).payload_spec` is that spec.
Names depend only on the input and the build (group index + `build`: the `build_id` given, else a
fingerprint of the column mapping, the writer's byte-affecting settings, rows_per_cache and the
dataset's input files with their sizes and modification times), never on the cluster size or the
block layout, so a retried task and a re-run land on the same names. A task killed mid-write (its
worker died) leaves only its staging dir, which the retry removes (the writer's lock of that name
is free once its holder is dead); a task that fails on its input returns a CacheWriteError and
publishes nothing. At a URL, a task killed mid-upload leaves objects and its writer claim but no
manifest (readers never see them): its retry takes the claim over when it runs on the same node
(the claim's process is provably dead there), else reports the claim, which `datasetrt prune`
removes once it is older than `--min-age`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from datasetrt.dataset.runtime import CacheSourcesDatasetError, DatasetRuntime
from datasetrt.errors import ArgumentTypeError, ConfigError, MissingExtraError, SourceError
from datasetrt.format.results import CacheWriteError, CacheWriteSuccess
from datasetrt.sources import Columns, RecordBatchSource
from datasetrt.storage.urls import parse_location
from datasetrt.values.config import DEFAULT_WRITER_CONFIG, ReaderConfig, WriterConfig

DEFAULT_MAX_RETRIES = 3
MISSING_RAY = "datasetrt.ray.write_caches requires Ray Data to be installed: pip install 'datasetrt[ray]'"


def _import_ray() -> Any:
    """The `ray` module with `ray.data` loaded; `MissingExtraError(MISSING_RAY)` (an ImportError)
    when either cannot be imported."""
    try:
        import ray
        import ray.data
    except ImportError as exc:
        raise MissingExtraError(MISSING_RAY) from exc
    return ray


@dataclass(frozen=True)
class RayBuild:
    """What a build wrote: `results` (one CacheWriteResult per group, in row order), `paths` (the
    caches written or kept, in row order: `CachedDataset(build.paths, ...)`), `build` (the build
    part of the names) and `rows` (rows of the dataset)."""

    results: list
    paths: list = field(default_factory=list)
    build: str = ""
    rows: int = 0

    @property
    def ok(self) -> bool:
        return all(isinstance(r, CacheWriteSuccess) for r in self.results)


def write_caches(
    dataset: Any,
    base: str | os.PathLike,
    *,
    rows_per_cache: int,
    columns: Columns | None = None,
    payload: str | None = None,
    metadata: list[str] | None = None,
    rename: dict | None = None,
    payload_spec: Any = None,
    index_column: str | None = None,
    writer_config: WriterConfig = DEFAULT_WRITER_CONFIG,
    name_prefix: str = "part",
    build_id: str | None = None,
    max_retries: int = DEFAULT_MAX_RETRIES,
    num_cpus: float = 1,
    max_tasks_in_flight: int | None = None,
) -> RayBuild:
    """Write `dataset` (a `ray.data.Dataset`) under `base` (a directory every node sees: shared
    storage; or an object-store URL, `s3://bucket/prefix`, reached from every task with
    `writer_config.storage`) as caches of `rows_per_cache` rows each (the last one may be shorter).

    The column mapping is `columns=Columns(...)` or the keywords of the sources (`payload=`,
    `metadata=`, `rename=`, `payload_spec=`, `index_column=`, which numbers rows dataset-wide).
    The payload spec (see the module docstring) may also come from `writer_config.payload_spec`;
    two different given specs are a ConfigError.
    Each task asks Ray for `num_cpus` CPUs (and compresses with that many threads) and is
    retried up to `max_retries` times when its worker dies. Per-group failures are values in
    `results`; the build goes on with the other groups.
    """
    ray = _import_ray()
    if not isinstance(dataset, ray.data.Dataset):
        raise ArgumentTypeError(f"dataset must be a ray.data.Dataset, got {type(dataset).__name__}")
    columns = Columns.of(columns, payload, metadata, rename, payload_spec, index_column)
    if isinstance(rows_per_cache, bool) or not isinstance(rows_per_cache, int) or rows_per_cache <= 0:
        raise ConfigError(f"rows_per_cache must be a positive int, got {rows_per_cache!r}")
    if not isinstance(writer_config, WriterConfig):
        raise ArgumentTypeError(f"writer_config must be a WriterConfig, got {type(writer_config).__name__}")
    for label, value in (("name_prefix", name_prefix), ("build_id", build_id)):
        if value is not None and (not isinstance(value, str) or not value or "/" in value or value in (".", "..")):
            raise ConfigError(f"{label} must be a non-empty name without '/', got {value!r}")
    location = parse_location(base)
    base_text = str(location.absolute()) if isinstance(location, Path) else location.url
    columns, task_config = _typed(dataset, columns, writer_config)
    build = build_id if build_id is not None else fingerprint(dataset, columns, writer_config, rows_per_cache)
    in_flight = max_tasks_in_flight or max(2, 2 * int(ray.cluster_resources().get("CPU", 1)))
    task = ray.remote(_write_group).options(max_retries=max_retries, num_cpus=num_cpus, retry_exceptions=False)
    threads = max(1, int(num_cpus))
    progress = _progress(writer_config.show_progress)
    results: dict[int, Any] = {}
    pending: deque = deque()  # (group, name, ObjectRef)

    def collect(block: bool) -> None:
        while pending and (block or len(pending) >= in_flight):
            ready, _ = ray.wait([ref for _, _, ref in pending], num_returns=1)
            for item in [p for p in pending if p[2] in ready]:
                pending.remove(item)
                group, name, ref = item
                results[group] = _outcome(ray, name, ref, max_retries)
                if progress is not None:
                    progress.update(1)

    rows = 0
    try:
        for group, slices, first_row, count in _groups(dataset, rows_per_cache):
            name = f"{name_prefix}-{build}-{group:05d}"
            description = f"Ray dataset rows {first_row}..{first_row + count - 1} (cache {name})"
            ref = task.remote(base_text, name, slices, first_row, count, columns, task_config, threads, description)
            pending.append((group, name, ref))
            rows = first_row + count
            collect(block=False)
        collect(block=True)
    except BaseException:  # interrupted or the input failed: stop the writers (their staging dirs are
        for _, _, ref in pending:  # removed by the next write of their names)
            ray.cancel(ref)
        raise
    finally:
        if progress is not None:
            progress.close()
    ordered = [results[g] for g in sorted(results)]
    paths = [r.path for r in ordered if isinstance(r, CacheWriteSuccess)]
    return RayBuild(ordered, paths, build, rows)


def _typed(dataset: Any, columns: Columns, writer_config: WriterConfig) -> tuple[Columns, WriterConfig]:
    """The column mapping and writer settings of every task, both with the build's payload spec
    (None for byte payloads). A schema the mapping cannot read (no payload column) is left to the
    tasks, which report it per group."""
    given, configured = columns.payload_spec, writer_config.payload_spec
    if given is not None and configured is not None and given != configured:
        raise ConfigError(f"payload_spec {given} differs from writer_config.payload_spec {configured}")
    spec = configured if given is None else given
    if spec is None:
        schema = dataset.schema()
        if schema is not None and isinstance(schema.base_schema, pa.Schema):
            try:
                spec = columns.spec_for(schema.base_schema, "Ray dataset")
            except SourceError:
                spec = None
    if given is None and spec is not None:
        columns = columns.with_spec(spec)
    return columns, writer_config.model_copy(update={"show_progress": False, "payload_spec": spec})


def fingerprint(dataset: Any, columns: Columns, writer_config: WriterConfig, rows_per_cache: int) -> str:
    """12 hex digits naming a build: sha256 of the column mapping, the writer settings that change
    the cache bytes, rows_per_cache and the dataset's input files (path, size, mtime). A dataset
    that reads no files (from_items, from_arrow, ...) is named by the parameters alone: give it a
    `build_id` that changes with its content."""
    settings = writer_config.model_dump(
        mode="json", include={"max_shard_bytes", "shard_compression", "record_checksums"}
    )
    doc = {
        "columns": columns.fingerprint(),
        "writer": settings,
        "rows_per_cache": rows_per_cache,
        "files": _input_files(dataset),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:12]


def _input_files(dataset: Any) -> list:
    import pyarrow.fs as pafs

    out = []
    for path in sorted(dataset.input_files()):
        try:
            fs, inner = pafs.FileSystem.from_uri(path) if "://" in path else (pafs.LocalFileSystem(), path)
            info = fs.get_file_info(inner)
            out.append([path, info.size, info.mtime_ns])
        except (OSError, ValueError):  # an unreachable file still names the build by its path
            out.append([path, None, None])
    return out


def _groups(dataset: Any, rows_per_cache: int):
    """(group, [(block ref, start, stop)...], first row, row count) in row order, from the block
    stream of `dataset` with its order preserved (block row counts from Ray's metadata)."""
    context = dataset.context
    keep = context.execution_options.preserve_order
    context.execution_options.preserve_order = True
    try:
        group, first, taken, slices = 0, 0, 0, []
        for bundle in dataset.iter_internal_ref_bundles():
            for ref, start, stop in _bundle_slices(bundle):
                while start < stop:
                    take = min(stop - start, rows_per_cache - taken)
                    slices.append((ref, start, start + take))
                    taken += take
                    start += take
                    if taken == rows_per_cache:
                        yield group, slices, first, taken
                        group, first, taken, slices = group + 1, first + taken, 0, []
        if taken:
            yield group, slices, first, taken
    finally:
        context.execution_options.preserve_order = keep


def _bundle_slices(bundle: Any):
    """(block ref, start row, stop row) of each block of a Ray Data RefBundle: the bundle's slice of
    the block when it has one, else the whole block (its row count from the block metadata, or
    counted by a small task when Ray does not know it)."""
    import ray

    slices = getattr(bundle, "slices", None) or [None] * len(bundle.blocks)
    for entry, piece in zip(bundle.blocks, slices):
        ref, meta = (entry.ref, entry.metadata) if hasattr(entry, "ref") else entry
        if piece is not None:
            yield ref, piece.start_offset, piece.end_offset
            continue
        rows = meta.num_rows
        if rows is None:
            rows = ray.get(ray.remote(_count_rows).remote(ref))
        yield ref, 0, rows


def _count_rows(block: Any) -> int:
    from ray.data.block import BlockAccessor

    return BlockAccessor.for_block(block).num_rows()


def _outcome(ray: Any, name: str, ref: Any, max_retries: int):
    try:
        return ray.get(ref)
    except ray.exceptions.WorkerCrashedError as exc:
        return CacheWriteError(
            name,
            f"the Ray task writing {name} died {max_retries + 1} times "
            f"(max_retries={max_retries}); nothing was published: {exc}",
        )
    except ray.exceptions.RayError as exc:
        return CacheWriteError(
            name, f"the Ray task writing {name} failed; nothing was published: {type(exc).__name__}: {exc}"
        )


def _progress(enabled: bool):
    if not enabled:
        return None
    import sys

    from tqdm import tqdm

    return tqdm(unit=" caches", file=sys.stderr, desc="datasetrt ray build", mininterval=0.5)


def _write_group(
    base: str,
    name: str,
    slices: list,
    first_row: int,
    count: int,
    columns: Columns,
    writer_config: WriterConfig,
    threads: int,
    description: str,
):
    """One Ray task: write (or keep, after checking) the cache `name` of one group of rows."""
    import ray
    from ray.data.block import BlockAccessor

    def tables():
        for ref, start, stop in slices:
            block = ray.get(ref)
            yield BlockAccessor.for_block(block).to_arrow().slice(start, stop - start)

    source = RecordBatchSource(name, tables(), description=description, first_row=first_row, columns=columns)
    with DatasetRuntime(num_workers=threads) as rt:
        out = rt.from_cache_sources(
            source, base, reader_config=ReaderConfig(seed=0, shuffle=False), writer_config=writer_config
        )
    if isinstance(out, CacheSourcesDatasetError):
        return out.results[0]
    written = len(out.dataset)
    out.dataset.close()
    if written != count:
        location = parse_location(base)
        where = location / name if isinstance(location, Path) else location.child(name).url
        return CacheWriteError(
            name,
            f"existing cache {where} holds {written} samples where this "
            f"group has {count}: it is not this build's (use another build_id or base)",
        )
    return out.results[0]
