"""manifest.json: parse (strict, hostile-input safe), serialise (dataset-rt's pretty layout) and write.

Boundary: JSON text <-> `Manifest`; file reads and writes only of manifest.json itself (and its
`.partial` replacement): `manifest_text` is the one place its on-disk form is made and
`write_manifest` the one place it is written, staged or replaced. Every field read from
the file is type- and range-checked here, before anything is sized or opened from it, and errors
name the manifest path and the field; the JSON layer under that (strict decoding, typed field
access in serde's wording) is format/manifest_json.py.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datasetrt.errors import CacheIOError, ManifestJSONError, MissingManifestError
from datasetrt.format import files
from datasetrt.format.layout import (
    CHECKSUM_ALGO,
    FORMAT_VERSION,
    INDEX_ROW_BYTES,
    MANIFEST_NAME,
    METADATA_KINDS,
    SHARD_NAME_RE,
    SUPPORTED_FORMAT_VERSIONS,
    U63_MAX,
    U64_MAX,
)
from datasetrt.format.manifest_json import Fields, decode_document
from datasetrt.values.codecs import CODEC_BY_NAME, DICT_MAX_BYTES, MANIFEST_LEVEL_MAX, MANIFEST_LEVEL_MIN, names_listed
from datasetrt.values.payloads import PAYLOAD_DTYPES, dtypes_listed, manifest_form, shape_problem

_KNOWN_KEYS = frozenset(
    (
        "format_version",
        "cache_id",
        "source_name",
        "sample_count",
        "metadata_schema",
        "metadata_sha256",
        "index_sha256",
        "shards",
        "datasetrt",
    )
)
EXTENSION_KEY = "datasetrt"
PARTIAL_SUFFIX = ".partial"  # a replacement manifest before its rename (`write_manifest`)
# index.bin holds sample_count rows of 24 bytes and its size must fit an off_t.
MAX_SAMPLE_COUNT = U63_MAX // INDEX_ROW_BYTES
# A manifest larger than this is refused before it is read (~250k shard entries; format/remote.py
# bounds a fetched one the same way).
MANIFEST_MAX_BYTES = 64 << 20


@dataclass(frozen=True)
class ShardEntry:
    """One shard file: `byte_len` is its exact size; `uncompressed_byte_len` sums raw payloads."""

    name: str
    uncompressed_byte_len: int
    byte_len: int
    algo: str
    ratio: float
    sha256: str
    level: int | None = None


@dataclass(frozen=True)
class ChecksumSidecar:
    """datasetrt extension: per-record XXH3-64 file (u64 LE per sample, sample_id order)."""

    file: str
    algo: str
    sha256: str


@dataclass(frozen=True)
class DictionaryFile:
    """datasetrt extension: the zstd_dict codec's trained dictionary, one file per cache
    (format/dictionary.py). `dict_id` is the id in its header, which every record's frame names;
    `byte_len` its exact size (checked at open, <= DICT_MAX_BYTES)."""

    file: str
    dict_id: int
    byte_len: int
    sha256: str


DICTIONARY_KEY = "zstd_dictionary"
_DICTIONARY_FIELDS = ("file", "dict_id", "byte_len", "sha256")
U32_MAX = (1 << 32) - 1


# A typed cache's payload spec as the manifest holds it: (canonical dtype name, shape with None for
# the ragged dim); `config.PayloadSpec` is built from it where pydantic and numpy are wanted.
PayloadSpecForm = tuple[str, tuple]


@dataclass(frozen=True)
class Manifest:
    """A parsed manifest. `cache_id` is None for v2 manifests (identity = position in paths).
    `payload_spec` (datasetrt extension) is None for untyped caches; `dictionary` (datasetrt
    extension) names the trained dictionary of a cache whose shards use zstd_dict, else None."""

    format_version: int
    cache_id: int | None
    source_name: str
    sample_count: int
    metadata_schema: tuple[tuple[str, str], ...]
    metadata_sha256: str
    index_sha256: str
    shards: tuple[ShardEntry, ...]
    checksums: ChecksumSidecar | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    payload_spec: PayloadSpecForm | None = None
    dictionary: DictionaryFile | None = None

    def to_json(self) -> str:
        """Pretty JSON (2-space indent) in dataset-rt's key order, plus the datasetrt extension
        (`manifest_text` of `to_doc()`)."""
        return manifest_text(self.to_doc())

    def to_doc(self) -> dict[str, Any]:
        """The manifest as a JSON document: dataset-rt's keys in its order, the unknown keys
        kept, then the datasetrt extension."""
        doc: dict[str, Any] = {"format_version": self.format_version}
        if self.cache_id is not None:
            doc["cache_id"] = self.cache_id
        doc["source_name"] = self.source_name
        doc["sample_count"] = self.sample_count
        doc["metadata_schema"] = [{"name": n, "kind": k} for n, k in self.metadata_schema]
        doc["metadata_sha256"] = self.metadata_sha256
        doc["index_sha256"] = self.index_sha256
        shards = []
        for s in self.shards:
            compression: dict[str, Any] = {"algo": s.algo, "ratio": s.ratio}
            if s.level is not None:
                compression["level"] = s.level
            shards.append(
                {
                    "name": s.name,
                    "uncompressed_byte_len": s.uncompressed_byte_len,
                    "byte_len": s.byte_len,
                    "compression": compression,
                    "sha256": s.sha256,
                }
            )
        doc["shards"] = shards
        doc.update(self.extra)
        if self.checksums is not None:
            ext = dict(doc.get(EXTENSION_KEY, {}))
            ext["record_checksums"] = {
                "file": self.checksums.file,
                "algo": self.checksums.algo,
                "sha256": self.checksums.sha256,
            }
            doc[EXTENSION_KEY] = ext
        if self.payload_spec is not None:
            doc[EXTENSION_KEY] = {**doc.get(EXTENSION_KEY, {}), "payload_spec": manifest_form(*self.payload_spec)}
        if self.dictionary is not None:
            d = self.dictionary
            entry = {"file": d.file, "dict_id": d.dict_id, "byte_len": d.byte_len, "sha256": d.sha256}
            doc[EXTENSION_KEY] = {**doc.get(EXTENSION_KEY, {}), DICTIONARY_KEY: entry}
        return doc


# -- writing ------------------------------------------------------------------------------------


def manifest_text(doc: Mapping[str, Any]) -> str:
    """The on-disk form of a manifest document, the one place it is made: JSON with a 2-space
    indent (dataset-rt's pretty layout), keys in the document's order, non-ASCII text as UTF-8,
    no NaN or infinity (ValueError), and a final newline."""
    return json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def write_manifest(cache_dir: Path | str, manifest: Manifest | Mapping[str, Any], *, durable: bool = True) -> bool:
    """Write `<cache_dir>/manifest.json` (a `Manifest`, or a document in `manifest_text` form)
    and return whether it is durable on return. The only writer of manifest files.

    durable=True (replacing the manifest of a published cache, format/migrate.py): the text goes
    to `manifest.json.partial`, which is fsynced and renamed over manifest.json (atomic: a
    reader sees the old manifest or the new one, never a mix), then the cache directory is
    fsynced. False when only that directory fsync failed: the new manifest is in place but its
    rename may not survive a crash. Any earlier failure raises (OSError; ValueError for a
    document that is not JSON) with the old manifest in place (a `.partial` may remain).

    durable=False (the last file of a staged cache, format/shards.py): written in place under the
    staging directory, which no reader opens, and not synced; the publisher makes the whole batch
    durable and renames the directory into place (format/publish.py). Returns False.
    """
    data = (manifest.to_json() if isinstance(manifest, Manifest) else manifest_text(manifest)).encode("utf-8")
    path = os.path.join(cache_dir, MANIFEST_NAME)
    if not durable:
        with open(path, "wb") as f:
            f.write(data)
        return False
    from datasetrt.format.durable import fsync_path  # lazily: reader workers parse manifests only

    partial = path + PARTIAL_SUFFIX
    with open(partial, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)
    try:
        fsync_path(Path(cache_dir))
    except OSError:
        return False
    return True


def read_manifest(cache_dir: Path) -> Manifest:
    """Read and strictly parse `<cache_dir>/manifest.json`.

    Raises MissingManifestError when absent (the directory is not a published cache) and
    ManifestJSONError for malformed JSON, unsupported versions, missing or mistyped fields,
    and hostile shard names (anything but NNNNNN.bin).
    """
    return read_manifest_stat(cache_dir)[0]


def read_manifest_stat(cache_dir: Path | str, *, inside: str | None = None) -> tuple[Manifest, os.stat_result]:
    """`read_manifest` plus the fstat of the manifest file that was read (its identity).

    The manifest must be a regular file of at most MANIFEST_MAX_BYTES (format/files.py: opened
    without blocking, read within its fstat size); with `inside` (the resolved cache directory),
    a manifest that is a symbolic link must resolve inside it. CacheFormatError otherwise."""
    path = os.path.join(cache_dir, MANIFEST_NAME)  # str paths: cheaper than pathlib joins on this per-open path
    try:
        if inside is not None:
            files.check_file(path, inside)
        raw, st = files.read_regular(path, max_bytes=MANIFEST_MAX_BYTES, what="manifest")
    except CacheIOError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise MissingManifestError(f"missing manifest: {path}") from None
        if exc.errno == errno.EISDIR:
            raise ManifestJSONError(f"JSON error: manifest is a directory: {path}") from None
        raise
    return parse_manifest(raw, path), st


def parse_manifest(raw: bytes, path: Path | str) -> Manifest:
    """Parse manifest bytes; `path` is only used in messages."""
    doc = decode_document(raw, path)
    top = Fields(path, doc)
    version = top.uint("format_version")
    if version not in SUPPORTED_FORMAT_VERSIONS:
        raise ManifestJSONError(f"JSON error: unsupported format version {version}: {path}")
    cache_id = top.uint("cache_id", maximum=U64_MAX) if version >= 3 else None
    source_name = top.string("source_name")
    sample_count = top.uint("sample_count", maximum=MAX_SAMPLE_COUNT)
    schema = []
    seen: set[str] = set()
    for i, item in enumerate(top.array("metadata_schema")):
        f = Fields(path, item, f" in metadata_schema[{i}]")
        name, kind = f.string("name"), f.string("kind")
        if kind not in METADATA_KINDS:
            raise ManifestJSONError(
                f"JSON error: unknown variant `{kind}`, expected one of `bool`, `int`, `float`, `string`"
                f" in metadata_schema[{i}]: {path}"
            )
        if name in seen:
            raise ManifestJSONError(f"JSON error: duplicate metadata column `{name}` in metadata_schema: {path}")
        seen.add(name)
        schema.append((name, kind))
    shards = []
    for i, item in enumerate(top.array("shards")):
        f = Fields(path, item, f" in shards[{i}]")
        name = f.string("name")
        if not SHARD_NAME_RE.fullmatch(name):
            raise ManifestJSONError(
                f"JSON error: invalid shard name {name!r} in shards[{i}] (expected NNNNNN.bin): {path}"
            )
        if "compression" not in item:
            # Required, as in dataset-rt 0.4.8 (v2 and v3: "missing field `compression`"). A
            # default of "none" read a compressed shard whose key was damaged as raw payloads.
            raise f.missing("compression")
        comp = Fields(path, item["compression"], f" in shards[{i}].compression")
        algo = comp.string("algo")
        if algo not in CODEC_BY_NAME:
            raise ManifestJSONError(
                f"JSON error: unknown variant `{algo}`, expected one of {names_listed()}"
                f" in shards[{i}].compression: {path}"
            )
        level = comp.doc.get("level")
        if level is not None and (type(level) is not int or not MANIFEST_LEVEL_MIN <= level <= MANIFEST_LEVEL_MAX):
            raise comp.bad("level", level, "a zstd level")
        shards.append(
            ShardEntry(
                name=name,
                uncompressed_byte_len=f.uint("uncompressed_byte_len"),
                byte_len=f.uint("byte_len"),
                algo=algo,
                ratio=comp.number("ratio"),  # required, as dataset-rt's serde requires it
                sha256=f.sha256("sha256"),
                level=level,
            )
        )
    checksums = None
    ext = doc.get(EXTENSION_KEY)
    if isinstance(ext, dict) and "record_checksums" in ext:
        f = Fields(path, ext["record_checksums"], f" in {EXTENSION_KEY}.record_checksums")
        file_name, algo = f.string("file"), f.string("algo")
        if algo != CHECKSUM_ALGO or not _plain_name(file_name):
            raise f.bad("file", file_name, f"a plain file name with algo {CHECKSUM_ALGO}")
        checksums = ChecksumSidecar(file=file_name, algo=algo, sha256=f.sha256("sha256"))
    payload_spec = None
    if isinstance(ext, dict) and "payload_spec" in ext:
        payload_spec = _payload_spec(path, ext["payload_spec"])
    dictionary = _dictionary(path, ext[DICTIONARY_KEY]) if isinstance(ext, dict) and DICTIONARY_KEY in ext else None
    _check_cache_state(path, shards, dictionary)
    # (the usual manifest has no unknown key: one C-level subset test skips the comprehension)
    extra = {} if _KNOWN_KEYS.issuperset(doc) else {k: v for k, v in doc.items() if k not in _KNOWN_KEYS}
    return Manifest(
        format_version=version,
        cache_id=cache_id,
        source_name=source_name,
        sample_count=sample_count,
        metadata_schema=tuple(schema),
        metadata_sha256=top.sha256("metadata_sha256"),
        index_sha256=top.sha256("index_sha256"),
        shards=tuple(shards),
        checksums=checksums,
        extra=extra,
        payload_spec=payload_spec,
        dictionary=dictionary,
    )


def _plain_name(name: str) -> bool:
    """A file name directly inside the cache directory (no separator, no `.`/`..`, no NUL)."""
    return "/" not in name and name not in ("", ".", "..") and "\0" not in name


def _dictionary(path: Path | str, value: Any) -> DictionaryFile:
    """Strict parse of `datasetrt.zstd_dictionary`: exactly {file, dict_id, byte_len, sha256}, a
    plain file name, a non-zero u32 id, 1..DICT_MAX_BYTES bytes. ManifestJSONError naming the
    manifest and the key otherwise."""
    f = Fields(path, value, f" in {EXTENSION_KEY}.{DICTIONARY_KEY}")
    for key in f.doc:
        if key not in _DICTIONARY_FIELDS:
            raise ManifestJSONError(
                f"JSON error: unknown field `{key}`, expected one of `{'`, `'.join(_DICTIONARY_FIELDS)}`{f.where}: {path}"
            )
    file_name = f.string("file")
    if not _plain_name(file_name):
        raise f.bad("file", file_name, "a plain file name")
    dict_id = f.uint("dict_id", maximum=U32_MAX)
    if dict_id == 0:
        raise f.bad("dict_id", dict_id, "a dictionary id in [1, 4294967295]")
    byte_len = f.uint("byte_len", maximum=DICT_MAX_BYTES)
    if byte_len == 0:
        raise f.bad("byte_len", byte_len, f"a dictionary size in [1, {DICT_MAX_BYTES}]")
    return DictionaryFile(file=file_name, dict_id=dict_id, byte_len=byte_len, sha256=f.sha256("sha256"))


def _check_cache_state(path: Path | str, shards: list[ShardEntry], dictionary: DictionaryFile | None) -> None:
    """Shards of a codec with per-cache state (zstd_dict) need the dictionary entry; a dictionary
    with no shard using it is malformed state (a manifest edited or assembled from two caches)."""
    users = [i for i, s in enumerate(shards) if CODEC_BY_NAME[s.algo].cache_state]
    if users and dictionary is None:
        raise ManifestJSONError(
            f"JSON error: shards[{users[0]}] use {shards[users[0]].algo} but `{EXTENSION_KEY}.{DICTIONARY_KEY}` "
            f"is missing: {path}"
        )
    if dictionary is not None and not users:
        raise ManifestJSONError(
            f"JSON error: `{EXTENSION_KEY}.{DICTIONARY_KEY}` names a dictionary but no shard uses zstd_dict: {path}"
        )


def _payload_spec(path: Path | str, value: Any) -> PayloadSpecForm:
    """Strict parse of `datasetrt.payload_spec`: exactly {"dtype", "shape"}, a canonical dtype
    name and a valid shape (payloads.shape_problem), without numpy or pydantic (reader workers
    parse manifests). ManifestJSONError naming the manifest and the key otherwise."""
    f = Fields(path, value, f" in {EXTENSION_KEY}.payload_spec")
    for key in f.doc:
        if key not in ("dtype", "shape"):
            raise ManifestJSONError(f"JSON error: unknown field `{key}`, expected `dtype` or `shape`{f.where}: {path}")
    dtype = f.string("dtype")
    if dtype not in PAYLOAD_DTYPES:
        raise f.bad("dtype", dtype, f"one of {dtypes_listed()}")
    shape = tuple(f.array("shape"))
    problem = shape_problem(dtype, shape)
    if problem is not None:
        raise f.bad("shape", list(shape), f"a payload shape ({problem})")
    return dtype, shape


def new_manifest(**kwargs: Any) -> Manifest:
    """A v3 manifest for a cache this process wrote."""
    return Manifest(format_version=FORMAT_VERSION, **kwargs)
