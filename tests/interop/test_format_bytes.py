"""Byte identity of the on-disk format: the same source written by dataset-rt 0.4.8 and by datasetrt.

With `algo="none"` the shard files and index.bin must be byte-identical (the embedded record JSON
follows serde_json: compact, sorted keys, raw UTF-8 with `"`/`\\`/control escapes, ryu floats with
decimal form for 1e-5 <= |x| < 1e16), the cache_id equal, and the manifests equal field by field.

Two fields may legitimately differ, and the tests pin exactly those:
* "datasetrt": datasetrt's extension key (per-record checksum sidecar `checksums.xxh3`, an extra
  file dataset-rt ignores);
* "metadata_sha256": metadata.arrow is written by arrow-rs in dataset-rt and by pyarrow in datasetrt.
  The IPC flatbuffers differ in layout (arrow-rs pads the leading magic to 64 bytes and orders
  the tables differently), so the *bytes* differ while schema and values are identical. Each
  manifest's hash matches its own file, and both libraries read either file.
With lz4, the LZ4 block encoders differ (lz4_flex vs the native codec), so only the envelopes,
the u32 size prefixes and the decoded payloads are compared record by record.
"""

from __future__ import annotations

import hashlib
import math
import struct
from pathlib import Path

import lz4.block
import numpy as np
import pyarrow.ipc as ipc
import pytest

from tests.interop._interop import LIBS, read_manifest, tricky_items, write

pytestmark = pytest.mark.interop

SIDECAR = "checksums.xxh3"


def _fuzz_floats(n: int) -> list[float]:
    """Finite doubles over every exponent, plus values near the decimal/exponent switch points."""
    rng = np.random.default_rng(2024)
    bits = rng.integers(0, 2**64, size=n, dtype=np.uint64)
    values = [v for v in bits.view(np.float64).tolist() if math.isfinite(v)]
    for exp in range(-8, 19):
        for mant in (1.0, 9.9, 2.5, 1.2345678901234567, 9.999999999999998):
            values += [mant * 10.0**exp, -mant * 10.0**exp]
    values += [
        math.nextafter(1e-5, 0),
        math.nextafter(1e-5, 1),
        math.nextafter(1e16, 0),
        1e16,
        5e-324,
        -5e-324,
        2.2250738585072014e-308,
        1.7976931348623157e308,
        0.1 + 0.2,
        1 / 3,
        2.0**53,
        2.0**63,
        2.0**64,
    ]
    return values


def _fuzz_strings(n: int) -> list[str]:
    """Strings over control chars, DEL/C1, Latin-1, BMP (no surrogates), astral planes."""
    rng = np.random.default_rng(7)
    pools = [
        range(0x30),
        range(0x7F, 0x100),
        range(0x2000, 0x2100),
        range(0xE000, 0xE100),
        range(0xFFF0, 0x10000),
        range(0x1F600, 0x1F650),
        range(0x10FFF0, 0x110000),
    ]
    out = []
    for i in range(n):
        pool = pools[i % len(pools)]
        out.append("".join(chr(pool[int(k)]) for k in rng.integers(0, len(pool), size=i % 9)) + '"\\')
    return out


def _fuzz_items(n: int) -> list[tuple[bytes, dict]]:
    floats, strings = _fuzz_floats(n), _fuzz_strings(n)
    ints = np.random.default_rng(3).integers(-(2**63), 2**63 - 1, size=len(floats), endpoint=True).tolist()
    return [
        (b"", {"f": f, "s": strings[i % len(strings)], "i": ints[i], "b": bool(i % 2), 'a\u00e9"k': -i})
        for i, f in enumerate(floats)
    ]


SPECS = {
    "tricky": {"tricky": tricky_items(45, "tricky"), 'ünï-😀 "q"': tricky_items(8, "other")},
    "fuzz": {"fuzz": _fuzz_items(400)},
}


def _write_both(runtimes, tmp_path: Path, spec: dict, algo: str, **kw) -> dict[str, list[Path]]:
    return {label: write(runtimes[label], lib, spec, tmp_path / label, algo, **kw) for label, lib in LIBS.items()}


def _records(cache: Path) -> list[bytes]:
    index = np.frombuffer((cache / "index.bin").read_bytes(), dtype="<u8").reshape(-1, 3)
    manifest = read_manifest(cache)
    shards = [(cache / "shards" / s["name"]).read_bytes() for s in manifest["shards"]]
    return [shards[int(s)][int(o) : int(o) + int(n)] for s, o, n in index]


def _split(record: bytes) -> tuple[bytes, bytes]:
    (json_len,) = struct.unpack_from("<Q", record)
    return record[8 : 8 + json_len], record[8 + json_len :]


def _first_difference(a: Path, b: Path) -> str:
    """Diagnostic: the first record whose embedded JSON or payload differs."""
    for sid, (ra, rb) in enumerate(zip(_records(a), _records(b))):
        if ra != rb:
            (ja, pa), (jb, pb) = _split(ra), _split(rb)
            return f"sample {sid}: dataset-rt JSON {ja!r} vs datasetrt JSON {jb!r}; payloads equal: {pa == pb}"
    return "records equal; difference is in shard boundaries"


@pytest.mark.parametrize("spec_name", list(SPECS))
def test_uncompressed_shards_and_index_byte_identical(runtimes, tmp_path, spec_name):
    written = _write_both(runtimes, tmp_path, SPECS[spec_name], "none", max_shard_bytes=2500)
    for a, b in zip(written["rt"], written["drt"]):
        files_a = {p.relative_to(a) for p in a.rglob("*") if p.is_file()}
        files_b = {p.relative_to(b) for p in b.rglob("*") if p.is_file()}
        assert files_b - files_a == {Path(SIDECAR)}
        assert files_a <= files_b
        assert len([f for f in files_a if f.parts[0] == "shards"]) >= 2 or spec_name == "fuzz"
        for rel in sorted(files_a):
            if rel.parts[0] == "shards":
                assert (a / rel).read_bytes() == (b / rel).read_bytes(), f"{rel}: {_first_difference(a, b)}"
        assert (a / "index.bin").read_bytes() == (b / "index.bin").read_bytes()


@pytest.mark.parametrize("algo", ["none", "lz4"])
def test_manifest_fields_equal_except_extension_and_metadata_hash(runtimes, tmp_path, algo):
    written = _write_both(runtimes, tmp_path, SPECS["tricky"], algo, max_shard_bytes=2500)
    for a, b in zip(written["rt"], written["drt"]):
        ma, mb = read_manifest(a), read_manifest(b)
        ext = mb.pop("datasetrt")
        assert ext["record_checksums"]["file"] == SIDECAR
        assert ext["record_checksums"]["sha256"] == hashlib.sha256((b / SIDECAR).read_bytes()).hexdigest()
        assert ma["cache_id"] == mb["cache_id"]
        assert list(mb) == list(ma)  # same key order as serde's struct order
        for m, cache in ((ma, a), (mb, b)):
            assert m.pop("metadata_sha256") == hashlib.sha256((cache / "metadata.arrow").read_bytes()).hexdigest()
        if algo == "lz4":  # compressed sizes, so index, shard boundaries and hashes, depend on the encoder
            raw_totals = []
            for m, cache in ((ma, a), (mb, b)):
                assert m.pop("index_sha256") == hashlib.sha256((cache / "index.bin").read_bytes()).hexdigest()
                shards = m.pop("shards")
                assert {(s["compression"]["algo"], s["compression"]["ratio"]) for s in shards} == {("lz4", 1.0)}
                for s in shards:
                    data = (cache / "shards" / s["name"]).read_bytes()
                    assert (len(data), hashlib.sha256(data).hexdigest()) == (s["byte_len"], s["sha256"])
                raw_totals.append(sum(s["uncompressed_byte_len"] for s in shards))
            assert raw_totals[0] == raw_totals[1]
        assert mb == ma


@pytest.mark.parametrize("algo", ["none", "lz4"])
def test_metadata_arrow_contents_identical(runtimes, tmp_path, algo):
    """Bytes differ (arrow-rs vs pyarrow IPC layout); schema, nullability, batches and values do not."""
    written = _write_both(runtimes, tmp_path, SPECS["tricky"], algo)
    for a, b in zip(written["rt"], written["drt"]):
        fa, fb = ipc.open_file(a / "metadata.arrow"), ipc.open_file(b / "metadata.arrow")
        assert fb.schema.equals(fa.schema, check_metadata=True)
        assert fb.num_record_batches == fa.num_record_batches == 1
        ta, tb = fa.read_all(), fb.read_all()
        assert tb.equals(ta)
        bits = [np.asarray(t["zf"]).view(np.uint64).tolist() for t in (ta, tb)]
        assert bits[1] == bits[0]  # equals() ignores the sign of zero; the bit patterns do not


def test_lz4_records_equal_after_decoding(runtimes, tmp_path):
    written = _write_both(runtimes, tmp_path, SPECS["tricky"], "lz4", max_shard_bytes=2500)
    for a, b in zip(written["rt"], written["drt"]):
        ra, rb = _records(a), _records(b)
        assert len(ra) == len(rb)
        for sid, (rec_a, rec_b) in enumerate(zip(ra, rb)):
            (ja, pa), (jb, pb) = _split(rec_a), _split(rec_b)
            assert jb == ja, sid
            assert pb[:4] == pa[:4], sid  # u32 LE decoded length, present even for empty payloads
            assert lz4.block.decompress(pb) == lz4.block.decompress(pa), sid
