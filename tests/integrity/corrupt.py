"""Helpers that damage a cache on disk in one precise way, and probe where datasetrt notices.

Everything here works on a cache directory written by datasetrt (format v3, one or more shards,
optional per-record XXH3 sidecar named in the manifest's "datasetrt" extension). Helpers that
change bytes take `rehash` / `residecar` switches, so a test can choose which check is left to
catch the damage: the manifest sha256 fields (validate_cache=True), the per-record sidecar
(default reads), or the structural checks behind both.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

import datasetrt as drt
from datasetrt.errors import ArrowFormatError, CacheFormatError

INDEX_ROW = struct.Struct("<QQQ")
U64 = struct.Struct("<Q")


# -- manifest -----------------------------------------------------------------------------------


def manifest_path(cache: Path) -> Path:
    return Path(cache) / "manifest.json"


def load_manifest(cache: Path) -> dict[str, Any]:
    return json.loads(manifest_path(cache).read_text())


def save_manifest(cache: Path, doc: Any) -> None:
    manifest_path(cache).write_text(json.dumps(doc, indent=2))


def edit_manifest(cache: Path, edit: Callable[[dict], Any]) -> None:
    """Apply `edit(doc)` (mutating in place) and write the manifest back."""
    doc = load_manifest(cache)
    edit(doc)
    save_manifest(cache, doc)


def write_manifest_text(cache: Path, text: str | bytes) -> None:
    data = text.encode() if isinstance(text, str) else text
    manifest_path(cache).write_bytes(data)


def sha256_of(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def sidecar_path(cache: Path) -> Path | None:
    ext = load_manifest(cache).get("datasetrt", {}).get("record_checksums")
    return Path(cache) / ext["file"] if ext else None


def rehash(cache: Path) -> None:
    """Recompute every sha256 the manifest records (metadata, index, shards, sidecar) and the
    shard byte_len fields, so validate_cache=True sees a self-consistent cache."""
    cache = Path(cache)
    doc = load_manifest(cache)
    doc["metadata_sha256"] = sha256_of(cache / "metadata.arrow")
    doc["index_sha256"] = sha256_of(cache / "index.bin")
    for shard in doc["shards"]:
        path = cache / "shards" / shard["name"]
        shard["sha256"] = sha256_of(path)
        shard["byte_len"] = path.stat().st_size
    ext = doc.get("datasetrt", {}).get("record_checksums")
    if ext:
        ext["sha256"] = sha256_of(cache / ext["file"])
    save_manifest(cache, doc)


def drop_sidecar(cache: Path) -> None:
    """Make the cache look written by dataset-rt: no "datasetrt" manifest key, no sidecar file."""
    side = sidecar_path(cache)
    edit_manifest(cache, lambda doc: doc.pop("datasetrt"))
    side.unlink()


# -- index and records --------------------------------------------------------------------------


def read_index(cache: Path) -> list[tuple[int, int, int]]:
    """index.bin rows as (shard_id, offset, byte_len)."""
    return list(INDEX_ROW.iter_unpack((Path(cache) / "index.bin").read_bytes()))


def write_index(cache: Path, rows: list[tuple[int, int, int]]) -> None:
    (Path(cache) / "index.bin").write_bytes(b"".join(INDEX_ROW.pack(*row) for row in rows))


def set_index_row(cache: Path, sample_id: int, *, shard_id=None, offset=None, byte_len=None) -> None:
    rows = read_index(cache)
    s, o, n = rows[sample_id]
    rows[sample_id] = (
        s if shard_id is None else shard_id,
        o if offset is None else offset,
        n if byte_len is None else byte_len,
    )
    write_index(cache, rows)


def shard_file(cache: Path, shard_id: int = 0) -> Path:
    return Path(cache) / "shards" / load_manifest(cache)["shards"][shard_id]["name"]


def read_record(cache: Path, sample_id: int) -> bytes:
    shard_id, offset, byte_len = read_index(cache)[sample_id]
    with open(shard_file(cache, shard_id), "rb") as f:
        f.seek(offset)
        return f.read(byte_len)


def split_record(record: bytes) -> tuple[bytes, bytes]:
    """(embedded JSON bytes, stored payload bytes) of one record."""
    (json_len,) = U64.unpack_from(record)
    return record[8 : 8 + json_len], record[8 + json_len :]


def make_record(json_bytes: bytes, stored_payload: bytes, json_len: int | None = None) -> bytes:
    """u64 LE json_len | JSON | stored payload; `json_len` overrides the header (to lie)."""
    return U64.pack(len(json_bytes) if json_len is None else json_len) + json_bytes + stored_payload


def payload_offset(cache: Path, sample_id: int) -> int:
    """Absolute offset in its shard of the first stored payload byte of `sample_id`."""
    _, offset, _ = read_index(cache)[sample_id]
    json_bytes, _ = split_record(read_record(cache, sample_id))
    return offset + 8 + len(json_bytes)


def flip_byte(path: Path, offset: int, mask: int = 0xFF) -> None:
    data = bytearray(Path(path).read_bytes())
    data[offset] ^= mask
    Path(path).write_bytes(bytes(data))


def regen_sidecar(cache: Path) -> None:
    """Rewrite the XXH3-64 sidecar from the records as they now are (u64 LE per sample_id), so
    it no longer catches a change and a structural check has to."""
    side = sidecar_path(cache)
    n = len(read_index(cache))
    side.write_bytes(b"".join(U64.pack(xxhash.xxh3_64_intdigest(read_record(cache, i))) for i in range(n)))


def replace_records(cache: Path, new: dict[int, bytes], *, residecar: bool = True, rehash_all: bool = True) -> None:
    """Replace whole records (by sample_id) and re-lay the shards: later records shift, index
    offsets/lengths follow, manifest byte_len and uncompressed_byte_len stay valid for the
    structure. Then optionally regenerate the sidecar and every manifest sha256."""
    cache = Path(cache)
    rows = read_index(cache)
    records = [new.get(i) if i in new else read_record(cache, i) for i in range(len(rows))]
    doc = load_manifest(cache)
    blobs: dict[int, bytearray] = {k: bytearray() for k in range(len(doc["shards"]))}
    new_rows = []
    for (shard_id, _, _), record in zip(rows, records):
        blob = blobs[shard_id]
        new_rows.append((shard_id, len(blob), len(record)))
        blob += record
    for k, blob in blobs.items():
        (cache / "shards" / doc["shards"][k]["name"]).write_bytes(bytes(blob))
    write_index(cache, new_rows)
    if residecar and sidecar_path(cache) is not None:
        regen_sidecar(cache)
    if rehash_all:
        rehash(cache)
    else:  # keep the open-time shape checks passing; only the sha fields are stale
        edit_manifest(
            cache,
            lambda d: [s.__setitem__("byte_len", (cache / "shards" / s["name"]).stat().st_size) for s in d["shards"]],
        )


# -- probing ------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """Where the first error surfaced ('open' | 'metadata' | 'iter' | None) and what it was."""

    stage: str | None
    error: BaseException | None = None
    samples: list | None = None
    table: object = None  # what get_metadata() returned


def probe(runtime, paths, *, validate: bool, verify_records: bool = True) -> Outcome:
    """Open (validate_cache=`validate`), then get_metadata(), then iterate every row in order.

    shuffle=False and epoch_len = population, so iteration reads each record exactly once.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    config = drt.ReaderConfig(seed=0, shuffle=False, validate_cache=validate, verify_records=verify_records)
    try:
        ds = runtime.cached_dataset(list(paths), reader_config=config)
    except Exception as exc:
        return Outcome("open", exc)
    try:
        table = ds.get_metadata()
    except Exception as exc:
        return Outcome("metadata", exc)
    try:
        samples = list(ds)
    except Exception as exc:
        return Outcome("iter", exc)
    finally:
        ds.close()
    return Outcome(None, samples=samples, table=table)


def assert_fault(outcome: Outcome, stage: str, cls: type, builtin: type, *fragments: str) -> BaseException:
    """The outcome failed at `stage` with a `cls` that is also a `builtin`, and the message holds
    every fragment (str() of paths allowed)."""
    assert outcome.stage == stage, f"expected failure at {stage}, got {outcome.stage}: {outcome.error!r}"
    err = outcome.error
    assert isinstance(err, cls), f"{type(err).__name__}: {err}"
    assert isinstance(err, builtin), f"{type(err).__mro__} is not a {builtin.__name__}"
    assert isinstance(err, drt.errors.DatasetRTError)
    for fragment in fragments:
        assert str(fragment) in str(err), f"{fragment!r} not in {str(err)!r}"
    return err


# -- metadata.arrow framing -----------------------------------------------------------------------


def _framed(footer_len: int, body: bytes = b"\0" * 6) -> bytes:
    return b"ARROW1" + body + footer_len.to_bytes(4, "little", signed=True) + b"ARROW1"


# (id, whole metadata.arrow bytes, datasetrt class, message fragment), each as dataset-rt 0.4.8
# answers it (tests/interop/test_messages.py checks the class against the real package): its
# ValueError is CacheFormatError, its RuntimeError ("Arrow error: ...") ArrowFormatError.
METADATA_FRAMINGS = [
    ("empty", b"", CacheFormatError, "invalid metadata Arrow footer"),
    ("7-bytes", b"ARROW1\0", CacheFormatError, "invalid metadata Arrow footer"),
    ("8-bytes", b"ARROW1\0\0", CacheFormatError, "invalid metadata Arrow footer"),  # magic, too short for a trailer
    ("9-bytes", b"ARROW1\0\0\0", CacheFormatError, "invalid metadata Arrow footer"),
    (
        "no-trailing-magic",
        b"ARROW1\0\0\0\0",
        ArrowFormatError,
        "does not contain correct footer",
    ),  # a trailer's 10 bytes
    ("no-leading-magic", b"XRROW1" + b"\0" * 20 + b"ARROW1", CacheFormatError, "invalid metadata Arrow footer: /"),
    ("footer-too-long", _framed(1000), CacheFormatError, "footer length 1000"),
    ("footer-zero", _framed(0), CacheFormatError, "footer length 0"),
    # 18 bytes is the smallest file with both magics, padding and a footer length: framed, 1 is implausible
    ("18-bytes", _framed(1, b"\0" * 2), CacheFormatError, "footer length 1"),
    ("17-bytes", _framed(1, b"\0"), CacheFormatError, "footer length 1"),  # the length overlaps the padding
    ("12-bytes", b"ARROW1ARROW1", CacheFormatError, "footer length 827805522"),  # the length is b"OW1A"
    ("footer-minus-1", _framed(-1), ArrowFormatError, "Parser error: Invalid footer length: -1:"),
    ("footer-i32-min", _framed(-(2**31)), ArrowFormatError, "Parser error: Invalid footer length: -2147483648:"),
]
