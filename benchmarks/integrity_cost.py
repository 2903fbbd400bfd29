"""Cost of per-record integrity checks on read: the same caches read with
`ReaderConfig(verify_records=True)` (default: XXH3-64 of every record checked against the sidecar)
and `verify_records=False`, single process, per-sample and batch paths, in one run.

Usage: python -m benchmarks.integrity_cost [--quick] [--repeats R]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import datasetrt
from benchmarks.caches import write_once
from benchmarks.common import Measurement, machine_facts, repeat, save_json, timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--out", type=Path, default=Path("bench-out/integrity_cost.json"))
    args = parser.parse_args()
    repeats = args.repeats or (3 if args.quick else 7)
    sizes = [(4096, 4096 if args.quick else 32768), (150 * 1024, 200 if args.quick else 2000)]
    workdir = Path(tempfile.mkdtemp(prefix="datasetrt-bench-integrity-"))
    ms: list[Measurement] = []
    try:
        for payload_bytes, count in sizes:
            cache = write_once(datasetrt, workdir / f"c{payload_bytes}", count, payload_bytes, "none")
            mib = count * payload_bytes / 2**20
            for path_name in ("per-sample", "batches of 256"):
                workload = f"{payload_bytes // 1024} KiB x {count} {path_name}"
                for verify in (True, False):
                    ds = datasetrt.CachedDataset(
                        [cache],
                        reader_config=datasetrt.ReaderConfig(seed=1, shuffle=False, verify_records=verify),
                        runtime=None,
                    )
                    if path_name == "per-sample":
                        run = lambda ds=ds: sum(1 for _ in ds)  # noqa: E731
                    else:
                        run = lambda ds=ds: sum(len(b) for b in ds.iter_batches(256, with_metadata=False))  # noqa: E731
                    run()  # warm the page cache and the reader
                    label = "verify_records=True" if verify else "verify_records=False"
                    ms.append(Measurement(workload, label, "MiB/s", repeat(lambda: mib / timed(run), repeats)))  # noqa: B023 (called within this iteration)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"machine: {machine_facts()}")
    print("| workload | verify on (MiB/s) | verify off (MiB/s) | cost of verification |")
    print("|---|---:|---:|---:|")
    for on, off in zip(ms[::2], ms[1::2]):
        print(f"| {on.workload} | {on.median:,.0f} | {off.median:,.0f} | {100 * (1 - on.median / off.median):.1f}% |")
    save_json(args.out, ms, {"benchmark": "integrity_cost", "repeats": repeats})


if __name__ == "__main__":
    main()
