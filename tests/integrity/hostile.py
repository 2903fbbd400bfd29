"""Generators of caches crafted to exhaust memory or time, and the bounded child process that probes
them.

Each generator turns a cache written by datasetrt into one hostile case, keeping it self-consistent
(every sha256 and size recomputed), so only a bound can refuse it:

- `zstd_rle_frame(n)`: a valid zstd frame of ~4 bytes per 128 KiB that decodes to n zero bytes.
- `inflate_metadata_buffer`: metadata.arrow rewritten with IPC body compression, one buffer of one
  column replaced by such a frame, its length prefix declaring the decoded size.
- `point_at_new_record`: a sample's index row pointed at a record appended to its shard, its payload
  a hole in a sparse file (or a given stored payload), so a huge record costs no disk.
- `sparse_sample_count`: a manifest claiming `n` samples, index.bin and the sidecar extended to
  match as sparse files.

`probe_bounded` opens and reads a cache in a fresh Python process whose address space is capped
(RLIMIT_AS), so a case the reader fails to bound ends as a MemoryError in that child, never as the
OOM killer on the test machine, and whose wall time is capped by a generous hang guard.
"""

from __future__ import annotations

import json
import os
import resource
import struct
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import xxhash

from tests.integrity.corrupt import INDEX_ROW, edit_manifest, read_index, rehash, sidecar_path, write_index

HANG_GUARD_S = 300  # a probe that has not finished by then is blocked (a FIFO) or scanning on
ZSTD_MAGIC = 0xFD2FB528
ZSTD_BLOCK_MAX = 128 << 10


def zstd_rle_frame(size: int) -> bytes:
    """A valid single-segment zstd frame whose content size header says `size` and whose blocks
    are RLE blocks of zero bytes (RFC 8878: 3-byte block header, then the one byte repeated)."""
    out = bytearray(struct.pack("<I", ZSTD_MAGIC))
    out += bytes([0xE0])  # frame header: 8-byte content size, single segment, no checksum, no dict id
    out += struct.pack("<Q", size)
    left = size
    while left:
        n = min(ZSTD_BLOCK_MAX, left)
        left -= n
        header = (1 if left == 0 else 0) | (1 << 1) | (n << 3)  # last flag, block type RLE, size
        out += header.to_bytes(3, "little") + b"\0"
    if size == 0:
        out += (1 | (1 << 1)).to_bytes(3, "little") + b"\0"
    return bytes(out)


# -- metadata.arrow ------------------------------------------------------------------------------

BUFFERS_PER_TYPE = {"bool": 2, "int64": 2, "double": 2, "string": 3, "large_string": 3}


class _Flat:
    """Positions inside one flatbuffer (trusted input: files this module just wrote)."""

    def __init__(self, data: bytes | bytearray, start: int) -> None:
        self.data, self.start = data, start

    def u32(self, pos: int) -> int:
        return struct.unpack_from("<I", self.data, pos)[0]

    def root(self) -> int:
        return self.start + self.u32(self.start)

    def field(self, table: int, index: int) -> int:
        vtable = table - struct.unpack_from("<i", self.data, table)[0]
        size = struct.unpack_from("<H", self.data, vtable)[0]
        slot = 4 + 2 * index
        offset = struct.unpack_from("<H", self.data, vtable + slot)[0] if slot < size else 0
        assert offset, f"field {index} absent"
        return table + offset

    def ref(self, table: int, index: int) -> int:
        at = self.field(table, index)
        return at + self.u32(at)


def inflate_metadata_buffer(cache: Path, column: str, buffer: int, decoded_bytes: int) -> Path:
    """Rewrite `cache`/metadata.arrow as one zstd-compressed record batch whose buffer `buffer`
    (0: validity, 1: values or offsets, 2: string data) of `column` is a valid zstd frame that
    decodes to `decoded_bytes` zero bytes, declared so in its 8-byte length prefix; then rehash
    the cache. The file stays small (~4 bytes per 128 KiB declared)."""
    path = Path(cache) / "metadata.arrow"
    table = ipc.open_file(path).read_all().combine_chunks()
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, table.schema, options=ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_table(table)
    data = bytearray(sink.getvalue().to_pybytes())
    footer_len = struct.unpack_from("<i", data, len(data) - 10)[0]
    footer_start = len(data) - 10 - footer_len
    footer = _Flat(data, footer_start)
    blocks = footer.ref(footer.root(), 3)  # recordBatches: [Block]
    assert footer.u32(blocks) == 1
    block = blocks + 4
    offset, meta_len, body_len = struct.unpack_from("<qi4xq", data, block)
    message = _Flat(data, offset + 8)
    root = message.root()
    batch = message.ref(root, 2)
    buffers = message.ref(batch, 2)
    count = message.u32(buffers)
    before = list(table.schema)[: table.schema.get_field_index(column)]
    first = sum(BUFFERS_PER_TYPE[str(f.type)] for f in before)
    k = first + buffer
    body = offset + meta_len
    pairs = [list(struct.unpack_from("<qq", data, buffers + 4 + 16 * i)) for i in range(count)]
    old_off = pairs[k][0]
    old_end = pairs[k + 1][0] if k + 1 < count else body_len
    stored = struct.pack("<q", decoded_bytes) + zstd_rle_frame(decoded_bytes)
    padded = stored + b"\0" * (-len(stored) % 8)
    delta = len(padded) - (old_end - old_off)
    pairs[k][1] = len(stored)
    for pair in pairs[k + 1 :]:
        pair[0] += delta
    for i, (off, length) in enumerate(pairs):
        struct.pack_into("<qq", data, buffers + 4 + 16 * i, off, length)
    struct.pack_into("<q", data, message.field(root, 3), body_len + delta)  # Message.bodyLength
    struct.pack_into("<q", data, block + 16, body_len + delta)  # Block.bodyLength
    new_body = data[body : body + old_off] + padded + data[body + old_end : body + body_len]
    out = data[:body] + new_body + data[body + body_len :]
    path.write_bytes(bytes(out))
    rehash(cache)
    return path


# -- records and index ---------------------------------------------------------------------------


def point_at_new_record(cache: Path, sample_id: int, payload_bytes: int, stored: bytes | None = None) -> int:
    """Append a record to shard 0 (header, `{}` JSON, then `stored`, or a hole of `payload_bytes`
    zero bytes: the shard is extended sparsely) and point `sample_id`'s index row at it; the
    sidecar entry, the shard's byte_len and uncompressed_byte_len (at least `payload_bytes`) and
    every sha256 follow. Returns the record's stored length."""
    cache = Path(cache)
    shard = cache / "shards" / "000000.bin"
    header = struct.pack("<Q", 2) + b"{}"
    offset = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.seek(offset)
        f.write(header)
        if stored is not None:
            f.write(stored)
        else:
            f.truncate(offset + len(header) + payload_bytes)
    rec_len = len(header) + (len(stored) if stored is not None else payload_bytes)
    rows = read_index(cache)
    rows[sample_id] = (0, offset, rec_len)
    write_index(cache, rows)
    side = sidecar_path(cache)
    if side is not None:
        digest = xxhash.xxh3_64()
        with open(shard, "rb") as f:
            f.seek(offset)
            left = rec_len
            while left:
                chunk = f.read(min(left, 8 << 20))
                digest.update(chunk)
                left -= len(chunk)
        with open(side, "r+b") as f:
            f.seek(8 * sample_id)
            f.write(struct.pack("<Q", digest.intdigest()))
    size = shard.stat().st_size
    edit_manifest(
        cache,
        lambda d: d["shards"][0].update(
            byte_len=size, uncompressed_byte_len=max(d["shards"][0]["uncompressed_byte_len"], payload_bytes) + 1024
        ),
    )
    rehash(cache)
    return rec_len


def sparse_sample_count(cache: Path, samples: int) -> None:
    """Claim `samples` samples: the manifest's sample_count, index.bin and the checksum sidecar
    extended (sparse, rows of zeros past the real ones) to match. sha256 fields are left stale:
    validate_cache=False never hashes them."""
    cache = Path(cache)
    os.truncate(cache / "index.bin", samples * INDEX_ROW.size)
    side = sidecar_path(cache)
    if side is not None:
        os.truncate(side, samples * 8)
    edit_manifest(cache, lambda d: d.__setitem__("sample_count", samples))


# -- the bounded child ---------------------------------------------------------------------------

_CHILD = r"""
import json, resource, sys
args = json.loads(sys.argv[1])
import datasetrt as drt

out = {"stage": None}
def done(stage, exc=None, **extra):
    out["stage"] = stage
    if exc is not None:
        out["error"] = type(exc).__name__
        out["mro"] = [c.__name__ for c in type(exc).__mro__]
        out["message"] = str(exc)
    out.update(extra)
    out["maxrss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps(out))
    sys.exit(0)

config = drt.ReaderConfig(seed=0, shuffle=False, **args["config"])
mode = args["mode"]
rt = None if mode == "none" else drt.DatasetRuntime(num_workers=1, parallel_reads=mode == "parallel")
try:
    ds = (rt.cached_dataset if rt else lambda p, reader_config: drt.CachedDataset(p, reader_config=reader_config))(
        args["paths"], reader_config=config)
except Exception as exc:
    done("open", exc)
action = args["action"]
try:
    if action == "metadata":
        done(None, rows=ds.get_metadata().height)
    elif action == "item":
        done(None, size=len(ds.get_item(ds.get_metadata()["cache_id"][0], args["sample"]).data))
    elif action == "batches":
        done(None, rows=sum(len(b) for b in ds.iter_batches(args.get("batch", 4))))
    elif action == "torch":
        loader = ds.to_torch_dataloader(shuffle=False, batch_size=1, num_workers=1, collate_fn=list, verbose=False)
        done(None, rows=sum(len(b) for b in loader))
    else:
        done(None, rows=sum(1 for _ in ds))
except Exception as exc:
    done("read", exc)
"""


def probe_bounded(paths, *, action: str, mode: str = "none", address_space: int = 4 << 30, **kw) -> dict:
    """Open `paths` (a cache or list) in a child process capped at `address_space` bytes of
    virtual memory and do `action` ("metadata", "iter", "batches", "item", "torch") with reader
    `mode` ("none": CachedDataset without a runtime, "inprocess", "parallel"). Keyword `config`
    is extra ReaderConfig fields. Returns the child's report: "stage" ("open" | "read" | None),
    "error" / "mro" / "message" for a failure, "maxrss_kib"."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    args = {"paths": [str(p) for p in paths], "action": action, "mode": mode, "config": kw.pop("config", {}), **kw}

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(args)],
        preexec_fn=cap,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines, f"child failed ({proc.returncode}): {proc.stderr[-3000:]}"
    return json.loads(lines[-1])


def assert_refused(report: dict, stage: str, cls: str, *fragments: str) -> None:
    """The child's report: a failure at `stage` of class `cls` (by name) whose message holds every
    fragment."""
    assert report["stage"] == stage, report
    assert report["error"] == cls, report
    assert "DatasetRTError" in report["mro"], report
    for fragment in fragments:
        assert str(fragment) in report["message"], (fragment, report["message"])
