"""Opening caches: manifest + shape checks at open, lazy index/sidecar maps, metadata, deep checks.

Boundary: files of one cache directory -> `CacheHandle`. Imports numpy, hashlib and pyarrow only
inside the functions that need them (reader workers open caches without them). No tables beyond the raw pyarrow batch
of metadata.arrow, no sampling, no processes.

Open cost (default): one manifest read + parse, one lstat() per file (format/files.py: each must
be a regular file, a link inside the cache) and one realpath() of the directory; no payload,
index or metadata bytes are read. A zstd_dict cache adds one read and sha256 of its dictionary file
(at most 1 MiB, 64 KiB by default), so a missing, altered or foreign dictionary is refused at open.
`validate_deep()` adds the sha256 of every file, an eager decode of metadata.arrow against the
manifest schema, the dictionary loaded by the codec library, and a vectorised check of every index
entry.

Size: over 500 lines because the deep check (every sha256, then naming the damaged records of a
shard by the sidecar) reads the same handle state as the open; it is one section at the end.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from datasetrt._native.codec import DecodeState
from datasetrt._native.mapped import MappedFile
from datasetrt.errors import (
    ArrowFormatError,
    CacheFormatError,
    CacheIOError,
    DatasetRTError,
    IntegrityError,
    ResourceLimitError,
    os_error_text,
)
from datasetrt.format import dictionary, files
from datasetrt.format.layout import (
    CHECKSUM_ROW_BYTES,
    INDEX_NAME,
    INDEX_ROW_BYTES,
    MANIFEST_NAME,
    METADATA_NAME,
    SHARDS_DIR,
)
from datasetrt.format.manifest import Manifest, read_manifest_stat
from datasetrt.storage.urls import RemoteLocation, parse_location
from datasetrt.values.codecs import CODEC_BY_NAME

T = TypeVar("T")

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import numpy as np

    from datasetrt.format.remote import RemoteCache, Storage
    from datasetrt.values.config import PayloadSpec


def _stat(path: str) -> os.stat_result:
    try:
        return os.stat(path)
    except OSError as exc:
        raise CacheIOError.from_os(exc, path) from None


def _fallback_limit_bytes() -> int:
    """The bound of a handle opened without one: half of physical memory (the dataset passes the
    reader's `memory_limit_bytes`, or runtime/memory.py's default, which also knows cgroups)."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2


class CacheHandle:
    """One opened cache directory.

    Invariants after open: the manifest parsed; every file of the cache (manifest.json,
    index.bin, metadata.arrow, each shard, the sidecar and dictionary when named) is a regular
    file, and a symbolic link among them (or shards/ itself) resolves inside the cache directory
    unless the opener allowed external links (format/files.py); index.bin has exactly
    sample_count rows of 24 bytes; every shard exists with size == byte_len; the checksum
    sidecar (if the manifest names one) has sample_count rows of 8 bytes; the zstd_dict
    dictionary (if the manifest names one) has its size, sha256 and id. metadata.arrow is read
    later within the size stat'ed here, and decoded within `memory_limit_bytes`. The index and
    sidecar are mapped lazily, once, read-only and shared (MAP_SHARED) on first use; the codec
    state (the prepared dictionary) is built lazily, once per handle.
    """

    __slots__ = (
        "path",
        "manifest",
        "identity",
        "remote",
        "memory_limit_bytes",
        "metadata_bytes",
        "_index",
        "_checksums",
        "_codec_state",
    )

    def __init__(
        self,
        path: Path,
        manifest: Manifest,
        identity: tuple[int, ...] = (),
        remote: RemoteCache | None = None,
        memory_limit_bytes: int | None = None,
        metadata_bytes: int | None = None,
    ) -> None:
        self.path = path
        self.manifest = manifest
        # A cache at an object-store URL: `path` is its mirror on this node (format/remote.py),
        # whose shards are fetched when a read first needs them (`shard_path`).
        self.remote = remote
        # (dev, inode, mtime_ns) of manifest.json and index.bin (6 ints), then of the dictionary
        # when there is one (9 ints), as opened: a cache replaced at the same path since then is
        # a different cache (reader workers compare it before reading).
        self.identity = identity
        # The bound on what decoding metadata.arrow may allocate (None: half of physical memory),
        # and metadata.arrow's size as stat'ed at open (None: a handle made without `open`).
        self.memory_limit_bytes = memory_limit_bytes
        self.metadata_bytes = metadata_bytes
        self._index: MappedFile | None = None
        self._checksums: MappedFile | None = None
        self._codec_state: DecodeState | None = None

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str] | RemoteLocation,
        storage: Storage | None = None,
        remote: RemoteCache | None = None,
        *,
        external_links: bool = False,
        memory_limit_bytes: int | None = None,
        parents: dict[str, str] | None = None,
    ) -> CacheHandle:
        """Read the manifest and check shapes (no content is read). O(shards) stat calls.

        `path` may be an object-store URL (or a `RemoteLocation`): the cache is opened through
        its mirror on this node (`format.remote.open_remote`, with `storage`), and its shards
        are checked against the manifest when they are fetched rather than stat'ed here. A
        `file://` URL is its local path. `remote` reopens a mirror a process already made (a
        reader worker). `external_links=True` accepts cache files that are symbolic links out
        of the cache directory (`ReaderConfig.allow_external_links`); every file must still be
        a regular file. `memory_limit_bytes` bounds what decoding metadata.arrow may allocate.
        `parents`: a memo of resolved parent directories shared by the caches one call opens
        (`files.resolved_dir`)."""
        local: str | os.PathLike[str]  # the directory read here: the cache's own, or its mirror
        if remote is not None:
            local = remote.mirror_dir
        elif isinstance(path, os.PathLike):
            local = path
        else:
            location = parse_location(path)
            if isinstance(location, RemoteLocation):
                from datasetrt.format.remote import open_remote  # lazily: obstore only for URLs

                remote = open_remote(location, storage if storage is not None else _default_storage())
                local = remote.mirror_dir
            else:
                local = location
        root = os.fspath(local)
        inside = None if external_links else files.resolved_dir(root, parents)
        manifest, manifest_st = read_manifest_stat(root, inside=inside)
        # (string concatenation: os.path.join costs more than a check here; names are plain segments)
        base = root if root.endswith(os.sep) else root + os.sep
        index_path = base + INDEX_NAME
        index_st = files.check_file(index_path, inside)
        index_size = index_st.st_size
        if index_size % INDEX_ROW_BYTES:
            raise CacheFormatError(f"index length is not divisible by row size: {index_path}")
        if index_size // INDEX_ROW_BYTES != manifest.sample_count:
            raise CacheFormatError(
                f"index row count does not match manifest: {index_path} has "
                f"{index_size // INDEX_ROW_BYTES} rows, manifest sample_count is {manifest.sample_count}"
            )
        shards_dir = base + SHARDS_DIR
        if manifest.shards:  # (a missing one: each shard's stat names it)
            files.check_dir(shards_dir, inside, missing_ok=True)
        for shard in manifest.shards:
            shard_path = shards_dir + os.sep + shard.name
            if remote is not None and not os.path.exists(shard_path):
                continue  # fetched (and checked) when a read first needs it
            if files.check_file(shard_path, inside).st_size != shard.byte_len:
                raise CacheFormatError(f"shard length mismatch for {shard_path}")
        metadata_bytes = files.check_file(base + METADATA_NAME, inside).st_size
        if manifest.checksums is not None:
            sidecar = base + manifest.checksums.file
            if files.check_file(sidecar, inside).st_size != manifest.sample_count * CHECKSUM_ROW_BYTES:
                raise CacheFormatError(f"checksum sidecar length mismatch for {sidecar}")
        identity: tuple[int, ...] = (
            manifest_st.st_dev,
            manifest_st.st_ino,
            manifest_st.st_mtime_ns,
            index_st.st_dev,
            index_st.st_ino,
            index_st.st_mtime_ns,
        )
        if manifest.dictionary is not None:
            files.check_file(base + manifest.dictionary.file, inside)
            _data, dict_st = dictionary.read_checked(root, manifest.dictionary)
            identity += (dict_st.st_dev, dict_st.st_ino, dict_st.st_mtime_ns)
        path = local if isinstance(local, Path) else Path(local)
        return cls(path, manifest, identity, remote, memory_limit_bytes, metadata_bytes)

    @property
    def sample_count(self) -> int:
        return self.manifest.sample_count

    def _check_still_opened(self) -> None:
        """Refuse (CacheFormatError) when manifest.json or index.bin at this path is no longer the
        file that was opened (a cache replaced or rewritten since). Called right after a lazy map:
        a mapping made before a replacement passes and keeps the opened cache's bytes; one made
        after it fails here. Two stat calls; skipped for handles built without an identity."""
        if not self.identity:
            return
        root = os.fspath(self.path)
        m, i = _stat(os.path.join(root, MANIFEST_NAME)), _stat(os.path.join(root, INDEX_NAME))
        # identity[6:] is the dictionary's (zstd_dict), checked when its state is built
        if (m.st_dev, m.st_ino, m.st_mtime_ns, i.st_dev, i.st_ino, i.st_mtime_ns) != self.identity[:6]:
            raise CacheFormatError(f"cache changed on disk since it was opened: {self.path}")

    def index_map(self) -> MappedFile:
        """The mapped index.bin (sample_count x 24 bytes) of the cache as opened."""
        if self._index is None:
            index_file = self._local(INDEX_NAME, self.sample_count * INDEX_ROW_BYTES, self.manifest.index_sha256)
            mapped = MappedFile(index_file)
            if mapped.size != self.sample_count * INDEX_ROW_BYTES:
                raise CacheFormatError(
                    f"index row count does not match manifest: {self.path / INDEX_NAME} changed on disk"
                )
            self._check_still_opened()
            self._index = mapped
        return self._index

    def checksum_map(self) -> MappedFile | None:
        """The mapped checksum sidecar, or None for caches written without one (e.g. by dataset-rt)."""
        if self.manifest.checksums is None:
            return None
        if self._checksums is None:
            sidecar = self.manifest.checksums
            mapped = MappedFile(self._local(sidecar.file, self.sample_count * CHECKSUM_ROW_BYTES, sidecar.sha256))
            if mapped.size != self.sample_count * CHECKSUM_ROW_BYTES:
                raise CacheFormatError(f"checksum sidecar length mismatch for {mapped.path}")
            self._check_still_opened()
            self._checksums = mapped
        return self._checksums

    def codec_state(self) -> DecodeState | None:
        """The cache's prepared codec state (zstd_dict: its dictionary as a ZSTD_DDict), or None
        for caches without one. Built once per handle from the file, checked again (size, sha256,
        id: the file may have changed since open), and shared by every reading thread; holds about
        the dictionary's size plus its entropy tables (`DecodeState.nbytes`)."""
        entry = self.manifest.dictionary
        if entry is None:
            return None
        if self._codec_state is None:
            data, _st = dictionary.read_checked(self.path, entry)
            codec_id = next(
                CODEC_BY_NAME[s.algo].codec_id for s in self.manifest.shards if CODEC_BY_NAME[s.algo].cache_state
            )
            self._codec_state = DecodeState(codec_id, data, str(self.path / entry.file))
        return self._codec_state

    def index_array(self) -> np.ndarray:
        """The index as a read-only (sample_count, 3) uint64 view of the mapping (zero copy)."""
        import numpy as np  # lazily: reader workers open caches without numpy

        return np.frombuffer(memoryview(self.index_map()), dtype="<u8").reshape(-1, 3)

    def scan_index(self, fn: Callable[[np.ndarray], T]) -> T:
        """`fn(index)` over the (sample_count, 3) uint64 index: the handle's mapping when it has
        one, else a mapping made for this call and unmapped after it, so a scan over many caches
        (planning a run over 10^5 of them) leaves no mapping behind (a process has at most
        vm.max_map_count). `fn` must not keep a view of the index."""
        import numpy as np  # lazily: reader workers open caches without numpy

        if self._index is not None:
            return fn(self.index_array())
        mapped = self.index_map()
        self._index = None
        index = np.frombuffer(memoryview(mapped), dtype="<u8").reshape(-1, 3)
        try:
            return fn(index)
        finally:
            del index
            try:
                mapped.close()
            except BufferError:  # fn kept a view: the mapping lives as long as that view
                pass

    def shard_paths(self) -> list[Path]:
        return [self.path / SHARDS_DIR / s.name for s in self.manifest.shards]

    @property
    def source(self) -> str:
        """Where the cache lives, as the user named it: its URL, or its directory."""
        return self.remote.url if self.remote is not None else str(self.path)

    def shard_path(self, shard: int, *, pin: bool = False) -> Path:
        """The local file of shard `shard`: fetched to the node first for a remote cache (and
        with `pin`, pinned in the node cache until `unpin_shard`; a no-op for a local cache)."""
        if self.remote is not None:
            return self.remote.ensure_shard(self.manifest, shard, pin=pin)
        return self.path / SHARDS_DIR / self.manifest.shards[shard].name

    def unpin_shard(self, shard: int) -> None:
        """Drop one node-cache pin of shard `shard` taken by `shard_path(shard, pin=True)`."""
        if self.remote is not None:
            self.remote.unpin_shard(self.manifest, shard)

    def _local(self, name: str, size: int | None, sha256: str) -> Path:
        """The local file `name` of the cache: for a remote cache, fetched again when the node
        cache evicted it since open."""
        path = self.path / name
        if self.remote is not None and not path.exists():
            from datasetrt.format.remote import METADATA_MAX_BYTES

            return self.remote.ensure(name, size=size, sha256=sha256, max_bytes=None if size else METADATA_MAX_BYTES)
        return path

    # -- metadata.arrow ---------------------------------------------------------------------

    def read_metadata(self, *, validating: bool = False) -> Any:
        """Decode metadata.arrow and check it against the manifest (schema, kinds, row count).

        Columns are returned in manifest (sorted) order, strings normalised to utf8, null-free
        columns required. The whole file is read into memory (within the size stat'ed at open)
        and the file closed. `validating=True` (validate_cache) words a kind mismatch as
        dataset-rt's validator does ("metadata 'x' is not float"); otherwise as its lazy decoder
        ("does not match manifest schema").

        Nothing is decoded before it is sized (format/arrow_ipc.py): the schema is checked
        against the manifest from the footer, then the file's record batches may declare at most
        sample_count rows (else the row-count error), each compressed buffer at most what its
        column's rows need (ArrowFormatError naming the column), and the file plus every buffer
        decoding allocates at most `memory_limit_bytes` (ResourceLimitError naming the file).

        Framing faults follow dataset-rt 0.4.8 (checked against it): fewer than 10 bytes, no leading
        ARROW1 magic, or a footer length of 0 or past the file is CacheFormatError "invalid metadata
        Arrow footer" (its ValueError); a leading magic without the trailing one (a truncated file) or
        a negative footer length is ArrowFormatError "Arrow error: Parser error: ..." (its RuntimeError).
        """
        import hashlib

        import pyarrow as pa  # lazily: reader worker processes never decode metadata.arrow
        import pyarrow.ipc as ipc

        from datasetrt.format import arrow_ipc

        arrow_kind = {"bool": pa.bool_(), "int": pa.int64(), "float": pa.float64()}
        string_types = (pa.string(), pa.large_string(), pa.string_view())
        limit = self.memory_limit_bytes or _fallback_limit_bytes()
        path = self._local(METADATA_NAME, None, self.manifest.metadata_sha256)
        data = self._read_metadata_file(path, limit)
        if len(data) < 10 or data[:6] != b"ARROW1":
            raise CacheFormatError(f"invalid metadata Arrow footer: {path}")
        if data[-6:] != b"ARROW1":
            raise ArrowFormatError(f"Arrow error: Parser error: Arrow file does not contain correct footer: {path}")
        footer_len = int.from_bytes(data[-10:-6], "little", signed=True)
        if footer_len < 0:
            raise ArrowFormatError(f"Arrow error: Parser error: Invalid footer length: {footer_len}: {path}")
        if footer_len == 0 or footer_len > len(data) - 18:
            raise CacheFormatError(f"invalid metadata Arrow footer: footer length {footer_len}: {path}")
        try:
            reader = ipc.open_file(pa.py_buffer(data))  # the footer and schema only: no batch is read
            fields = {f.name: f.type for f in reader.schema}  # a name that is not UTF-8 is a UnicodeDecodeError
            n_fields = len(reader.schema)
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise ArrowFormatError(f"Arrow error: {exc}: {path}") from None
        schema = self.manifest.metadata_schema
        if n_fields != len(schema):
            raise CacheFormatError(f"metadata batch column count does not match manifest: {path}")
        for name, kind in schema:
            if name not in fields:
                raise CacheFormatError(f"metadata column '{name}' does not match manifest schema: {path}")
            ok = fields[name] in string_types if kind == "string" else fields[name] == arrow_kind[kind]
            if not ok:
                if validating:
                    raise CacheFormatError(f"metadata '{name}' is not {kind}: {path}")
                raise CacheFormatError(f"metadata column '{name}' does not match manifest schema: {path}")
        try:
            batches = arrow_ipc.scan(data, footer_len)
        except arrow_ipc.IpcStructureError as exc:
            raise ArrowFormatError(f"Arrow error: Invalid: {exc}: {path}") from None
        layout = [(f.name, str(f.type)) for f in reader.schema]
        fault, allocated = arrow_ipc.check_sizes(batches, layout, self.sample_count)
        if fault is not None and fault.kind == "rows":
            raise CacheFormatError(
                f"metadata row count for cache {self.path} expected {self.sample_count}, got at least {fault.rows} "
                f"(metadata row count does not match manifest): {path}"
            )
        if fault is not None:
            raise ArrowFormatError(f"Arrow error: Invalid: {fault.detail}: {path}")
        if len(data) + allocated > limit:
            raise ResourceLimitError(
                f"metadata.arrow's compressed buffers declare {allocated} decoded bytes, which with the file's "
                f"{len(data)} exceed the memory limit of {limit} bytes (ReaderConfig.memory_limit_bytes): {path}"
            )
        try:
            table = reader.read_all()
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise ArrowFormatError(f"Arrow error: {exc}: {path}") from None
        columns = []
        for name, kind in schema:
            column = table.column(name)
            if kind == "string" and column.type != pa.string():
                column = column.cast(pa.string())
            if column.null_count:
                raise CacheFormatError(f"metadata column '{name}' contains null: {path}")
            columns.append(column)
        if table.num_rows != self.sample_count:
            raise CacheFormatError(
                f"metadata row count for cache {self.path} expected {self.sample_count}, got {table.num_rows} "
                f"(metadata row count does not match manifest): {path}"
            )
        if not validating and hashlib.sha256(data).hexdigest() != self.manifest.metadata_sha256:
            # Beyond dataset-rt: the table drives filters and weights, so a well-formed but altered
            # metadata.arrow must not pass silently. Hashed once, when the table is first decoded.
            raise IntegrityError(f"checksum mismatch for {path}")
        return pa.table(columns, names=[n for n, _ in schema])

    def _read_metadata_file(self, path: Path, limit: int) -> bytes:
        """metadata.arrow's bytes: a regular file of the size stat'ed at open (any size, for a
        handle made without `open`), at most `limit` bytes (ResourceLimitError)."""
        size = self.metadata_bytes if self.remote is None else None  # (a mirror's file may be fetched again)
        try:
            st_size = os.stat(path).st_size if size is None else size
        except OSError as exc:
            raise CacheIOError.from_os(exc, path) from None
        if st_size > limit:
            raise ResourceLimitError(
                f"metadata.arrow is {st_size} bytes, over the memory limit of {limit} bytes "
                f"(ReaderConfig.memory_limit_bytes): {path}"
            )
        data, _st = files.read_regular(path, size=size, max_bytes=limit, what="metadata.arrow")
        return data

    # -- deep validation --------------------------------------------------------------------

    def validate_deep(self) -> None:
        """validate_cache=True: every sha256, metadata decode and schema, every index entry in range.
        Each file is hashed within the size it was declared or stat'ed at open (format/files.py)."""
        import numpy as np

        m = self.manifest
        meta = self._local(METADATA_NAME, None, m.metadata_sha256)
        _check_sha256(meta, m.metadata_sha256, self.metadata_bytes if self.remote is None else None)
        index_bytes = m.sample_count * INDEX_ROW_BYTES
        _check_sha256(self._local(INDEX_NAME, index_bytes, m.index_sha256), m.index_sha256, index_bytes)
        for k, shard in enumerate(m.shards):  # a remote cache's shards are fetched (once per node) to be hashed
            path = self.shard_path(k)
            try:
                _check_sha256(path, shard.sha256, shard.byte_len)
            except IntegrityError as exc:
                raise IntegrityError(f"{exc}: {self._damaged_records(k, path)}") from None
        if m.checksums is not None:
            sidecar = m.checksums
            sidecar_bytes = m.sample_count * CHECKSUM_ROW_BYTES
            _check_sha256(self._local(sidecar.file, sidecar_bytes, sidecar.sha256), sidecar.sha256, sidecar_bytes)
        self.codec_state()  # the dictionary: size, sha256, id, and loaded by the codec library
        self.read_metadata(validating=True)
        index = self.index_array()
        if len(index):
            shard_ids, offsets, lengths = index[:, 0], index[:, 1], index[:, 2]
            bad = np.flatnonzero(shard_ids >= len(m.shards))
            if bad.size:
                raise CacheFormatError(
                    f"index references missing shard {int(shard_ids[bad[0]])}: {self.path / INDEX_NAME} row {int(bad[0])}"
                )
            shard_lens = np.array([s.byte_len for s in m.shards], dtype=np.uint64)[shard_ids.astype(np.int64)]
            out = (offsets > shard_lens) | (lengths > shard_lens - np.minimum(offsets, shard_lens)) | (lengths < 8)
            bad = np.flatnonzero(out)
            if bad.size:
                raise CacheFormatError(
                    f"invalid binary record: index row {int(bad[0])} lies outside its shard: {self.path / INDEX_NAME}"
                )

    def _damaged_records(self, shard: int, path: Path) -> str:
        """Which samples of shard `shard` (file `path`, whose sha256 did not match) are damaged, by
        their per-record XXH3 in the checksum sidecar (itself checked against its sha256 first), for
        the message of a failed deep validation; or why they cannot be named. Error path only:
        reads the shard once more in spans of at most DAMAGE_SPAN_BYTES (a record larger than that is
        its own span) and hashes its records; the index, already hashed, says where they lie."""
        import numpy as np

        from datasetrt._native import codec

        m = self.manifest
        if m.checksums is None:
            return "the cache has no per-record checksums (checksums.xxh3), so the damaged record cannot be named"
        sidecar_bytes = m.sample_count * CHECKSUM_ROW_BYTES
        try:
            _check_sha256(
                self._local(m.checksums.file, sidecar_bytes, m.checksums.sha256), m.checksums.sha256, sidecar_bytes
            )
            checksum_map = self.checksum_map()
            assert checksum_map is not None
            expected = np.frombuffer(memoryview(checksum_map), dtype="<u8")
            index = self.index_array()
        except DatasetRTError as exc:
            return f"the damaged record cannot be named ({exc})"
        byte_len = m.shards[shard].byte_len
        rows = np.flatnonzero(index[:, 0] == shard)
        offsets, lengths = index[rows, 1], index[rows, 2]
        inside = (offsets <= byte_len) & (lengths <= byte_len - np.minimum(offsets, byte_len))
        rows, offsets, lengths = rows[inside], offsets[inside], lengths[inside]  # the rest: the bounds check's
        order = np.argsort(offsets, kind="stable")
        rows, offsets, lengths = rows[order].tolist(), offsets[order].tolist(), lengths[order].tolist()
        damaged: list[int] = []
        try:
            fd, _st = files.open_regular(path)
        except OSError as exc:
            return f"the damaged record cannot be named ({os_error_text(exc)})"
        try:
            start = 0
            while start < len(rows):
                stop = start + 1
                span_start = offsets[start]
                while stop < len(rows) and offsets[stop] + lengths[stop] - span_start <= DAMAGE_SPAN_BYTES:
                    stop += 1
                span_end = max(o + n for o, n in zip(offsets[start:stop], lengths[start:stop]))
                data = os.pread(fd, span_end - span_start, span_start)
                records = [
                    data[o - span_start : o - span_start + n] for o, n in zip(offsets[start:stop], lengths[start:stop])
                ]
                sums = np.zeros(len(records), dtype=np.uint64)
                codec.xxh3_64_pairs(records, [b""] * len(records), sums)
                wanted = expected[rows[start:stop]]
                damaged += [rows[start + i] for i in np.flatnonzero(sums != wanted).tolist()]
                start = stop
        except OSError as exc:
            return f"the damaged record cannot be named ({os_error_text(exc)})"
        finally:
            os.close(fd)
        if not damaged:
            return f"each of its {len(rows):,} records matches its per-record checksum (the damage lies outside them)"
        damaged.sort()
        shown = ", ".join(map(str, damaged[:DAMAGE_SHOWN]))
        more = f" and {len(damaged) - DAMAGE_SHOWN:,} more" if len(damaged) > DAMAGE_SHOWN else ""
        noun = "record: sample" if len(damaged) == 1 else f"records ({len(damaged):,} of {len(rows):,}): samples"
        return f"damaged {noun} {shown}{more} of {self.source} (per-record checksum mismatch)"


DAMAGE_SPAN_BYTES = 8 << 20  # `_damaged_records` reads a damaged shard in spans of at most this
DAMAGE_SHOWN = 10  # sample ids a message lists


def _default_storage() -> Storage:
    """The storage of a URL opened without one: the environment's credentials and the default node cache."""
    from datasetrt.format.remote import Storage
    from datasetrt.values.config import DEFAULT_STORAGE_CONFIG  # lazily: pydantic, parent processes only

    return Storage.of(DEFAULT_STORAGE_CONFIG)


def common_payload_spec(handles: Sequence[CacheHandle]) -> PayloadSpec | None:
    """The payload spec every cache of `handles` declares (None: all untyped). CacheFormatError
    naming both paths when two caches disagree (typed and untyped, or different specs). O(caches)."""
    first = handles[0]
    form = first.manifest.payload_spec
    for handle in handles[1:]:
        other = handle.manifest.payload_spec
        if other != form:
            raise CacheFormatError(
                f"all caches must share the same payload spec: {handle.path} ({_spec_text(other)}) differs from "
                f"{first.path} ({_spec_text(form)})"
            )
    if form is None:
        return None
    from datasetrt.values.config import PayloadSpec  # lazily: reader workers never build one (pydantic)

    return PayloadSpec(*form)


def _spec_text(form: tuple | None) -> str:
    from datasetrt.values.payloads import describe

    return "untyped" if form is None else f"payload spec {describe(*form)}"


def _check_sha256(path: Path, expected: str, size: int | None) -> None:
    """IntegrityError unless regular file `path` of `size` bytes (None: its stat size) hashes to
    `expected`; at most that many bytes are read (format/files.py)."""
    if size is None:
        size = _stat(os.fspath(path)).st_size
    if files.sha256_regular(path, size) != expected:
        raise IntegrityError(f"checksum mismatch for {path}")
