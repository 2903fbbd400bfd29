"""The staged files of one cache being written: shard files in groups (writev), the index, the
checksum sidecar, metadata.arrow, the dictionary file and the manifest (last); shard rotation.

Boundary: byte layouts (via envelope/manifest/layout) and the staging directory's files; knows
nothing of sources, compression (records arrive stored: format/blocks.py), publication
(format/publish.py), tables, sampling or reader processes.

Ordering: `StagedCache.commit` is the only place records reach disk, in the order given; record =
u64 LE JSON length, JSON, stored payload; a record that would overflow `max_shard_bytes` starts a
new shard (one that is larger on its own sits alone in its shard). Nothing is fsynced here: the
publisher makes a whole batch of caches durable at once.

Shard bytes: records reach the shard file in groups of about `GROUP_BYTES` (a group stays in the
CPU cache between its passes). A record is never joined into one bytes object when its group
averages `LARGE_RECORD_BYTES` or more: the 8-byte length + JSON head and the stored payload go to
the file with one writev per group and are hashed in place (SHA-256 of the shard stream, XXH3-64
of each record as if joined); smaller records are joined into one group buffer (one syscall, one
hash update). With a thread pool a group's XXH3 and writev run on a pool thread while the
calling thread computes its SHA-256 and goes on (at most one group in flight, so the file is
written in order); groups under `POOL_MIN_BYTES` stay on the calling thread (a hand-off costs
more than the work). Every `WRITEBACK_BYTES` of a shard (and for its tail when the shard closes)
the kernel is asked to start writing it back (`durable.start_writeback`), so the batch sync has
little left to wait for. The bytes and the hashes are those of a record-by-record write.

Memory: one group in flight, the index and sidecar arrays (24 + 8 bytes per record) and the
metadata columns (Arrow chunks of `METADATA_CHUNK_ROWS` rows plus one list chunk).
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import sys
import time
from array import array
from concurrent.futures import Executor, Future
from concurrent.futures import wait as wait_futures
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from datasetrt._native import codec
from datasetrt.errors import SourceError
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
    cache_id_for,
    shard_name,
)
from datasetrt.format.manifest import ChecksumSidecar, DictionaryFile, ShardEntry, new_manifest, write_manifest
from datasetrt.format.profile import StageProfile
from datasetrt.values.codecs import CODEC_BY_NAME
from datasetrt.values.config import WriterConfig

ARROW_TYPES = {"bool": pa.bool_(), "int": pa.int64(), "float": pa.float64(), "string": pa.string()}
METADATA_CHUNK_ROWS = 65_536
GROUP_BYTES = 1 << 20  # records are written and hashed in groups of about this many bytes (see above)
LARGE_RECORD_BYTES = 16 << 10  # groups averaging at least this per record are written without joining
WRITEBACK_BYTES = 2 << 20  # ask for the shard's writeback every this many bytes
POOL_MIN_BYTES = 128 << 10  # smaller groups (and compression blocks: format/blocks.py) are done inline:
# a hand-off to a pool thread costs more than hashing, writing or compressing them
_IOV_MAX = 1024  # POSIX IOV_MAX on Linux: most buffers one writev takes
_PAGE = 4096


class StagedCache:
    """Files of one cache being written under its staging directory (`staging`); ordered commit
    of records. Owns the open shard file and the group in flight on `pool`; `abort()` releases
    both, `files` lists every file and directory written (directories last) for the publisher's
    sync."""

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
        self._shard_file: io.FileIO | None = None  # the open shard (unbuffered)
        self._shard_hash: Any = None  # its running SHA-256
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
        shard = self._shard_file
        assert shard is not None  # records are only grouped after `_rotate` opened their shard
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
        job = (shard.fileno(), chunks, heads, bodies, sums, writeback)
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
            write_manifest(self.staging, manifest, durable=False)  # synced with the publisher's batch
            self.files += [self.staging / MANIFEST_NAME, self.staging / SHARDS_DIR, self.staging]

    def _write_file(self, name: str, data: bytes) -> str:
        path = self.staging / name
        self.files.append(path)
        with open(path, "wb", buffering=0) as f:
            writev_all(f.fileno(), [data])
        return hashlib.sha256(data).hexdigest()


def _write_chunks(
    fd: int, chunks: list, heads: list, bodies: list, sums: array | None, writeback: tuple[int, int] | None
) -> array | None:
    """One group of `StagedCache._write_group` (maybe on a pool thread): fill `sums` with the XXH3-64
    of each record heads[i] + bodies[i], write `chunks` (the same bytes, in order) to fd, then
    start the writeback of `writeback` (offset, length) when given. Returns `sums`."""
    if sums is not None:
        codec.xxh3_64_pairs(heads, bodies, sums)
    writev_all(fd, chunks)
    if writeback is not None:
        start_writeback(fd, *writeback)
    return sums


def writev_all(fd: int, chunks: list) -> None:
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
