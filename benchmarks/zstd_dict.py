"""zstd_dict benchmark: compression ratio and read samples/s of datasetrt's zstd_dict
against its zstd and lz4 (and none), beside loaderx's zstd and zstd_dict on the same records, in
one run.

Workloads (generated deterministically, seed 14):
  int32[512] tokens   2 KiB records of Zipf(1.3) token ids mod 32,000 (the suite's int32[512])
  int32[128] tokens   512 B records of the same ids (the shape of loaderx's observed 2.54x vs 1.91x)
  JSON-like events    ~140 B records {"id", "user", "event", "ts", "page", "value", "tags"}

Contenders, each writing the same records:
  datasetrt none | lz4 | zstd | zstd_dict | zstd_dict 64 KiB
      DatasetRuntime(num_workers=W).write_cache (level 3; zstd_dict with the default 32 KiB
      dictionary, and 64 KiB), one small metadata column. Read in this process:
      CachedDataset(runtime=None).iter_batches(256, with_metadata=False) over datasetrt's shuffled
      plan (seed 14: random access, draws with replacement).
  loaderx raw | zstd | zstd_dict
      Dense (tokens) or Ragged uint8 (JSON) store; zstd_dict with `train_dict` on the same records
      (its fixed 32 KiB dictionary from a <= 4 MiB strided sample). Read: `store[idx]` for the same
      plan in 256-row steps, one thread (its gather fans out natively), no Loader.

Figures:
  ratio    payload bytes / (bytes the stored payloads take + the dictionary). datasetrt: its shards
           minus the record envelopes (8-byte header + metadata JSON, the same in every codec,
           measured on its `none` cache), so each record's zstd frame header counts; loaderx: its
           data files (data_*.zr: records with its own framing and alignment). Both stores' location
           tables (index.bin, meta.zr) are left out. "disk MiB" is every file of the cache / store.
  write s  wall seconds of one write, the dictionary's training included (datasetrt trains while
           writing; loaderx's `train_dict` is timed apart, "+ train").
  read     payloads delivered per second (wall) and CPU microseconds per payload (process time:
           all threads of this process; loaderx gathers on 2 native lanes), median [min - max] of
           R timed passes after one untimed pass that checks every contender's bytes against the
           generated records in the plan's order (the exit status is 1 when any differ). CPU time
           is the steadier figure on a shared machine.
No speed is asserted. Usage:
  python -m benchmarks.zstd_dict [--smoke | --quick | --full] [--workers 2] [--repeats R] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

import datasetrt as drt
from benchmarks.common import Digest, exit_on_different_bytes, machine_facts, median

SEED = 14
BATCH = 256
COUNTS = {  # records per workload
    "smoke": {"int32[512] tokens": 1024, "int32[128] tokens": 2048, "JSON-like events": 4096},
    "quick": {"int32[512] tokens": 8192, "int32[128] tokens": 16384, "JSON-like events": 32768},
    "full": {"int32[512] tokens": 32768, "int32[128] tokens": 65536, "JSON-like events": 131072},
}
REPEATS = {"smoke": 1, "quick": 3, "full": 5}
# datasetrt contenders: label -> ShardCompression keywords
DATASETRT = {
    "datasetrt none": {"algo": "none"},
    "datasetrt lz4": {"algo": "lz4"},
    "datasetrt zstd": {"algo": "zstd"},
    "datasetrt zstd_dict": {"algo": "zstd_dict"},
    "datasetrt zstd_dict 64 KiB": {"algo": "zstd_dict", "dict_bytes": 64 << 10},
}
LOADERX = {"loaderx raw": "raw", "loaderx zstd": "zstd", "loaderx zstd_dict": "zstd_dict"}
WORDS = (
    "alpha",
    "beta",
    "gamma",
    "delta",
    "user",
    "click",
    "view",
    "buy",
    "session",
    "page",
    "home",
    "cart",
    "search",
    "product",
    "price",
)


# -- workloads -------------------------------------------------------------------------------------


def make_payloads(workload: str, count: int) -> tuple[list[bytes], int | None]:
    """(payloads, fixed record length or None)."""
    rng = np.random.default_rng(SEED)
    if workload.startswith("int32["):
        tokens = int(workload[6 : workload.index("]")])
        ids = ((rng.zipf(1.3, (count, tokens)) - 1) % 32000).astype("<i4")
        return [row.tobytes() for row in ids], tokens * 4
    users = rng.integers(0, 5000, count)
    events = rng.integers(0, len(WORDS), count)
    pages = rng.integers(0, len(WORDS), (count, 3))
    values = rng.random(count) * 100
    ntags = rng.integers(1, 4, count)
    tags = rng.integers(0, len(WORDS), (count, 3))
    out = []
    for i in range(count):
        rec = {
            "id": i,
            "user": f"u{users[i]}",
            "event": WORDS[events[i]],
            "ts": 1_700_000_000 + 13 * i,
            "page": "/" + "/".join(WORDS[k] for k in pages[i]),
            "value": round(float(values[i]), 2),
            "tags": [WORDS[k] for k in tags[i, : ntags[i]]],
        }
        out.append(json.dumps(rec).encode())
    return out, None


class Source:
    def __init__(self, payloads: list[bytes]) -> None:
        self.name = "bench"
        self.payloads = payloads

    def __iter__(self):
        for i, p in enumerate(self.payloads):
            yield drt.CacheInput(p, {"n": i})


def digest(chunks) -> str:
    """Ordered digest of `chunks` (common.Digest: sha256 over length-prefixed payloads)."""
    return Digest.of(chunks)["digest"]


def _summary(values: list[float]) -> dict:
    return {"median": median(values), "min": min(values), "max": max(values), "values": values}


# -- datasetrt -------------------------------------------------------------------------------------


def datasetrt_write(base: Path, payloads: list[bytes], comp: dict, workers: int) -> tuple[Path, float]:
    cfg = drt.WriterConfig(show_progress=False, shard_compression=drt.ShardCompression(**comp))
    with drt.DatasetRuntime(num_workers=workers) as rt:
        start = time.perf_counter()
        [result] = rt.write_cache([Source(payloads)], base, writer_config=cfg)
        seconds = time.perf_counter() - start
    assert isinstance(result, drt.CacheWriteSuccess), result
    return Path(result.path), seconds


def disk_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def datasetrt_stored(cache: Path) -> tuple[int, int]:
    """(bytes of its shards, bytes of its dictionary file) from the manifest."""
    doc = json.loads((cache / "manifest.json").read_text())
    entry = doc.get("datasetrt", {}).get("zstd_dictionary")
    return sum(s["byte_len"] for s in doc["shards"]), entry["byte_len"] if entry else 0


def datasetrt_plan(cache: Path) -> np.ndarray:
    ds = drt.CachedDataset([cache], reader_config=drt.ReaderConfig(seed=SEED, shuffle=True), runtime=None)
    return np.concatenate(
        [np.asarray(b.sample_id, dtype=np.int64) for b in ds.iter_batches(BATCH, with_metadata=False)]
    )


def datasetrt_read(cache: Path, check: bool) -> tuple[int, float, float, str | None]:
    """One pass of the shuffled plan: (records, wall s, CPU s, ordered digest if `check`)."""
    ds = drt.CachedDataset([cache], reader_config=drt.ReaderConfig(seed=SEED, shuffle=True), runtime=None)
    n = 0
    parts: list = []
    start, cpu = time.perf_counter(), time.process_time()
    for b in ds.iter_batches(BATCH, with_metadata=False):
        n += len(b)
        if check:
            parts.extend(bytes(b.payload(i)) for i in range(len(b)))
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    ds.close()
    return n, seconds, cpu, digest(parts) if check else None


# -- loaderx ---------------------------------------------------------------------------------------


def loaderx_write(store: Path, payloads: list[bytes], fixed: int | None, codec: str) -> tuple[float, float]:
    """(train seconds, write seconds)."""
    from loaderx.utils import train_dict
    from loaderx.zrecord import Dense, Ragged, RaggedBatch

    if fixed is not None:
        data = np.frombuffer(b"".join(payloads), dtype="<i4").reshape(len(payloads), -1)
        records = None
    else:
        data = None
        records = [np.frombuffer(p, dtype=np.uint8) for p in payloads]
    train_s, dictionary = 0.0, None
    if codec == "zstd_dict":
        start = time.perf_counter()
        dictionary = train_dict(data if data is not None else records)
        train_s = time.perf_counter() - start
    start = time.perf_counter()
    if data is not None:
        with Dense.create(store, np.int32, data.shape[1:], codec=codec, dict_bytes=dictionary) as ds:
            ds.append(data)
    else:
        with Ragged.create(store, np.uint8, 1, codec=codec, dict_bytes=dictionary) as rs:
            for s in range(0, len(records), 4096):
                rs.append(RaggedBatch.from_records(records[s : s + 4096]))
    return train_s, time.perf_counter() - start


def loaderx_stored(store: Path) -> tuple[int, int]:
    """(bytes of its data files, bytes of dict.zr)."""
    files = {p.name: p.stat().st_size for p in store.iterdir()}
    return sum(v for k, v in files.items() if k.startswith("data_")), files.get("dict.zr", 0)


def loaderx_read(store: Path, fixed: bool, order: np.ndarray, check: bool) -> tuple[int, float, float, str | None]:
    from loaderx.zrecord import Dense, Ragged

    st = (Dense if fixed else Ragged).open(store)
    n = 0
    parts: list = []
    try:
        start, cpu = time.perf_counter(), time.process_time()
        for s in range(0, len(order), BATCH):
            value = st[order[s : s + BATCH]]
            if fixed:
                rows = np.from_dlpack(value)
                n += len(rows)
                if check:
                    parts.extend(row.tobytes() for row in rows)
            else:
                values, cu = np.from_dlpack(value.values), np.from_dlpack(value.cu_seqlens)
                n += len(cu) - 1
                if check:
                    parts.extend(values[cu[j] : cu[j + 1]].tobytes() for j in range(len(cu) - 1))
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    finally:
        st.close()
    return n, seconds, cpu, digest(parts) if check else None


# -- the run ---------------------------------------------------------------------------------------


def bench_workload(work: Path, workload: str, count: int, workers: int, repeats: int) -> tuple[list[dict], list[str]]:
    payloads, fixed = make_payloads(workload, count)
    raw = sum(len(p) for p in payloads)
    rows: list[dict] = []
    failures: list[str] = []
    caches: dict[str, Path] = {}
    for label, comp in DATASETRT.items():
        cache, write_s = datasetrt_write(work / label.replace(" ", "-"), payloads, comp, workers)
        caches[label] = cache
        shards, dict_bytes = datasetrt_stored(cache)
        algos = {s["compression"]["algo"] for s in json.loads((cache / "manifest.json").read_text())["shards"]}
        rows.append(
            {
                "workload": workload,
                "contender": label,
                "write_s": write_s,
                "train_s": None,
                "stored": shards,
                "dict_bytes": dict_bytes,
                "disk": disk_bytes(cache),
                "algos": sorted(algos),
            }
        )
    order = datasetrt_plan(caches["datasetrt none"])
    expected = digest(payloads[i] for i in order)
    envelope = rows[0]["stored"] - raw  # datasetrt none: what the record envelopes cost beside the payloads
    for row in rows:
        row["stored"] -= envelope
        row["ratio"] = raw / (row["stored"] + row["dict_bytes"])
    stores: dict[str, Path] = {}
    for label, codec in LOADERX.items():
        store = work / label.replace(" ", "-")
        row = {"workload": workload, "contender": label, "train_s": None, "dict_bytes": 0}
        try:
            row["train_s"], row["write_s"] = loaderx_write(store, payloads, fixed, codec)
            row["stored"], row["dict_bytes"] = loaderx_stored(store)
            row["disk"] = disk_bytes(store)
            row["ratio"] = raw / (row["stored"] + row["dict_bytes"])
            stores[label] = store
        except Exception as exc:  # a peer API failure is a finding, not a crash
            row["error"] = f"{type(exc).__name__}: {exc}"
        rows.append(row)
    for row in rows:
        if "error" in row:
            continue
        label = row["contender"]
        rates, cpu_us = [], []
        for rep in range(repeats + (1 if repeats > 1 else 0)):
            check = rep == 0
            if label in caches:
                n, seconds, cpu, got = datasetrt_read(caches[label], check)
            else:
                n, seconds, cpu, got = loaderx_read(stores[label], fixed is not None, order, check)
            if check and (got != expected or n != len(order)):
                failures.append(f"{workload}: {label} read {n} records, digest {got} != {expected}")
            if rep > 0 or repeats == 1:
                rates.append(n / seconds)
                cpu_us.append(1e6 * cpu / n)
        row["read"] = _summary(rates)
        row["read_cpu_us"] = _summary(cpu_us)
    for path in [*caches.values(), *stores.values()]:
        shutil.rmtree(path, ignore_errors=True)
    return rows, failures


def render(rows: list[dict], counts: dict) -> str:
    lines = [
        "| workload | contender | ratio | payloads stored MiB (+ dict) | disk MiB | write s | "
        "read samples/s, median [min - max] | read CPU us/sample |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        name = f"{r['workload']} x {counts[r['workload']]:,}"
        if "error" in r:
            lines.append(f"| {name} | {r['contender']} | error: {r['error']} | | | | | |")
            continue
        stored = f"{r['stored'] / 2**20:.2f}" + (f" (+ {r['dict_bytes'] / 1024:.0f} KiB)" if r["dict_bytes"] else "")
        write = f"{r['write_s']:.2f}" + (f" (+ train {r['train_s']:.2f})" if r.get("train_s") else "")
        if r.get("algos") and r["algos"] != [DATASETRT.get(r["contender"], {}).get("algo")]:
            write += f" [wrote {', '.join(r['algos'])}]"
        rd, cpu = r["read"], r["read_cpu_us"]
        lines.append(
            f"| {name} | {r['contender']} | {r['ratio']:.2f}x | {stored} | {r['disk'] / 2**20:.2f} | {write} | "
            f"{rd['median']:,.0f} [{rd['min']:,.0f} - {rd['max']:,.0f}] | "
            f"{cpu['median']:.1f} [{cpu['min']:.1f} - {cpu['max']:.1f}] |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--smoke", action="store_const", dest="mode", const="smoke")
    mode.add_argument("--quick", action="store_const", dest="mode", const="quick")
    mode.add_argument("--full", action="store_const", dest="mode", const="full")
    parser.add_argument("--workers", type=int, default=2, help="datasetrt writer threads (default 2)")
    parser.add_argument("--repeats", type=int, help="timed read passes per contender")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    mode = args.mode or "quick"
    repeats = args.repeats or REPEATS[mode]
    counts = COUNTS[mode]
    rows: list[dict] = []
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="drt-zstd-dict-") as tmp:
        datasetrt_write(Path(tmp) / "warm-up", [b"x"] * 8, {"algo": "zstd_dict"}, args.workers)  # imports, untimed
        for workload, count in counts.items():
            got, bad = bench_workload(
                Path(tmp) / workload.split()[0].replace("[", "").replace("]", ""),
                workload,
                count,
                args.workers,
                repeats,
            )
            rows += got
            failures += bad
            print(f"done: {workload} x {count:,}", flush=True)
    print(
        f"\nzstd_dict: ratio, write and shuffled in-process read ({mode}, {repeats} timed passes, "
        f"{args.workers} writer threads)\n"
    )
    print(render(rows, counts))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps({"machine": machine_facts(), "mode": mode, "counts": counts, "rows": rows}, indent=2)
        )
    exit_on_different_bytes(failures)  # exits 1 when any differ
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
