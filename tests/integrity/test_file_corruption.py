"""Reference §6, file rows: sha256 fields, sample_count, shards, index.bin and metadata.arrow.

One table, one row per corruption: what it does to the cache, and the expected outcome for
validate_cache=False and True (stage, datasetrt class, dataset-rt builtin, message fragments
including the offending path). "accepted" means open, get_metadata and iteration all succeed.

Where datasetrt deliberately differs from dataset-rt the row says why in `note`; the
differences are about *which* check fires first, never about letting damage through.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

import datasetrt as drt
from datasetrt.errors import ArrowFormatError, CacheFormatError, CacheIOError, IntegrityError
from tests.integrity.conftest import N_SAMPLES
from tests.integrity.corrupt import (
    assert_fault,
    edit_manifest,
    flip_byte,
    payload_offset,
    probe,
    read_index,
    rehash,
    set_index_row,
    shard_file,
    write_index,
)

ACCEPTED = "accepted"


@dataclass(frozen=True)
class Expect:
    stage: str
    cls: type
    builtin: type
    fragments: Callable[[Path], list]  # cache dir -> message fragments


def _sha_mismatch(rel: str) -> Expect:
    return Expect("open", IntegrityError, ValueError, lambda c: [f"checksum mismatch for {c / rel}"])


SHA_SHARD = Expect("open", IntegrityError, ValueError, lambda c: [f"checksum mismatch for {shard_file(c)}"])
SHA_INDEX = _sha_mismatch("index.bin")
SHA_META = _sha_mismatch("metadata.arrow")
# Beyond dataset-rt (which serves an edited metadata.arrow unless validate_cache=True): the table
# drives filters and weights, so its sha256 is checked when it is first decoded, by default.
META_HASH_ON_USE = Expect(
    "metadata", IntegrityError, ValueError, lambda c: [f"checksum mismatch for {c / 'metadata.arrow'}"]
)


# -- mutations ------------------------------------------------------------------------------------


def _set(key, value):
    return lambda c: edit_manifest(c, lambda d: d.__setitem__(key, value))


def _set_shard(key, value):
    return lambda c: edit_manifest(c, lambda d: d["shards"][0].__setitem__(key, value))


def _set_sidecar_sha(c):
    edit_manifest(c, lambda d: d["datasetrt"]["record_checksums"].__setitem__("sha256", "0" * 64))


def _truncate(path_of, nbytes):
    def mutate(c):
        path = path_of(c)
        path.write_bytes(path.read_bytes()[:-nbytes])

    return mutate


def _extend(path_of, extra=b"\0" * 7):
    def mutate(c):
        with open(path_of(c), "ab") as f:
            f.write(extra)

    return mutate


def _unlink(path_of):
    return lambda c: path_of(c).unlink()


def _absent_shard(c):
    def edit(d):
        extra = dict(d["shards"][0], name="000001.bin")
        d["shards"].append(extra)

    edit_manifest(c, edit)


def _drop_index_row(c):
    write_index(c, read_index(c)[:-1])


def _index(**fields):
    return lambda c: set_index_row(c, 2, **fields)


def _offset_past_eof(c):
    set_index_row(c, 2, offset=shard_file(c).stat().st_size + 10)


def _flip_payload(c):
    flip_byte(shard_file(c), payload_offset(c, 1))


INDEX = lambda c: c / "index.bin"  # noqa: E731
META = lambda c: c / "metadata.arrow"  # noqa: E731


def _rewrite_meta(transform):
    def mutate(c):
        table = ipc.open_file(pa.memory_map(str(META(c)))).read_all()
        table, stream = transform(table)
        sink = pa.BufferOutputStream()
        writer = (ipc.new_stream if stream else ipc.new_file)(sink, table.schema)
        writer.write_table(table)
        writer.close()
        META(c).write_bytes(sink.getvalue().to_pybytes())

    return mutate


def _meta_bytes(transform):
    return lambda c: META(c).write_bytes(transform(META(c).read_bytes()))


def _value_changed(t):
    labels = t.column("label").to_pylist()
    labels[0] = "changed"
    return t.set_column(t.schema.get_field_index("label"), "label", pa.array(labels)), False


def _int32_column(t):
    return t.set_column(0, "index", t.column("index").cast(pa.int32())), False


# -- the table -----------------------------------------------------------------------------------

ROWS = [
    # id, mutate, validate_cache=False, validate_cache=True, note
    ("metadata-sha", _set("metadata_sha256", "0" * 64), META_HASH_ON_USE, SHA_META, ""),
    ("index-sha", _set("index_sha256", "0" * 64), ACCEPTED, SHA_INDEX, ""),
    ("shard-sha", _set_shard("sha256", "0" * 64), ACCEPTED, SHA_SHARD, ""),
    (
        "sidecar-sha",
        _set_sidecar_sha,
        ACCEPTED,
        Expect("open", IntegrityError, ValueError, lambda c: [f"checksum mismatch for {c / 'checksums.xxh3'}"]),
        "datasetrt extension: the sidecar file is hashed like every other file",
    ),
    (
        "sample-count-999",
        _set("sample_count", 999),
        Expect("open", CacheFormatError, ValueError, lambda c: ["index row count does not match manifest", INDEX(c)]),
        Expect("open", CacheFormatError, ValueError, lambda c: ["row count does not match manifest", INDEX(c)]),
        "validate: dataset-rt says 'metadata row count'; datasetrt's shape check of index.bin runs first",
    ),
    (
        "sample-count-2",
        _set("sample_count", 2),
        Expect("open", CacheFormatError, ValueError, lambda c: ["index row count does not match manifest", INDEX(c)]),
        Expect("open", CacheFormatError, ValueError, lambda c: ["row count does not match manifest", INDEX(c)]),
        "as above",
    ),
    (
        "shard-truncated",
        _truncate(shard_file, 3),
        Expect("open", CacheFormatError, ValueError, lambda c: [f"shard length mismatch for {shard_file(c)}"]),
        "same",
        "",
    ),
    (
        "shard-extended",
        _extend(shard_file),
        Expect("open", CacheFormatError, ValueError, lambda c: [f"shard length mismatch for {shard_file(c)}"]),
        "same",
        "",
    ),
    (
        "shard-byte-len",
        _set_shard("byte_len", 1),
        Expect("open", CacheFormatError, ValueError, lambda c: [f"shard length mismatch for {shard_file(c)}"]),
        "same",
        "",
    ),
    (
        "shard-missing",
        _unlink(shard_file),
        Expect(
            "open",
            CacheIOError,
            RuntimeError,
            lambda c: ["I/O error: No such file or directory (os error 2)", shard_file(c)],
        ),
        "same",
        "",
    ),
    (
        "absent-shard-listed",
        _absent_shard,
        Expect(
            "open",
            CacheIOError,
            RuntimeError,
            lambda c: ["I/O error: No such file or directory (os error 2)", c / "shards" / "000001.bin"],
        ),
        "same",
        "",
    ),
    (
        "payload-flipped",
        _flip_payload,
        Expect("iter", IntegrityError, ValueError, lambda c: ["record checksum mismatch for", f"{c} sample 1"]),
        SHA_SHARD,
        "improvement: dataset-rt returns the corrupted bytes without validate_cache",
    ),
    (
        "index-missing",
        _unlink(INDEX),
        Expect("open", CacheIOError, RuntimeError, lambda c: ["I/O error: No such file", INDEX(c)]),
        "same",
        "",
    ),
    (
        "index-not-multiple-of-24",
        _extend(INDEX, b"\1" * 5),
        Expect("open", CacheFormatError, ValueError, lambda c: ["index length is not divisible by row size", INDEX(c)]),
        "same",
        "validate: dataset-rt hashes first (checksum mismatch); datasetrt's shape check runs first",
    ),
    (
        "index-missing-row",
        _drop_index_row,
        Expect("open", CacheFormatError, ValueError, lambda c: ["index row count does not match manifest", INDEX(c)]),
        "same",
        "as above",
    ),
    (
        "index-shard-id-5",
        _index(shard_id=5),
        Expect("iter", CacheFormatError, ValueError, lambda c: ["index references missing shard 5", f"{c} sample 2"]),
        SHA_INDEX,
        "default open maps no index bytes, so the kernel's per-record check fires (dataset-rt: at load)",
    ),
    (
        "index-offset-past-eof",
        _offset_past_eof,
        Expect(
            "iter", CacheIOError, RuntimeError, lambda c: ["I/O error: failed to fill whole buffer", f"{c} sample 2"]
        ),
        SHA_INDEX,
        "",
    ),
    (
        "index-len-minus-1",
        _index(byte_len=2**64 - 1),
        Expect(
            "iter", CacheIOError, RuntimeError, lambda c: ["I/O error: failed to fill whole buffer", f"{c} sample 2"]
        ),
        SHA_INDEX,
        "improvement: dataset-rt returns a silently truncated payload",
    ),
    (
        "metadata-missing",
        _unlink(META),
        Expect("open", CacheIOError, RuntimeError, lambda c: ["I/O error: No such file", META(c)]),
        "same",
        "",
    ),
    (
        "metadata-garbage",
        _meta_bytes(lambda b: b"x" * len(b)),
        Expect("metadata", CacheFormatError, ValueError, lambda c: ["invalid metadata Arrow footer", META(c)]),
        SHA_META,
        "",
    ),
    (
        "metadata-garbage-with-magic",
        _meta_bytes(lambda b: b"ARROW1" + b"x" * 100 + b"ARROW1"),
        Expect("metadata", CacheFormatError, ValueError, lambda c: ["invalid metadata Arrow footer", META(c)]),
        SHA_META,
        "observed on dataset-rt 0.4.8",
    ),
    (
        "metadata-stream-format",
        _rewrite_meta(lambda t: (t, True)),
        Expect("metadata", CacheFormatError, ValueError, lambda c: ["invalid metadata Arrow footer", META(c)]),
        SHA_META,
        "",
    ),
    (
        "metadata-truncated",
        _truncate(META, 20),
        Expect(
            "metadata",
            ArrowFormatError,
            RuntimeError,
            lambda c: ["Arrow error: Parser error: Arrow file does not contain correct footer", META(c)],
        ),
        SHA_META,
        "",
    ),
    (
        "metadata-2-rows",
        _rewrite_meta(lambda t: (t.slice(0, 2), False)),
        Expect(
            "metadata",
            CacheFormatError,
            ValueError,
            lambda c: [f"metadata row count for cache {c} expected {N_SAMPLES}, got 2", META(c)],
        ),
        SHA_META,
        "names the cache directory where dataset-rt gives its position",
    ),
    ("metadata-value-changed", _rewrite_meta(_value_changed), META_HASH_ON_USE, SHA_META, ""),
    (
        "metadata-int32-column",
        _rewrite_meta(_int32_column),
        Expect(
            "metadata",
            CacheFormatError,
            ValueError,
            lambda c: ["metadata column 'index' does not match manifest schema", META(c)],
        ),
        SHA_META,
        "",
    ),
]


@pytest.mark.parametrize("mutate, default, validated, note", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_file_corruption(request, runtime, cache, validate, mutate, default, validated, note):
    clean = probe(runtime, cache, validate=validate)
    assert clean.stage is None, repr(clean.error)
    mutate(cache)
    expect = validated if validate else default
    if expect == "same":
        expect = default
    out = probe(runtime, cache, validate=validate)
    if expect == ACCEPTED:  # accepted means unchanged: the same samples and the same table
        assert out.stage is None, repr(out.error)
        assert len(out.samples) == N_SAMPLES
        assert out.samples == clean.samples
        assert out.table.equals(clean.table)
        return
    assert_fault(out, expect.stage, expect.cls, expect.builtin, *expect.fragments(cache))


# -- the same damage with every sha256 recomputed: the structural checks behind validate_cache ----

REHASHED = [
    ("index-shard-id-5", _index(shard_id=5), ["index references missing shard 5", INDEX]),
    ("index-offset-past-eof", _offset_past_eof, ["invalid binary record", INDEX]),
    ("index-len-minus-1", _index(byte_len=2**64 - 1), ["invalid binary record", INDEX]),
    ("metadata-2-rows", _rewrite_meta(lambda t: (t.slice(0, 2), False)), ["metadata row count", META]),
    ("metadata-int32-column", _rewrite_meta(_int32_column), ["metadata 'index' is not int", META]),
    ("metadata-truncated", _truncate(META, 20), ["Arrow error", META]),
]


@pytest.mark.parametrize("mutate, fragments", [r[1:] for r in REHASHED], ids=[r[0] for r in REHASHED])
def test_validate_cache_structural_checks_behind_sha256(runtime, cache, mutate, fragments):
    """validate_cache=True does more than hash: with every sha256 field made to match the damage,
    the deep checks still refuse the cache at open."""
    mutate(cache)
    rehash(cache)
    out = probe(runtime, cache, validate=True)
    cls = ArrowFormatError if "Arrow error" in fragments else CacheFormatError
    builtin = RuntimeError if cls is ArrowFormatError else ValueError
    assert_fault(out, "open", cls, builtin, *[f(cache) if callable(f) else f for f in fragments])


def test_metadata_value_changed_is_refused(runtime, cache):
    """Beyond dataset-rt (which serves the edited value with validate_cache=False): a well-formed
    but altered metadata.arrow fails its sha256 check when the table is first decoded."""
    _rewrite_meta(_value_changed)(cache)
    ds = runtime.cached_dataset([cache], reader_config=drt.ReaderConfig(seed=0))
    with pytest.raises(IntegrityError, match="checksum mismatch for"):
        ds.get_metadata()
