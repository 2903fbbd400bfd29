"""Cache writer: source items -> staged cache files -> manifest last -> batch sync -> atomic publish.

Boundary: sources, their names and the per-source results; the byte layouts are the staged
cache's (format/shards.py), compression is format/blocks.py's and publication
format/publish.py's. Knows nothing of tables, sampling or reader processes.

Publication protocol (sources in input order; `SourceWriter.stage` here, `Staging` and `Publisher`
in format/publish.py):
  1. take an exclusive flock on <base>/tmp/.<name>.lock (`publish.lock_file_name`: hashed when the name is
     too long for it); a second writer of the same name fails fast, and a stale staging dir left
     by a killed writer is recognised because its lock is free;
  2. stage every file under <base>/tmp/<name>/, hashing while writing;
  3. write metadata.arrow, index.bin, the checksum sidecar, then manifest.json LAST (not synced
     yet); the cache waits in the publisher's batch, its lock held;
  4. per batch (up to `Publisher.BATCH_CACHES` caches or `BATCH_BYTES` bytes, and at the end):
     make every file and directory of the batch durable at once (one syncfs for 16 or more
     caches where syncfs reports errors, else concurrent fsyncs), then rename each <base>/tmp/<name> ->
     <base>/<name> with RENAME_NOREPLACE in input order, unlocking each, then fsync <base> once;
  5. remove <base>/tmp when the write leaves it empty.
A failure at any step removes that source's staging dir; a published cache is never touched, and
no cache is renamed into place before all of its bytes are durable (so after a crash every
<base>/<name> is absent or complete). Per cache this costs no fsync of its own.

Rooms: this module validates names and reads the source (`SourceWriter._ingest`: unpack,
envelope, typed payloads, metadata); one source's staging state is `shards.StagedCache` (the
ordered commit, the group writes, the files) fed by `blocks.Blocks` (ordered compression, the
zstd_dict dictionary); what stands alone lives beside them: `publish` (locks, staging dirs, the
batched sync and renames), `profile` (stage counters), `envelope`, `manifest`, `typed`,
`durable`, `dictionary`.

Typed payloads: with `WriterConfig.payload_spec`, each payload is checked against the spec and
converted to its stored bytes by `format/typed.py` (a mismatch fails the source like any bad
input), and the spec is recorded in the manifest's `datasetrt` section.

Memory: one block of records being read (`Blocks.block_limit`) plus what the blocks and the staged
cache hold (their module docstrings).
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, cast

from datasetrt.errors import CacheIOError, DatasetRTError, DuplicateSourceError, SourceError, os_error_text
from datasetrt.format import envelope
from datasetrt.format.blocks import Blocks
from datasetrt.format.layout import STAGING_DIR
from datasetrt.format.profile import StageProfile, write_profile
from datasetrt.format.publish import (
    Publisher,
    Staged,
    Staging,
    confirm_published,
    io_error_message,
    remove_empty_staging_root,
)
from datasetrt.format.results import CacheWriteError, CacheWriteResult, CacheWriteSuccess
from datasetrt.format.shards import StagedCache
from datasetrt.format.typed import TypedPayloads
from datasetrt.values.config import WriterConfig

# ------------------------------------------------------------------------------------------------
# Source names and the call-level checks
# ------------------------------------------------------------------------------------------------


def source_label(source: Any, position: int, base: Path | None = None) -> tuple[str, str | None]:
    """(label for results, problem message or None). The label is the name when it is a str.

    Messages are dataset-rt 0.4.8's serial-writer wording (reference §2.5).
    """
    try:
        name = source.name
    except Exception as exc:
        return f"source[{position}]", f"Python error: {type(exc).__name__}: {exc}"
    if not isinstance(name, str):
        return (
            f"source[{position}]",
            f"Python error: TypeError: '{type(name).__name__}' object is not an instance of 'str'",
        )
    if name == "":
        return f"source[{position}]", "CacheSource.name must not be empty"
    if name in (".", "..") or "/" in name:
        return f"source[{position}]", f"CacheSource.name must be a plain path segment: got {name!r}"
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"source[{position}]", f"Python error: UnicodeEncodeError: {exc}"
    if "\0" in name:
        return name, "I/O error: file name contained an unexpected NUL byte"
    if name == STAGING_DIR:
        where = (base / STAGING_DIR).absolute() if base is not None else STAGING_DIR
        return name, f"cache path already exists: {where}"
    if len(encoded) > 255:
        return name, f"I/O error: {os_error_text(errno.ENAMETOOLONG)}"
    return name, None


def check_duplicate_names(sources: Sequence[Any], base: Path) -> None:
    """Raise before writing anything when two sources would publish to the same directory."""
    seen: set[str] = set()
    for position, source in enumerate(sources):
        name, problem = source_label(source, position)
        if problem is None:
            if name in seen:
                raise DuplicateSourceError(f"duplicate generated cache path: {(base / name).absolute()}")
            seen.add(name)


# ------------------------------------------------------------------------------------------------
# One source
# ------------------------------------------------------------------------------------------------


class SourceWriter:
    """Stages one source under <base>/tmp/<name>; a failure is a result value (never raised for
    input) and leaves nothing behind. Publication is the `Publisher`'s.

    KeyboardInterrupt and SystemExit propagate after the staging dir is removed.
    """

    def __init__(
        self, base: Path, config: WriterConfig, pool: Executor | None, progress: Any, if_exists: str = "error"
    ) -> None:
        self.base = base
        self.config = config
        self.pool = pool
        self.progress = progress
        self.if_exists = if_exists  # format/overwrite.py: other than "error", a taken name is staged too

    def stage(self, source: Any, name: str, profile: StageProfile) -> CacheWriteResult | Staged:
        """The staged cache, or the source's result when it is decided without staging: an error,
        or the cache an earlier write published without confirming its rename durable
        (`publish.confirm_published`: the source is not read again)."""
        target = self.base / name
        staging = Staging(self.base, name)
        if os.path.lexists(target):
            confirmed = confirm_published(self.base, name, target)
            if confirmed is not None and self.if_exists != "replace":
                return confirmed
        if self.if_exists == "error" and os.path.lexists(target):
            staging.drop_if_stale()
            return CacheWriteError(name, f"cache path already exists: {target.absolute()}")
        try:
            path = staging.acquire()
            try:
                staged = StagedCache(path, name, self.config, profile, self.pool)
                try:
                    self._ingest(source, staged, profile)
                    staged.finish()
                finally:
                    staged.abort()
            except BaseException:
                staging.release()
                raise
        except (DatasetRTError, ValueError) as exc:
            return CacheWriteError(name, str(exc))
        except OSError as exc:
            return CacheWriteError(name, io_error_message(exc))
        return Staged(name, target, staging, staged.files, staged.bytes_written, profile)

    def _ingest(self, source: Any, staged: StagedCache, profile: StageProfile) -> None:
        blocks = Blocks(self.config, staged, self.pool, profile, self.progress)
        block_limit = blocks.block_limit
        try:
            iterator = iter(source)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            raise SourceError(f"Python error: {type(exc).__name__}: {exc}") from None
        jsons: list = []
        payloads: list = []
        raw_lens: list = []
        values: list = []
        typed = TypedPayloads(self.config.payload_spec, staged.name) if self.config.payload_spec is not None else None
        for sample, item in enumerate(_guarded(iterator, profile)):
            try:
                with profile.stage("python_extract"):
                    data, metadata = envelope.unpack_input(item, sample)
                    payload = envelope.as_payload(data, sample) if typed is None else typed(data, sample)
                with profile.stage("metadata_validate"):
                    js, row = staged.accept_metadata(metadata, sample)
            except (DatasetRTError, KeyboardInterrupt, SystemExit):
                raise
            except Exception as exc:
                raise SourceError(f"Python error: {type(exc).__name__}: {exc}") from None
            jsons.append(js)
            payloads.append(payload)
            raw_lens.append(len(payload))
            values.append(row)
            if len(jsons) >= block_limit:
                blocks.push(jsons, payloads, raw_lens, values)
                jsons, payloads, raw_lens, values = [], [], [], []
        if jsons:
            blocks.push(jsons, payloads, raw_lens, values)
        blocks.finish()


def _guarded(iterator: Iterator, profile: StageProfile) -> Iterator:
    """Iterate a source, turning its exceptions (not interrupts) into SourceError."""
    while True:
        start = time.perf_counter_ns()
        try:
            item = next(iterator)
        except StopIteration:
            return
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            raise SourceError(f"Python error: {type(exc).__name__}: {exc}") from None
        profile.add("python_next", time.perf_counter_ns() - start)
        yield item


# ------------------------------------------------------------------------------------------------
# Many sources
# ------------------------------------------------------------------------------------------------


def write_sources(
    sources: Iterable[Any],
    base: Path,
    config: WriterConfig,
    *,
    pool: Executor | None,
    progress: Any,
    reuse_existing: bool = False,
    check_reused: Any = None,
    profiles: list[tuple[str, StageProfile]] | None = None,
    if_exists: str = "error",
) -> tuple[list[CacheWriteResult], list[tuple[str, StageProfile]]]:
    """Write each source in order; per-source failures are values and later sources continue.

    `check_reused(name, path) -> str | None` validates an existing cache when `reuse_existing`
    (None = fine, else the error message). `profiles`, when given, is filled in place as each
    source starts (so a caller still has the finished and the interrupted sources' profiles
    when KeyboardInterrupt/SystemExit propagates) and is the list returned. `if_exists` is what
    a source whose name is taken does (format/overwrite.py; "error" is dataset-rt's).
    """
    if profiles is None:
        profiles = []
    sources = list(sources)
    base = Path(base)
    if not sources:
        return [], []
    check_duplicate_names(sources, base)
    try:
        if base.exists() and not base.is_dir():
            msg = str(CacheIOError.from_os(errno.ENOTDIR, base))
            return [CacheWriteError(source_label(s, i)[0], msg) for i, s in enumerate(sources)], []
        base.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # e.g. permission denied on base or a parent: every source fails alike
        msg = str(CacheIOError.from_os(exc, base))
        return [CacheWriteError(source_label(s, i)[0], msg) for i, s in enumerate(sources)], []
    writer = SourceWriter(base, config, pool, progress, if_exists)
    results: list[CacheWriteResult | None] = []
    publisher = Publisher(base, results, if_exists)
    try:
        for position, source in enumerate(sources):
            label, problem = source_label(source, position, base)
            if problem is not None:
                results.append(CacheWriteError(label, problem))
            elif reuse_existing and os.path.lexists(base / label):
                confirmed = confirm_published(base, label, base / label)
                if confirmed is None:
                    Staging(base, label).drop_if_stale()
                problem = check_reused(label, base / label) if check_reused is not None else None
                reused = confirmed or CacheWriteSuccess(label, base / label)
                results.append(CacheWriteError(label, problem) if problem else reused)
            else:
                profile = StageProfile(config.profiler.enabled)
                profiles.append((label, profile))
                publisher.begin()
                staged = writer.stage(source, label, profile)
                results.append(None if isinstance(staged, Staged) else staged)
                if isinstance(staged, Staged):
                    publisher.add(position, staged)
            if progress is not None:
                progress.source_done(written=results[-1] is None)  # None: staged, published at the flush
    finally:
        # Also on KeyboardInterrupt/SystemExit from a source: the complete caches staged before it
        # are published (as if each were published on its own), the interrupted one never.
        try:
            publisher.flush()
        finally:
            publisher.close()
            remove_empty_staging_root(base)
    return cast("list[CacheWriteResult]", results), profiles  # the last flush filled every None


__all__ = ["CacheIOError", "SourceWriter", "StageProfile", "write_profile", "write_sources"]
