"""Foundation benchmark: datasetrt vs dataset-rt 0.4.8, same data, same process run.

Workloads (reference §5's micro-benchmark shapes):
  write   N x 4 KiB records, none and lz4                     -> payload MiB/s
  read    single-process per-sample iteration of the same caches (datasetrt: runtime=None;
          dataset-rt: num_workers=1), ordered and shuffled, none and lz4 -> samples/s
          plus the physical limit: one pread of every shard byte from the page cache
  open    K small caches (hard links of one cache under distinct names)  -> seconds
Before timing, both libraries' outputs are checked to be the same samples in the same order.

Usage: python -m benchmarks.foundation [--quick] [--repeats R] [--out bench-out/foundation.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import dataset_rt

import datasetrt
from benchmarks.caches import make_many_caches, open_caches, write_once
from benchmarks.common import DATASET_RT, Measurement, machine_facts, ratio_table, repeat, save_json, timed

LIBS = {"datasetrt": datasetrt, DATASET_RT: dataset_rt}
OURS = "datasetrt"


def bench_write(workdir: Path, count: int, payload_bytes: int, repeats: int) -> list[Measurement]:
    out = []
    mib = count * payload_bytes / 2**20
    for algo in ("none", "lz4"):
        for label, lib in LIBS.items():
            m = Measurement(f"write {count}x{payload_bytes // 1024} KiB {algo}", label, "MiB/s")
            runs = []

            def run() -> float:
                base = workdir / f"w-{len(runs)}-{label.split()[0]}-{algo}"  # noqa: B023 (called within this iteration)
                runs.append(base)  # noqa: B023 (called within this iteration)
                seconds = timed(lambda: write_once(lib, base, count, payload_bytes, algo))  # noqa: B023 (called within this iteration)
                shutil.rmtree(base)
                return mib / seconds

            m.values = repeat(run, repeats)
            out.append(m)
    return out


def iterate_all(ds) -> int:
    n = 0
    for _ in ds:
        n += 1
    return n


def digest(ds) -> str:
    h = hashlib.sha256()
    for s in ds:
        h.update(s.data)
        h.update(json.dumps(s.metadata, sort_keys=True).encode())
        h.update(f"{s.cache_id}:{s.sample_id}".encode())
    return h.hexdigest()


def page_cache_limit(cache: Path, count: int, repeats: int) -> list[float]:
    """samples/s equivalent of reading every shard byte once with pread into one buffer."""
    shards = sorted((cache / "shards").iterdir())
    sizes = [p.stat().st_size for p in shards]
    buf = bytearray(max(sizes))

    def run() -> float:
        def read_all() -> None:
            for path, size in zip(shards, sizes):
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.preadv(fd, [memoryview(buf)[:size]], 0)
                finally:
                    os.close(fd)

        return count / timed(read_all)

    return repeat(run, repeats)


def bench_read(workdir: Path, count: int, payload_bytes: int, repeats: int) -> list[Measurement]:
    out = []
    for algo in ("none", "lz4"):
        cache = write_once(datasetrt, workdir / f"r-{algo}", count, payload_bytes, algo)
        for shuffle in (False, True):
            workload = f"read {count}x{payload_bytes // 1024} KiB {algo} {'shuffled' if shuffle else 'ordered'}"
            datasets = {}
            for label, lib in LIBS.items():
                cfg = lib.ReaderConfig(seed=7, shuffle=shuffle)
                if lib is datasetrt:  # the single-process path: no runtime, no worker processes
                    datasets[label] = lib.CachedDataset([cache], reader_config=cfg, runtime=None)
                else:  # dataset-rt's minimum: one native reader thread
                    datasets[label] = lib.DatasetRuntime(num_workers=1).cached_dataset([cache], reader_config=cfg)
            digests = {label: digest(ds) for label, ds in datasets.items()}
            assert len(set(digests.values())) == 1, f"{workload}: contenders disagree: {digests}"
            for label, ds in datasets.items():
                m = Measurement(workload, label, "samples/s")
                m.values = repeat(lambda ds=ds: count / timed(lambda: iterate_all(ds)), repeats)
                out.append(m)
            if algo == "none" and not shuffle:
                out.append(
                    Measurement(
                        workload, "page-cache pread (limit)", "samples/s", page_cache_limit(cache, count, repeats)
                    )
                )
    return out


def bench_open(workdir: Path, how_many: int, repeats: int) -> list[Measurement]:
    paths = make_many_caches(workdir, how_many)
    out = []
    for label, lib in LIBS.items():
        rt = lib.DatasetRuntime(num_workers=1)
        m = Measurement(f"open {how_many} caches", label, "s", higher_is_better=False)
        m.values = repeat(lambda: timed(lambda: open_caches(lib, rt, paths)), repeats)  # noqa: B023 (called within this iteration)
        out.append(m)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes (CI smoke): 2048 records, 500 caches")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--out", type=Path, default=Path("bench-out/foundation.json"))
    args = parser.parse_args()
    count = 2048 if args.quick else 16384
    caches = 500 if args.quick else 10_000
    repeats = args.repeats or (2 if args.quick else 5)
    workdir = Path(tempfile.mkdtemp(prefix="datasetrt-bench-"))
    try:
        ms = bench_write(workdir, count, 4096, repeats)
        ms += bench_read(workdir, count, 4096, repeats)
        ms += bench_open(workdir, caches, max(1, repeats // 2 + 1))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"machine: {machine_facts()}")
    print(ratio_table(ms, OURS))
    save_json(args.out, ms, {"benchmark": "foundation", "quick": args.quick, "repeats": repeats})


if __name__ == "__main__":
    main()
