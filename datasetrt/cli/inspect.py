"""`datasetrt inspect PATH...`: what can be read of each cache (a directory or an object-store URL)
and which file is damaged.

Boundary: reads manifests, file sizes and metadata.arrow through the format layer (objects through
`storage/`); never reads payloads or hashes shards (that is `datasetrt validate`). Owns the
command's output (text or JSON).

Per cache, every check runs even after one fails, so a damaged cache still shows its manifest
summary, its counts and the list of damaged files: the manifest parses; index.bin is 24 bytes per
sample; each shard exists with the manifest's size; metadata.arrow decodes, matches the schema and
its sha256; the checksum sidecar is 8 bytes per sample. A path or URL without a manifest whose
subdirectories (prefixes one level below) hold caches is a base: each of those caches is
inspected, by name. A `tmp` directory without a manifest is the writers' staging root: reported as
such, not as damage. Exit status 1 when any cache is damaged. Cost: one manifest read, a stat per
file and one metadata.arrow decode per cache; at a URL, one listing of the location stands for
the stats and metadata.arrow (and a dictionary) are downloaded into a temporary directory,
removed after.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from datasetrt.cli.remote import RemoteCacheObjects, local_caches, remote_caches
from datasetrt.errors import DatasetRTError, os_error_text
from datasetrt.format.layout import (
    CHECKSUM_ROW_BYTES,
    INDEX_NAME,
    INDEX_ROW_BYTES,
    MANIFEST_NAME,
    METADATA_NAME,
    SHARDS_DIR,
    STAGING_DIR,
)
from datasetrt.format.manifest import Manifest, read_manifest

STAGING_NOTE = "staging directory, not a cache"
SHALLOW_NOTE = (
    "shallow: manifest, file sizes and metadata.arrow, no payload read or shard hashed; "
    "`datasetrt validate PATH` is the deep check"
)


def is_staging_dir(path: Path) -> bool:
    """A writers' staging root <base>/tmp (it holds staging dirs and lock files, never a manifest)."""
    return path.name == STAGING_DIR and path.is_dir() and not (path / MANIFEST_NAME).exists()


@dataclass
class Report:
    """What `inspect` found in one directory. `files`: (name relative to the cache, what was
    read) for each file checked in order; `problems`: (file, what is wrong), empty when healthy."""

    path: Path | str  # a directory, or a cache's URL
    staging: bool = False
    manifest: Manifest | None = None
    metadata_rows: int | None = None
    files: list[tuple[str, str]] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)

    @property
    def status(self) -> str:
        return "staging" if self.staging else "damaged" if self.problems else "ok"

    def summary(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"path": str(self.path), "status": self.status}
        m = self.manifest
        if m is not None:
            doc.update(
                {
                    "format_version": m.format_version,
                    "cache_id": m.cache_id,
                    "source_name": m.source_name,
                    "sample_count": m.sample_count,
                    "payload_spec": _spec_text(m),
                    "schema": [{"name": n, "kind": k} for n, k in m.metadata_schema],
                    "shards": len(m.shards),
                    "shard_bytes": sum(s.byte_len for s in m.shards),
                    "payload_bytes": sum(s.uncompressed_byte_len for s in m.shards),
                    "compression": sorted({s.algo for s in m.shards}),
                    "record_checksums": m.checksums is not None,
                    "zstd_dictionary": None
                    if m.dictionary is None
                    else {
                        "file": m.dictionary.file,
                        "dict_id": m.dictionary.dict_id,
                        "byte_len": m.dictionary.byte_len,
                        "sha256": m.dictionary.sha256,
                    },
                    "metadata_rows": self.metadata_rows,
                }
            )
        doc["check"] = SHALLOW_NOTE
        doc["files"] = [{"file": f, "read": what} for f, what in self.files]
        doc["problems"] = [{"file": f, "problem": what} for f, what in self.problems]
        return doc


def _spec_text(m: Manifest) -> str:
    """The manifest's payload spec as messages show it (`int32[None]`), or what an untyped cache holds."""
    from datasetrt.values.payloads import describe

    return "bytes (no payload spec)" if m.payload_spec is None else describe(*m.payload_spec)


def _described(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class _LocalFiles:
    """The files of a cache directory: sizes by stat, decoders read them in place."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def size(self, name: str) -> int | str:
        """The file's size, or why it cannot be read."""
        try:
            return (self.root / name).stat().st_size
        except OSError as exc:
            return f"cannot be read: {os_error_text(exc)}"

    def manifest(self) -> Manifest:
        return read_manifest(self.root)

    def present(self) -> list[str]:
        return sorted(p.name + ("/" if p.is_dir() else "") for p in self.root.iterdir())

    def local_dir(self, names: list[str]) -> Path:
        """The directory holding local copies of `names` (here: the cache itself)."""
        return self.root

    def text(self, message: str) -> str:
        return message


class _RemoteFiles:
    """The objects of a cache at a URL: sizes from one listing; the files a decoder needs
    (metadata.arrow, the dictionary) downloaded into a private temporary directory, whose path
    messages then show as the cache's URL."""

    def __init__(self, cache: RemoteCacheObjects, tmp: Path) -> None:
        self.cache, self.tmp = cache, tmp

    def size(self, name: str) -> int | str:
        size = self.cache.sizes.get(name)
        return size if size is not None else "cannot be read: no such object in the store"

    def manifest(self) -> Manifest:
        from datasetrt.format.manifest import parse_manifest
        from datasetrt.format.remote import MANIFEST_MAX_BYTES

        raw = self.cache.store.get(MANIFEST_NAME, max_bytes=MANIFEST_MAX_BYTES)
        return parse_manifest(raw, self.cache.store.url_of(MANIFEST_NAME))

    def present(self) -> list[str]:
        return sorted({n.partition("/")[0] + ("/" if "/" in n else "") for n in self.cache.sizes})

    def local_dir(self, names: list[str]) -> Path:
        for name in names:
            size = self.cache.sizes.get(name)
            if size is not None and not (self.tmp / name).exists():
                target = self.tmp / name
                target.parent.mkdir(parents=True, exist_ok=True)
                self.cache.store.download(name, target, start=0, size=size)
        return self.tmp

    def text(self, message: str) -> str:
        return message.replace(str(self.tmp), self.cache.url)


_Files = _LocalFiles | _RemoteFiles


def _check_size(report: Report, files: _Files, name: str, expected: int, unit: int, what: str) -> None:
    size = files.size(name)
    if isinstance(size, str):
        report.problems.append((name, size))
    elif size != expected:
        report.problems.append((name, f"{size:,} bytes, expected {expected:,} ({what})"))
    else:
        report.files.append((name, f"{size:,} bytes" + (f", {size // unit:,} rows" if unit > 1 else "")))


def inspect_dir(path: Path) -> Report:
    """Every check on one directory (see module docstring); never raises for what it finds."""
    report = Report(path)
    if is_staging_dir(path):
        report.staging = True
        return report
    if not path.is_dir():
        report.problems.append(("", "not a directory" if path.exists() else "does not exist"))
        return report
    return _inspect(report, _LocalFiles(path))


def inspect_remote(cache: RemoteCacheObjects) -> Report:
    """Every check on one cache at a URL, from its listed object sizes, its manifest and its
    metadata.arrow (and dictionary) downloaded into a temporary directory removed after;
    storage errors are problems of the file they concern, never raised."""
    with tempfile.TemporaryDirectory(prefix="datasetrt-inspect-") as tmp:
        return _inspect(Report(cache.url), _RemoteFiles(cache, Path(tmp)))


def _inspect(report: Report, files: _Files) -> Report:
    try:
        m = report.manifest = files.manifest()
    except DatasetRTError as exc:
        report.problems.append((MANIFEST_NAME, files.text(_described(exc))))
        present = files.present()
        report.files.append((".", f"holds {', '.join(present) if present else 'nothing'}"))
        return report
    report.files.append(
        (MANIFEST_NAME, f"format v{m.format_version}, {m.sample_count:,} samples, {len(m.shards)} shards")
    )
    _check_size(
        report,
        files,
        INDEX_NAME,
        m.sample_count * INDEX_ROW_BYTES,
        INDEX_ROW_BYTES,
        f"{INDEX_ROW_BYTES} per sample x {m.sample_count:,} samples",
    )
    for shard in m.shards:
        _check_size(report, files, f"{SHARDS_DIR}/{shard.name}", shard.byte_len, 1, "the manifest's byte_len")
    if m.checksums is not None:
        _check_size(
            report,
            files,
            m.checksums.file,
            m.sample_count * CHECKSUM_ROW_BYTES,
            CHECKSUM_ROW_BYTES,
            f"{CHECKSUM_ROW_BYTES} per sample x {m.sample_count:,} samples",
        )
    if m.dictionary is not None:
        from datasetrt.format.dictionary import read_checked

        d = m.dictionary
        try:
            read_checked(files.local_dir([d.file]), d)
        except DatasetRTError as exc:
            report.problems.append((d.file, files.text(_described(exc))))
        else:
            report.files.append((d.file, f"{d.byte_len:,} bytes, dictionary id {d.dict_id}, sha256 ok"))
    from datasetrt.format.reader import CacheHandle  # the metadata decoder (imports pyarrow lazily)

    try:
        table = CacheHandle(files.local_dir([METADATA_NAME]), m).read_metadata()
    except DatasetRTError as exc:
        report.problems.append((METADATA_NAME, files.text(_described(exc))))
    else:
        report.metadata_rows = table.num_rows
        report.files.append((METADATA_NAME, f"{table.num_rows:,} rows, {table.num_columns} columns, sha256 ok"))
    return report


def _print_text(report: Report, out: TextIO) -> None:
    print(f"cache       {report.path}", file=out)
    if report.staging:
        print(f"            {STAGING_NOTE} (writers stage caches and keep lock files here)", file=out)
        return
    m = report.manifest
    if m is not None:
        algos = sorted({s.algo for s in m.shards})
        shard_bytes = sum(s.byte_len for s in m.shards)
        raw_bytes = sum(s.uncompressed_byte_len for s in m.shards)
        print(
            f"source      {m.source_name}  (cache_id {m.cache_id if m.cache_id is not None else 'positional (v2)'})",
            file=out,
        )
        print(
            f"format      v{m.format_version}, compression {', '.join(algos) or 'none'}, "
            f"record checksums {'yes' if m.checksums else 'no'}",
            file=out,
        )
        print(f"samples     {m.sample_count:,}", file=out)
        print(f"payload     {_spec_text(m)}", file=out)
        print(f"shards      {len(m.shards)} files, {shard_bytes:,} bytes stored, {raw_bytes:,} payload bytes", file=out)
        if m.dictionary is not None:
            d = m.dictionary
            print(
                f"dictionary  {d.file}: {d.byte_len:,} bytes, dictionary id {d.dict_id}, sha256 {d.sha256[:16]}...",
                file=out,
            )
        print("schema", file=out)
        for name, kind in m.metadata_schema:
            print(f"  {name:<24} {kind}", file=out)
    print("files", file=out)
    for name, what in report.files:
        print(f"  {name:<24} {what}", file=out)
    for name, what in report.problems:
        print(f"  {name or '.':<24} DAMAGED: {what}", file=out)
    print(
        f"status      {report.status}"
        + (f" ({len(report.problems)} problem{'s' if len(report.problems) > 1 else ''})" if report.problems else ""),
        file=out,
    )
    print(f"check       {SHALLOW_NOTE}", file=out)


def run(
    paths: list[str],
    as_json: bool,
    out: TextIO | None = None,
    err: TextIO | None = None,
    storage: Any = None,
) -> int:
    """Inspect each cache a path or URL names (a cache, or each cache of a base one level below
    it) in turn; print the reports (JSON: one object, or a list of objects for several caches) on
    `out` (stdout) and one `error:` line per problem on `err` (stderr). URLs are reached with
    `storage` (a StorageConfig; None: the environment's). Returns 1 if any cache is damaged, else 0."""
    out = out or sys.stdout
    err = err or sys.stderr
    reports: list[Report] = []
    for text in paths:
        reports.extend(reports_for(text, storage))
    if as_json:
        docs = [r.summary() for r in reports]
        print(json.dumps(docs[0] if len(docs) == 1 else docs, indent=2), file=out)
    else:
        for k, report in enumerate(reports):
            if k:
                print(file=out)
            _print_text(report, out)
    for report in reports:
        for name, what in report.problems:
            print(f"error: {report.path}{'/' + name if name else ''}: {what}", file=err)
    return 1 if any(r.problems for r in reports) else 0


def reports_for(text: str | os.PathLike[str], storage: Any = None) -> list[Report]:
    """The reports of the caches `text` names (a local path or an object-store URL; a base names
    each cache one level below it). A URL that cannot be listed (denied, unreachable, no bucket)
    is one report whose problem says so. ConfigError for a malformed URL or storage options."""
    from datasetrt.storage.urls import parse_location

    location = parse_location(text)
    if isinstance(location, Path):
        return [inspect_dir(p) for p in local_caches(location)]
    store = remote_store(location, storage)
    try:
        caches, top = remote_caches(store)
    except DatasetRTError as exc:
        report = Report(location.url)
        report.problems.append(("", _described(exc)))
        return [report]
    if not caches:
        report = Report(location.url)
        report.problems.append((MANIFEST_NAME, f"missing manifest: {location.url_of(MANIFEST_NAME)}"))
        report.files.append((".", f"holds {', '.join(top) if top else 'nothing'}"))
        return [report]
    return [inspect_remote(cache) for cache in caches]


def remote_store(location: Any, storage: Any = None) -> Any:
    """The ObjectStore of `location` with `storage` (a StorageConfig; None: the default)."""
    from datasetrt.format.remote import Storage
    from datasetrt.values.config import DEFAULT_STORAGE_CONFIG

    return Storage.of(storage if storage is not None else DEFAULT_STORAGE_CONFIG).store(location)
