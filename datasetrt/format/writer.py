"""Cache writer: source items -> staged cache files -> manifest last -> batch sync -> atomic publish.

Boundary: knows the byte layouts (via envelope/manifest/layout) and the filesystem; knows nothing
of tables, sampling or reader processes.

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
<base>/<name> is absent or complete). Per cache this costs no fsync of its own: small caches
used to pay ~8 (each file, both dirs, <base>), most of the time of writing many of them.

One module for one source's staging state (the ordered commit, the group writes, the blocks);
what stands alone lives beside it: `publish` (locks, staging dirs, the batched sync and renames),
`profile` (stage counters), `envelope`, `manifest`, `typed`, `durable`, `dictionary`.

Typed payloads: with `WriterConfig.payload_spec`, each payload is checked against the spec and
converted to its stored bytes by `format/typed.py` (a mismatch fails the source like any bad
input), and the spec is recorded in the manifest's `datasetrt` section.

zstd_dict (a codec with per-cache state): `_Blocks` holds the source's first blocks uncompressed
until the training sample is full (or the source ends), trains the dictionary from it
(format/dictionary.py: which records, the fallback to plain zstd when training fails), then
compresses every block with it; the dictionary file is written with the other files, before the
manifest, which names it. One prepared dictionary (`codec.EncodeState`) is shared by the threads.

Memory: bounded by the in-flight compression blocks (`prefetch_size` records), the one block being
written and the metadata columns (Arrow chunks of 65,536 rows plus one list chunk); zstd_dict adds
its training sample (at most 32 x dict_bytes of payload or 65,536 records) while it is held.

Shard bytes (see `_StagedCache.commit`): records reach the shard file in groups of about
`GROUP_BYTES` (1 MiB: a group stays in the CPU cache between its passes; with 4+ MiB groups the
pool version used 2.5x the CPU on the 2-core benchmark machine). A record is never joined into one
bytes object when its group averages `LARGE_RECORD_BYTES` or more: the 8-byte length + JSON head
and the stored payload go to the file with one writev per group and are hashed in place (SHA-256 of
the shard stream, XXH3-64 of each record as if joined); smaller records are joined into one group
buffer (one syscall, one hash update). With a runtime thread pool a group's XXH3 and writev run on
a pool thread while this thread computes its SHA-256 and goes on with the block (at most one group
in flight, so the file is written in order); groups and compression blocks under `POOL_MIN_BYTES`
stay on this thread (a hand-off costs more than the work). Every `WRITEBACK_BYTES` of a shard (and
for its tail when the shard closes) the kernel is asked to start writing it back
(`durable.start_writeback`), so the batch sync has little left to wait for. The bytes and the
hashes are those of a record-by-record write.
"""

from __future__ import annotations

import errno
import hashlib
import os
import sys
import time
from array import array
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Executor, Future
from concurrent.futures import wait as wait_futures
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from datasetrt._native import codec
from datasetrt.errors import CacheIOError, DatasetRTError, DuplicateSourceError, SourceError
from datasetrt.format import dictionary, envelope
from datasetrt.format.durable import start_writeback
from datasetrt.format.layout import (
    CHECKSUM_ALGO,
    CHECKSUMS_NAME,
    DICTIONARY_NAME,
    INDEX_NAME,
    MANIFEST_NAME,
    METADATA_NAME,
    SHARDS_DIR,
    STAGING_DIR,
    cache_id_for,
    shard_name,
)
from datasetrt.format.manifest import ChecksumSidecar, DictionaryFile, ShardEntry, new_manifest
from datasetrt.format.profile import StageProfile, write_profile
from datasetrt.format.publish import Publisher, Staged, Staging, io_error_message, remove_empty_staging_root
from datasetrt.format.results import CacheWriteError, CacheWriteResult, CacheWriteSuccess
from datasetrt.format.typed import TypedPayloads
from datasetrt.values.codecs import CODEC_BY_NAME, Codec
from datasetrt.values.config import WriterConfig

ARROW_TYPES = {"bool": pa.bool_(), "int": pa.int64(), "float": pa.float64(), "string": pa.string()}
METADATA_CHUNK_ROWS = 65_536
BLOCK_RECORDS = 256
GROUP_BYTES = 1 << 20  # records are written and hashed in groups of about this many bytes (see above)
LARGE_RECORD_BYTES = 16 << 10  # groups averaging at least this per record are written without joining
WRITEBACK_BYTES = 2 << 20  # ask for the shard's writeback every this many bytes
POOL_MIN_BYTES = 128 << 10  # smaller groups / compression blocks are done inline: a hand-off to a pool
# thread costs tens of microseconds (more on a loaded machine), more than hashing or writing them
_IOV_MAX = 1024  # POSIX IOV_MAX on Linux: most buffers one writev takes
_PAGE = 4096


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
        return f"source[{position}]", "CacheSource.name must be a plain path segment"
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
        return name, "I/O error: File name too long (os error 36)"
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


class _Compressor:
    """Turns raw payloads into stored payloads with one codec of the table (datasetrt/values/codecs.py) at
    `level` (thread-confined: it holds the codec's library context). `state` is the cache's
    prepared codec state (`codec.EncodeState`) for a codec that has one (zstd_dict), shared."""

    def __init__(self, codec_row: Codec, level: int, state: Any = None) -> None:
        self.codec = codec_row
        self.level = level
        self.state = state
        self._encoder = None if codec_row.stores_raw else codec.Encoder(codec_row.codec_id, level, state)

    def __call__(self, payloads: list) -> list:
        if self._encoder is None:
            return payloads
        encode = self._encoder.encode
        return [encode(p) for p in payloads]


class _StagedCache:
    """Files of one cache being written under the staging directory; ordered commit of records."""

    def __init__(
        self, staging: Path, name: str, config: WriterConfig, profile: StageProfile, pool: Executor | None = None
    ) -> None:
        self.staging = staging
        self.pool = pool  # when given, groups are written (and XXH3-hashed) on one of its threads
        self.name = name
        self.config = config
        self.policy = config.shard_compression
        self.algo = self.policy.algo  # what the shards record (`use_codec`: zstd_dict may fall back to zstd)
        self.dictionary: bytes | None = None  # zstd_dict's trained dictionary, written at finish
        self.profile = profile
        (staging / SHARDS_DIR).mkdir(parents=True)
        # every file and directory written, for the publisher's sync (fsync_paths); dirs last
        self.files: list[Path] = []
        self.schema: envelope.MetadataSchema | None = None
        self.index = array("Q")
        self.checksums = array("Q")
        self.columns: list[list] = []
        self.column_chunks: list[list[pa.Array]] = []
        self.shards: list[ShardEntry] = []
        self._shard_file = None
        self._shard_hash = None
        self._shard_bytes = 0
        self._shard_raw = 0
        self._shard_submitted = 0  # bytes of the shard handed to _write_group so far
        self._writeback_from = 0  # start of the shard's range not yet asked to be written back
        self._io: Future | None = None  # the group being written on the pool (at most one)
        self.sample_count = 0
        self.bytes_written = 0

    # -- records ----------------------------------------------------------------------------

    def use_codec(self, algo: str, dictionary_bytes: bytes | None) -> None:
        """The codec every record is stored with and its cache's dictionary (None: none); set
        before the first record is committed."""
        assert self.sample_count == 0 and not self.shards
        self.algo = algo
        self.dictionary = dictionary_bytes

    def accept_metadata(self, metadata: Any, sample: int) -> tuple[bytes, tuple]:
        """Sample number `sample` of the source (its position, for messages): JSON and row values."""
        if self.schema is None:
            self.schema = envelope.MetadataSchema(metadata, sample)
            self.columns = [[] for _ in self.schema.names]
            self.column_chunks = [[] for _ in self.schema.names]
        return self.schema.encode(metadata, sample)

    def commit(self, jsons: list, stored: list, raw_lens: list, values: list) -> None:
        """Append a block of encoded records in order (the only place records reach disk).

        Record = u64 LE JSON length, JSON, stored payload; a record that would overflow
        `max_shard_bytes` starts a new shard. Records go to `_write_group` in groups of about
        GROUP_BYTES of one shard (the head + payload pairs, never joined here).
        """
        max_shard = self.config.max_shard_bytes
        index = self.index
        heads: list[bytes] = []
        bodies: list = []
        group_bytes = 0
        for js, payload, raw_len, row in zip(jsons, stored, raw_lens, values):
            head = len(js).to_bytes(8, "little") + js
            rec_len = len(head) + len(payload)
            if self._shard_file is None or (self._shard_bytes > 0 and self._shard_bytes + rec_len > max_shard):
                self._write_group(heads, bodies, group_bytes)
                heads, bodies, group_bytes = [], [], 0
                self._rotate()
            index.append(len(self.shards))
            index.append(self._shard_bytes)
            index.append(rec_len)
            heads.append(head)
            bodies.append(payload)
            group_bytes += rec_len
            self._shard_bytes += rec_len
            self._shard_raw += raw_len
            self.sample_count += 1
            for column, value in zip(self.columns, row):
                column.append(value)
            if group_bytes >= GROUP_BYTES:
                self._write_group(heads, bodies, group_bytes)
                heads, bodies, group_bytes = [], [], 0
        self._write_group(heads, bodies, group_bytes)
        if self.columns and len(self.columns[0]) >= METADATA_CHUNK_ROWS:
            self._flush_columns()

    def _write_group(self, heads: list, bodies: list, nbytes: int) -> None:
        """Append the records heads[i] + bodies[i] (`nbytes` in all) to the current shard, after
        the previous group, and hash them: SHA-256 of the shard stream here, XXH3-64 of each
        record along with the write (`_write_chunks`, on the pool when there is one)."""
        if not heads:
            return
        chunks: list = [None] * (2 * len(heads))
        chunks[0::2] = heads
        chunks[1::2] = bodies
        if nbytes < len(heads) * LARGE_RECORD_BYTES:
            chunks = [b"".join(chunks)]  # small records: one buffer, one syscall, one hash update
        self._wait_io()  # the previous group is in the file: this one follows it
        self._shard_submitted = end = self._shard_submitted + nbytes
        writeback = None
        if end - self._writeback_from >= WRITEBACK_BYTES:
            upto = end & ~(_PAGE - 1)  # whole pages: the partly filled last one is still being written
            writeback = (self._writeback_from, upto - self._writeback_from)
            self._writeback_from = upto
        sums = array("Q", bytes(8 * len(heads))) if self.config.record_checksums else None
        job = (self._shard_file.fileno(), chunks, heads, bodies, sums, writeback)
        if self.pool is not None and nbytes >= POOL_MIN_BYTES:
            self._io = self.pool.submit(_write_chunks, *job)
        else:
            self._collect(_write_chunks(*job))
        update = self._shard_hash.update
        for chunk in chunks:
            update(chunk)
        self.bytes_written += nbytes

    def _wait_io(self) -> None:
        """Wait for the group in flight on the pool (re-raising its error) and take its checksums."""
        io = self._io
        if io is not None:
            try:
                sums = io.result()
            finally:
                if io.done():  # interrupted while it still runs: abort() waits for it
                    self._io = None
            self._collect(sums)

    def _collect(self, sums: array | None) -> None:
        if sums is not None:
            self.checksums.extend(sums)

    def _flush_columns(self) -> None:
        assert self.schema is not None
        for chunks, column, kind in zip(self.column_chunks, self.columns, self.schema.kinds):
            if column:
                chunks.append(pa.array(column, type=ARROW_TYPES[kind]))
                column.clear()

    # -- shards -----------------------------------------------------------------------------

    def _rotate(self) -> None:
        self._close_shard()
        path = self.staging / SHARDS_DIR / shard_name(len(self.shards))
        self.files.append(path)
        self._shard_file = open(path, "wb", buffering=0)  # noqa: SIM115 - closed in _close_shard (unbuffered: _write_group writes whole groups)
        self._shard_hash = hashlib.sha256()
        self._shard_bytes = 0
        self._shard_raw = 0
        self._shard_submitted = 0
        self._writeback_from = 0

    def _close_shard(self) -> None:
        if self._shard_file is None:
            return
        start = time.perf_counter_ns()
        self._wait_io()
        f = self._shard_file
        # No fsync here: the publisher makes a whole batch of caches durable at once. A large shard
        # has its tail's writeback started now, so that sync has little left to wait for.
        if self._shard_bytes - self._writeback_from >= GROUP_BYTES:
            start_writeback(f.fileno(), self._writeback_from, self._shard_bytes - self._writeback_from)
        f.close()
        self._shard_file = None
        algo = self.algo
        takes_level = CODEC_BY_NAME[algo].level is not None
        self.shards.append(
            ShardEntry(
                name=shard_name(len(self.shards)),
                uncompressed_byte_len=self._shard_raw,
                byte_len=self._shard_bytes,
                algo=algo,
                ratio=self.policy.ratio,
                sha256=self._shard_hash.hexdigest(),
                level=self.policy.level if takes_level else None,
            )
        )
        self.profile.add("shard_flush", time.perf_counter_ns() - start, self._shard_bytes)

    def abort(self) -> None:
        io, self._io = self._io, None
        if io is not None:
            wait_futures([io])  # never close the descriptor under a pool thread still writing to it
        if self._shard_file is not None:
            self._shard_file.close()
            self._shard_file = None

    # -- finish -----------------------------------------------------------------------------

    def finish(self) -> None:
        """Write metadata, index, sidecar and manifest (last). Nothing is synced yet: the files
        are durable only after the publisher's sync (`Publisher.flush`)."""
        if self.sample_count == 0:
            raise SourceError("cache source yielded no samples")
        assert self.schema is not None
        self._close_shard()
        with self.profile.stage("finish_metadata"):
            self._flush_columns()
            arrays = [
                pa.chunked_array(chunks, type=ARROW_TYPES[kind]).combine_chunks()
                for chunks, kind in zip(self.column_chunks, self.schema.kinds)
            ]
            fields = [pa.field(n, ARROW_TYPES[k], nullable=False) for n, k in self.schema.items]
            batch = pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))
            metadata_sha = self._write_file(METADATA_NAME, _arrow_file_bytes(batch))
        with self.profile.stage("finish_index"):
            index_sha = self._write_file(INDEX_NAME, _le_bytes(self.index))
            sidecar = None
            if self.config.record_checksums:
                sidecar = ChecksumSidecar(
                    CHECKSUMS_NAME, CHECKSUM_ALGO, self._write_file(CHECKSUMS_NAME, _le_bytes(self.checksums))
                )
            dict_file = None
            if self.dictionary is not None:
                data = self.dictionary
                dict_file = DictionaryFile(
                    DICTIONARY_NAME, dictionary.dictionary_id(data), len(data), self._write_file(DICTIONARY_NAME, data)
                )
        with self.profile.stage("finish_manifest"):
            manifest = new_manifest(
                cache_id=cache_id_for(self.name),
                source_name=self.name,
                sample_count=self.sample_count,
                metadata_schema=tuple(self.schema.items),
                metadata_sha256=metadata_sha,
                index_sha256=index_sha,
                shards=tuple(self.shards),
                checksums=sidecar,
                dictionary=dict_file,
                payload_spec=(spec.dtype, spec.shape) if (spec := self.config.payload_spec) is not None else None,
            )
            self._write_file(MANIFEST_NAME, manifest.to_json().encode("utf-8"))
            self.files += [self.staging / SHARDS_DIR, self.staging]

    def _write_file(self, name: str, data: bytes) -> str:
        path = self.staging / name
        self.files.append(path)
        with open(path, "wb", buffering=0) as f:
            _writev_all(f.fileno(), [data])
        return hashlib.sha256(data).hexdigest()


def _write_chunks(
    fd: int, chunks: list, heads: list, bodies: list, sums: array | None, writeback: tuple[int, int] | None
) -> array | None:
    """One group of `_StagedCache._write_group` (maybe on a pool thread): fill `sums` with the XXH3-64
    of each record heads[i] + bodies[i], write `chunks` (the same bytes, in order) to fd, then
    start the writeback of `writeback` (offset, length) when given. Returns `sums`."""
    if sums is not None:
        codec.xxh3_64_pairs(heads, bodies, sums)
    _writev_all(fd, chunks)
    if writeback is not None:
        start_writeback(fd, *writeback)
    return sums


def _writev_all(fd: int, chunks: list) -> None:
    """Write every buffer of `chunks` to fd in order, up to _IOV_MAX per writev; a partial write
    (signal, file size limit) resumes where it stopped, so an error is raised only by a failing call."""
    i, n = 0, len(chunks)
    copied = False
    while i < n:
        batch = chunks[i : i + _IOV_MAX]
        left = os.writev(fd, batch)
        progressed = left > 0
        for chunk in batch:
            size = len(chunk)
            if left < size:
                break
            left -= size
            i += 1
        else:
            continue
        if not progressed and i < n:
            raise OSError(errno.EIO, "writev wrote nothing")
        if not copied:
            chunks, copied = list(chunks), True
        chunks[i] = memoryview(chunks[i])[left:]


def _le_bytes(values: array) -> bytes:
    if sys.byteorder != "little":
        values = array(values.typecode, values)
        values.byteswap()
    return values.tobytes()


def _arrow_file_bytes(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, batch.schema) as w:
        w.write_batch(batch)
    return sink.getvalue().to_pybytes()


class SourceWriter:
    """Stages one source under <base>/tmp/<name>; a failure is a result value (never raised for
    input) and leaves nothing behind. Publication is the `Publisher`'s.

    KeyboardInterrupt and SystemExit propagate after the staging dir is removed.
    """

    def __init__(self, base: Path, config: WriterConfig, pool: Executor | None, progress: Any) -> None:
        self.base = base
        self.config = config
        self.pool = pool
        self.progress = progress

    def stage(self, source: Any, name: str, profile: StageProfile) -> CacheWriteError | Staged:
        target = self.base / name
        staging = Staging(self.base, name)
        if os.path.lexists(target):
            staging.drop_if_stale()
            return CacheWriteError(name, f"cache path already exists: {target.absolute()}")
        try:
            path = staging.acquire()
            try:
                staged = _StagedCache(path, name, self.config, profile, self.pool)
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

    def _ingest(self, source: Any, staged: _StagedCache, profile: StageProfile) -> None:
        blocks = _Blocks(self.config, staged, self.pool, profile, self.progress)
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


class _Blocks:
    """One source's blocks of encoded records on their way to the shards: compressed inline or on
    the pool, committed in submission order, at most `max_inflight` compressed blocks waiting.

    A codec with per-cache state (zstd_dict) compresses nothing before that state exists: blocks
    are held uncompressed, in order, until the training sample is full or the source ends; then the
    dictionary is trained (or training falls back to plain zstd: format/dictionary.py), the staged
    cache is told which codec its shards record, and the held blocks go out first.
    """

    def __init__(
        self, config: WriterConfig, staged: _StagedCache, pool: Executor | None, profile: StageProfile, progress: Any
    ) -> None:
        self.policy = config.shard_compression
        self.staged, self.pool, self.profile, self.progress = staged, pool, profile, progress
        self.block_limit = max(1, min(BLOCK_RECORDS, config.prefetch_size))
        self.max_inflight = max(1, config.prefetch_size // self.block_limit) + 1
        self.inflight: deque[tuple[Future | list, list, list, list]] = deque()
        self.held: list[tuple[list, list, list, list]] = []
        row = CODEC_BY_NAME[self.policy.algo]
        self.sample = dictionary.TrainingSample(self.policy.dict_bytes) if row.cache_state else None
        self.compress: _Compressor | None = None
        if self.sample is None:
            self._use(row, None)

    def push(self, jsons: list, payloads: list, raw_lens: list, values: list) -> None:
        """Take the next block of the source (records in source order)."""
        if self.compress is None:
            self.held.append((jsons, payloads, raw_lens, values))
            if self.sample.add(payloads):
                self._train()
            return
        self._submit(jsons, payloads, raw_lens, values)

    def finish(self) -> None:
        """Every block committed (training first, on whatever sample there is, if still pending)."""
        if self.compress is None:
            self._train()
        while self.inflight:
            self._drain_one()

    def _use(self, row: Codec, data: bytes | None) -> None:
        state = codec.EncodeState(row.codec_id, data, self.policy.level) if data is not None else None
        self.compress = _Compressor(row, self.policy.level, state)
        self.staged.use_codec(row.name, data)

    def _train(self) -> None:
        sample, self.sample = self.sample, None
        start = time.perf_counter_ns()
        trained = dictionary.train(sample, self.policy.algo)
        self._use(CODEC_BY_NAME[trained.algo], trained.dictionary)
        self.profile.add("compression", time.perf_counter_ns() - start, sample.nbytes)  # training: part of compression
        held, self.held = self.held, []
        for block in held:
            self._submit(*block)

    def _submit(self, jsons: list, payloads: list, raw_lens: list, values: list) -> None:
        compress = self.compress
        if compress.codec.stores_raw:
            self.inflight.append((payloads, jsons, raw_lens, values))
        elif self.pool is not None and sum(raw_lens) >= POOL_MIN_BYTES:
            # Each pooled task gets its own compressor: zstd contexts are not thread-safe (the
            # prepared dictionary is, and is shared).
            future = self.pool.submit(_compress_block, compress.codec, compress.level, compress.state, payloads)
            self.inflight.append((future, jsons, raw_lens, values))
        else:
            start = time.perf_counter_ns()
            stored = compress(payloads)
            self.profile.add("compression", time.perf_counter_ns() - start, sum(raw_lens))
            self.inflight.append((stored, jsons, raw_lens, values))
        while len(self.inflight) >= self.max_inflight:
            self._drain_one()

    def _drain_one(self) -> None:
        stored, jsons, raw_lens, values = self.inflight.popleft()
        if isinstance(stored, Future):
            stored = stored.result()
        staged = self.staged
        before = staged.bytes_written
        start = time.perf_counter_ns()
        staged.commit(jsons, stored, raw_lens, values)
        self.profile.add("disk_write", time.perf_counter_ns() - start, staged.bytes_written - before)
        if self.progress is not None:
            self.progress.advance(len(jsons), sum(raw_lens))  # payload MB/s, before compression


def _compress_block(codec_row: Codec, level: int, state: Any, payloads: list) -> list:
    return _Compressor(codec_row, level, state)(payloads)


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
) -> tuple[list[CacheWriteResult], list[tuple[str, StageProfile]]]:
    """Write each source in order; per-source failures are values and later sources continue.

    `check_reused(name, path) -> str | None` validates an existing cache when `reuse_existing`
    (None = fine, else the error message). `profiles`, when given, is filled in place as each
    source starts (so a caller still has the finished and the interrupted sources' profiles
    when KeyboardInterrupt/SystemExit propagates) and is the list returned.
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
            msg = f"I/O error: Not a directory (os error 20): {base}"
            return [CacheWriteError(source_label(s, i)[0], msg) for i, s in enumerate(sources)], []
        base.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # e.g. permission denied on base or a parent: every source fails alike
        msg = f"I/O error: {exc.strerror} (os error {exc.errno}): {base}"
        return [CacheWriteError(source_label(s, i)[0], msg) for i, s in enumerate(sources)], []
    writer = SourceWriter(base, config, pool, progress)
    results: list[CacheWriteResult | None] = []
    publisher = Publisher(base, results)
    try:
        for position, source in enumerate(sources):
            label, problem = source_label(source, position, base)
            if problem is not None:
                results.append(CacheWriteError(label, problem))
            elif reuse_existing and os.path.lexists(base / label):
                Staging(base, label).drop_if_stale()
                problem = check_reused(label, base / label) if check_reused is not None else None
                results.append(CacheWriteError(label, problem) if problem else CacheWriteSuccess(label, base / label))
            else:
                profile = StageProfile(config.profiler.enabled)
                profiles.append((label, profile))
                publisher.begin()
                staged = writer.stage(source, label, profile)
                results.append(staged if isinstance(staged, CacheWriteError) else None)
                if isinstance(staged, Staged):
                    publisher.add(position, staged)
            if progress is not None:
                progress.source_done()
    finally:
        # Also on KeyboardInterrupt/SystemExit from a source: the complete caches staged before it
        # are published (as when each was published on its own), the interrupted one never.
        try:
            publisher.flush()
        finally:
            publisher.close()
            remove_empty_staging_root(base)
    return results, profiles


__all__ = ["CacheIOError", "SourceWriter", "StageProfile", "write_profile", "write_sources"]
