"""The suite's workloads: deterministic payloads per mode, and every store one workload is read
from (the flat payload file, a datasetrt cache and its shuffled order per codec, loaderx stores,
Streaming / LitData stores).

Workloads (seed suite.SEED): fixed 4 KiB and 150 KiB records, variable 1-64 KiB records, a
compressible token-like corpus (int32 sequences, zipf token ids, 128-2048 tokens) and int32[512]
(fixed 512-token int32 records, 2 KiB, zipf ids; its datasetrt cache typed
`PayloadSpec("<i4", (512,))` when datasetrt has it); metadata columns label (str), n (int),
score (float). The flat file (`payloads.bin`, payloads concatenated in write order, and
`offsets.npy`, int64 N+1 byte offsets) is what the torch memmap contender and the limits read.

Boundary: builds stores, measures nothing; a store a peer cannot build is recorded as that
peer's error, never raised.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks.caches import write_cache
from benchmarks.common import Digest
from benchmarks.peers import build_loaderx
from benchmarks.stream_peers import INSTALL_HINT, installed
from benchmarks.suite import LITDATA, ROW, SEED, STREAMING, TOKENS512, contender_child

# (name, kind, size or (lo, hi), count, algos) per mode; counts are multiples of 256 (loaderx steps).
MODES = {
    "smoke": [
        ("4 KiB", "fixed", 4096, 1024, "none"),
        ("1-64 KiB", "var", (1024, 65536), 512, "none"),
        ("tokens", "tokens", (128, 2048), 1024, "lz4,zstd"),
        (TOKENS512, "tok512", 2048, 1024, "none"),
    ],
    "quick": [
        ("4 KiB", "fixed", 4096, 4096, "none,lz4"),
        ("150 KiB", "fixed", 150 * 1024, 512, "none"),
        ("1-64 KiB", "var", (1024, 65536), 1024, "none"),
        ("tokens", "tokens", (128, 2048), 4096, "lz4,zstd"),
        (TOKENS512, "tok512", 2048, 8192, "none,zstd"),
    ],
    "full": [
        ("4 KiB", "fixed", 4096, 16384, "none,lz4"),
        ("150 KiB", "fixed", 150 * 1024, 2048, "none"),
        ("1-64 KiB", "var", (1024, 65536), 4096, "none,lz4"),
        ("tokens", "tokens", (128, 2048), 16384, "lz4,zstd"),
        (TOKENS512, "tok512", 2048, 32768, "none,zstd"),
    ],
}
# Many small caches (write section only): N sources of 20 x 64 B records each, one write_cache call.
MANY_SMALL = {"smoke": 50, "quick": 100, "full": 2000}
MANY_SMALL_RECORDS, MANY_SMALL_BYTES = 20, 64


def make_payloads(kind: str, size, count: int, seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    if kind == "fixed":
        return [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for _ in range(count)]
    if kind == "var":
        lens = rng.integers(size[0], size[1] + 1, count)
        return [rng.integers(0, 256, int(n), dtype=np.uint8).tobytes() for n in lens]
    if kind == "tok512":
        ids = (rng.zipf(1.3, (count, size // 4)) - 1) % 32000
        return [row.astype("<i4").tobytes() for row in ids]
    lens = rng.integers(size[0], size[1] + 1, count)
    return [((rng.zipf(1.3, int(n)) - 1) % 32000).astype("<i4").tobytes() for n in lens]


def many_small_payloads(sources: int) -> list[bytes]:
    """The many-small write's payloads: `sources` x MANY_SMALL_RECORDS fixed MANY_SMALL_BYTES records."""
    return make_payloads("fixed", MANY_SMALL_BYTES, sources * MANY_SMALL_RECORDS, SEED)


class Source:
    """A CacheSource over prepared payloads; metadata label / n / score."""

    def __init__(self, name: str, payloads: list[bytes], make_input) -> None:
        self.name = name
        self.payloads = payloads
        self.count = len(payloads)
        self.make_input = make_input

    def __iter__(self):
        for i, p in enumerate(self.payloads):
            yield self.make_input(p, {"label": f"class{i % 10}", "n": i, "score": i * 0.5 + 0.25})


def write_flat(flat: Path, payloads: list[bytes]) -> np.ndarray:
    """The flat file of `payloads` under directory `flat`; returns the offsets."""
    flat.mkdir(parents=True)
    offsets = np.zeros(len(payloads) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in payloads], out=offsets[1:])
    with open(flat / "payloads.bin", "wb") as f:
        for p in payloads:
            f.write(p)
    np.save(flat / "offsets.npy", offsets)
    return offsets


def prepare(
    workdir: Path, name: str, kind: str, size, count: int, algos: list[str], workers: int, stream_peers: bool
) -> dict:
    """Generate one workload and write it everywhere it is read from: the flat file, a datasetrt
    cache per codec (typed for int32[512] when datasetrt has PayloadSpec), datasetrt's shuffled
    order per codec, a loaderx store per store codec, and with `stream_peers` a Streaming MDS
    directory and a LitData optimized directory per store codec (each built in a child process:
    their imports stay out of this one). Returns the workload dict the sections read."""
    import datasetrt

    payloads = make_payloads(kind, size, count, SEED)
    flat = workdir / "flat"
    offsets = write_flat(flat, payloads)
    dtype = "<i4" if kind in ("tokens", "tok512") else "u1"
    typed = ROW if kind == "tok512" else None
    out = {
        "flat": str(flat),
        "caches": {},
        "loaderx": {},
        "loaderx_errors": {},
        "orders": {},
        "bytes": int(offsets[-1]),
        "count": count,
        "written": Digest.of(payloads),
        "fixed_size": size if kind in ("fixed", "tok512") else None,
        "dtype": dtype,
        "typed": typed,
        "stores": {},
    }
    rt = datasetrt.DatasetRuntime(num_workers=workers)
    try:
        for algo in algos:
            path = write_cache(
                datasetrt, rt, workdir / f"cache-{algo}", Source("suite", payloads, datasetrt.CacheInput), algo, typed
            )
            out["caches"][algo] = str(path)
            # datasetrt's shuffled sample order (dataset-rt's plan, which draws with replacement), so
            # the peers can replay it and be compared byte for byte.
            ds = datasetrt.CachedDataset(
                [path], reader_config=datasetrt.ReaderConfig(seed=SEED, shuffle=True), runtime=None
            )
            order = np.fromiter((s.sample_id for s in ds), dtype=np.int64)
            np.save(workdir / f"order-{algo}.npy", order)
            out["orders"][algo] = str(workdir / f"order-{algo}.npy")
            out["distinct_shuffled"] = len(np.unique(order))
    finally:
        rt.close()
    for codec in sorted({"raw" if a == "none" else "zstd" for a in algos}):
        store = workdir / f"loaderx-{codec}"
        try:
            build_loaderx(store, payloads, out["fixed_size"], dtype, codec)
            out["loaderx"][codec] = str(store)
        except Exception as exc:
            out["loaderx_errors"][codec] = f"{type(exc).__name__}: {exc}"
        for peer in (STREAMING, LITDATA) if stream_peers else ():
            if not installed(peer):
                out["stores"][(peer, codec)] = {"error": f"not installed ({INSTALL_HINT})"}
                continue
            store = workdir / f"{peer.split()[-1].lower()}-{codec}"
            out["stores"][(peer, codec)] = contender_child(
                {
                    "task": "build",
                    "contender": peer,
                    "flat": str(flat),
                    "typed": typed,
                    "codec": codec,
                    "out": str(store),
                },
                timeout=900,
            )
    return out
