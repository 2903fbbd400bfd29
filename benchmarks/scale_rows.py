"""Scale benchmark, rows: memory per active row of the whole process tree, and the time and peak
memory of open + filter + reweight + first sample, datasetrt against dataset-rt 0.4.8.

Workload: `rows` tiny records (8 bytes, no compression) in `caches` caches (default 50) with one
int64 metadata column `group` (row % 10). One cache is written with datasetrt's NumpySource and
the others are hard links of its files under their own manifests (distinct source names and
cache ids), so a 2*10^7-row workload costs one 4*10^5-row write. Hard links share their pages:
the file-backed figures then count one cache's index and checksums for all of them; `--copy`
gives each cache files of its own (the file-backed figures of caches written separately). Caches written by datasetrt are
readable by dataset-rt 0.4.8 (same format).

Each configuration runs in its own fresh process (`--run`), which measures itself and its
descendants (the reader workers) from /proc/PID/smaps_rollup: anonymous (Pss_Anon), shmem
(Pss_Shmem) and file-backed (Pss_File) PSS, summed over the tree. Steps, each followed by a
sample of the tree:

  base       after the imports (the library, Polars) and the runtime (`DatasetRuntime(num_workers=2)`)
  open       `runtime.cached_dataset(paths, ReaderConfig(seed=1, shuffle=True, sampling=...))`
  filter     `df = ds.get_metadata().filter(pl.col("group") != 0)` (90 % of the rows)
  reweight   `ds.update_metadata(df.with_columns(weight=...))` (float weights in draws mode;
             integer repeat counts 1/2 in permutation mode; 1.0 in mixture mode, then
             `ds.set_mixture(Mixture.by_column("group", {1: .5, 2: .5}))`)
  first      `next(iter(ds))`
  read       `reads` samples (default 100,000) more

A background thread samples the tree every 50 ms for the peak. The growth per active row is
(anon + shmem at `read`) - (anon + shmem at `base`), divided by the active rows; the user's
columns (`df.estimated_size()` of the active table the user built:
the frame the user built and holds; the physical table it was filtered from is dropped) are
reported beside it and subtracted for the
"beyond the user's columns" figure.

Usage:
  python -m benchmarks.scale_rows --rows 2000000 [--rows 20000000 ...] [--modes draws,permutation,mixture]
                                  [--peers datasetrt,dataset-rt] [--out bench-out/scale_rows.json]
  python -m benchmarks.scale_rows --run datasetrt --mode draws --workdir DIR   one configuration
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.common import child_process, machine_facts

MIB = 2**20
RECORD = 8
READS = 100_000
PEERS = ("datasetrt", "dataset-rt")
MODES = ("draws", "permutation", "mixture")
STEPS = ("base", "open", "filter", "reweight", "first", "read")


# --------------------------------------------------------------------------------------------
# memory of a process tree


def _rollup(pid: int) -> dict[str, int]:
    """Pss_Anon, Pss_Shmem, Pss_File and Pss of /proc/PID/smaps_rollup, in bytes ({} if gone)."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("Pss", "Pss_Anon", "Pss_Shmem", "Pss_File"):
                    out[key] = int(rest.split()[0]) * 1024
    except OSError:
        return {}
    return out


def _descendants(pid: int) -> list[int]:
    """`pid` and its live descendants (through /proc/PID/task/*/children)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            continue
    return found


def tree_memory(pid: int | None = None) -> dict[str, int]:
    """anon, shmem, file and pss bytes summed over `pid` (default this process) and its descendants,
    plus `processes` and `per_process` (anon + shmem of each, in tree order)."""
    total = {"anon": 0, "shmem": 0, "file": 0, "pss": 0}
    per = []
    for p in _descendants(pid or os.getpid()):
        r = _rollup(p)
        if not r:
            continue
        total["anon"] += r.get("Pss_Anon", 0)
        total["shmem"] += r.get("Pss_Shmem", 0)
        total["file"] += r.get("Pss_File", 0)
        total["pss"] += r.get("Pss", 0)
        per.append(r.get("Pss_Anon", 0) + r.get("Pss_Shmem", 0))
    return {**total, "processes": len(per), "per_process": per}  # type: ignore[dict-item]


class PeakSampler:
    """Samples tree_memory() every `interval_s` from `with` to its end: `peak` anon+shmem and pss."""

    def __init__(self, interval_s: float = 0.05) -> None:
        self.interval_s = interval_s
        self.peak_private = 0
        self.peak_pss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scale-sampler", daemon=True)

    def sample(self) -> None:
        m = tree_memory()
        self.peak_private = max(self.peak_private, m["anon"] + m["shmem"])
        self.peak_pss = max(self.peak_pss, m["pss"])

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


# --------------------------------------------------------------------------------------------
# workload


def prepare(workdir: Path, rows: int, caches: int, copy: bool = False) -> list[Path]:
    """`caches` caches of rows // caches records each under workdir/caches (one written, the rest
    hard links, or with `copy` copies: files of their own, so each cache's mapped index and
    checksums are pages of their own, as for caches written separately), each with its own
    manifest. Returns their paths."""
    import numpy as np

    import datasetrt
    import datasetrt.format.layout
    from datasetrt.sources.arrays import NumpySource

    per = rows // caches
    rt = datasetrt.DatasetRuntime(num_workers=1)
    cfg = datasetrt.WriterConfig(show_progress=False, shard_compression=datasetrt.ShardCompression(algo="none"))
    src = NumpySource(
        "c00000", np.zeros((per, RECORD), dtype=np.uint8), metadata={"group": np.arange(per, dtype=np.int64) % 10}
    )
    [res] = rt.write_cache([src], workdir / "seed", writer_config=cfg)
    rt.close()
    assert isinstance(res, datasetrt.CacheWriteSuccess), res
    seed = Path(res.path)
    manifest = json.loads((seed / "manifest.json").read_text())
    base = workdir / "caches"
    base.mkdir(parents=True)
    paths = []
    for i in range(caches):
        name = f"c{i:05d}"
        d = base / name
        (d / "shards").mkdir(parents=True)
        for rel in (
            "index.bin",
            "metadata.arrow",
            "checksums.xxh3",
            *(f"shards/{s['name']}" for s in manifest["shards"]),
        ):
            if (seed / rel).exists():
                (shutil.copyfile if copy else os.link)(seed / rel, d / rel)
        doc = dict(manifest, source_name=name, cache_id=datasetrt.format.layout.cache_id_for(name))
        (d / "manifest.json").write_text(json.dumps(doc))
        paths.append(d)
    return paths


# --------------------------------------------------------------------------------------------
# one configuration, in this fresh process


def run_one(peer: str, mode: str, workdir: Path, reads: int, workers: int) -> dict:
    """Open, filter, reweight, first sample, `reads` samples; tree memory after each step."""
    if peer == "dataset-rt":
        import dataset_rt as lib
    else:
        import datasetrt as lib
    import polars as pl
    import pyarrow

    pyarrow.array([0])  # pyarrow's one-off initialisation (~27 MiB here): before `base`, for both peers

    paths = sorted((workdir / "caches").iterdir())
    marks: dict[str, dict] = {}
    times: dict[str, float] = {}
    runtime = lib.DatasetRuntime(num_workers=workers)
    kwargs = {"sampling": mode if mode != "mixture" else "draws"} if peer == "datasetrt" else {}
    cfg = lib.ReaderConfig(seed=1, shuffle=True, **kwargs)
    marks["base"] = tree_memory()
    with PeakSampler() as peak:
        t0 = time.perf_counter()
        ds = runtime.cached_dataset(paths, reader_config=cfg)
        times["open"] = time.perf_counter() - t0
        marks["open"] = tree_memory()
        physical = ds.get_metadata()
        rows = physical.height
        df = physical.filter(pl.col("group") != 0)
        del physical  # the user keeps the active table only
        times["filter"] = time.perf_counter() - t0
        marks["filter"] = tree_memory()
        if mode == "permutation":
            weight = (pl.col("sample_id") % 2 + 1).cast(pl.Float64)
        elif mode == "mixture":
            weight = pl.lit(1.0)
        else:
            weight = (pl.col("sample_id") % 7 + 1).cast(pl.Float64) * 0.5
        df = df.with_columns(weight=weight)
        ds.update_metadata(df)
        if mode == "mixture":
            ds.set_mixture(lib.Mixture.by_column("group", {1: 0.5, 2: 0.5}))
        times["reweight"] = time.perf_counter() - t0
        marks["reweight"] = tree_memory()
        it = iter(ds)
        next(it)
        times["first"] = time.perf_counter() - t0
        marks["first"] = tree_memory()
        for _ in range(reads):
            next(it)
        times["read"] = time.perf_counter() - t0
        marks["read"] = tree_memory()
    active = df.height
    user_bytes = int(df.estimated_size())
    base, end = marks["base"], marks["read"]
    growth = end["anon"] + end["shmem"] - base["anon"] - base["shmem"]
    result = {
        "peer": peer,
        "mode": mode,
        "rows": rows,
        "active": active,
        "workers": workers,
        "times_s": times,
        "marks": marks,
        "peak_private": peak.peak_private - base["anon"] - base["shmem"],
        "peak_pss": peak.peak_pss,
        "user_bytes": user_bytes,
        "growth_private": growth,
        "growth_file": end["file"] - base["file"],
        "per_row_private": growth / active,
        "per_row_beyond_user": (growth - user_bytes) / active,
        "per_row_file": (end["file"] - base["file"]) / active,
    }
    del it
    runtime.close() if hasattr(runtime, "close") else None
    return result


# --------------------------------------------------------------------------------------------
# driver


def render(rows: list[dict]) -> str:
    lines = [
        "| peer | mode | rows | active | anon+shmem growth | per active row | user's columns | beyond user's | file-backed per row "
        "| open | +filter | +reweight | +first sample | peak anon+shmem growth | peak tree PSS |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(
                f"| {r['peer']} | {r['mode']} | {r['rows_asked']:,} | **failed**: {r['error'][:120]} |" + " |" * 11
            )
            continue
        t = r["times_s"]
        lines.append(
            f"| {r['peer']} | {r['mode']} | {r['rows']:,} | {r['active']:,} | {r['growth_private'] / MIB:,.0f} MiB "
            f"| {r['per_row_private']:.0f} B | {r['user_bytes'] / r['active']:.0f} B | {r['per_row_beyond_user']:.0f} B "
            f"| {r['per_row_file']:.0f} B | {t['open']:.2f} s | {t['filter']:.2f} s | {t['reweight']:.2f} s "
            f"| {t['first']:.2f} s | {r['peak_private'] / MIB:,.0f} MiB | {r['peak_pss'] / MIB:,.0f} MiB |"
        )
    return "\n".join(lines)


def render_slopes(rows: list[dict]) -> str:
    """Per-row cost between the smallest and the largest size of each peer and mode: the growth's
    difference over the active rows' difference, which cancels every fixed cost (interpreters,
    workers, ring, buffers)."""
    lines = [
        "| peer | mode | rows | anon+shmem per active row | beyond the user's table | file-backed per active row "
        "| worker anon+shmem (largest) |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        if "error" not in r:
            groups.setdefault((r["peer"], r["mode"]), []).append(r)
    for (peer, mode), rs in groups.items():
        if len(rs) < 2:
            continue
        lo, hi = min(rs, key=lambda r: r["active"]), max(rs, key=lambda r: r["active"])
        da = hi["active"] - lo["active"]
        grow = (hi["growth_private"] - lo["growth_private"]) / da
        beyond = grow - (hi["user_bytes"] - lo["user_bytes"]) / da
        file = (hi["growth_file"] - lo["growth_file"]) / da
        workers = [max(r["marks"]["read"]["per_process"][1:], default=0) for r in (lo, hi)]
        lines.append(
            f"| {peer} | {mode} | {lo['rows']:,} -> {hi['rows']:,} | {grow:.1f} B | {beyond:.1f} B | {file:.1f} B "
            f"| {workers[0] / MIB:.1f} -> {workers[1] / MIB:.1f} MiB |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, action="append", default=None, help="rows (repeatable; default 2*10^6)")
    parser.add_argument("--caches", type=int, default=50)
    parser.add_argument("--copy", action="store_true", help="copy the caches' files instead of hard links")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--reads", type=int, default=READS)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--out", type=Path, default=Path("bench-out/scale_rows.json"))
    parser.add_argument("--run", choices=PEERS, default=None, help="one configuration in this process")
    parser.add_argument("--mode", choices=MODES, default="draws")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    if args.run:
        print(json.dumps(run_one(args.run, args.mode, args.workdir, args.reads, args.workers)), flush=True)
        return
    results = []
    wall = time.perf_counter()
    for rows in args.rows or [2_000_000]:
        workdir = Path(tempfile.mkdtemp(prefix="datasetrt-bench-scale-rows-"))
        try:
            t = time.perf_counter()
            prepare(workdir, rows, args.caches, copy=args.copy)
            print(f"prepared {rows:,} rows in {args.caches} caches in {time.perf_counter() - t:.1f} s", flush=True)
            for mode in args.modes.split(","):
                for peer in args.peers.split(","):
                    if peer == "dataset-rt" and mode != "draws":
                        continue  # dataset-rt 0.4.8 has only dataset-rt's draws
                    cmd = ["-m", "benchmarks.scale_rows", "--run", peer, "--mode", mode]
                    cmd += ["--workdir", str(workdir), "--reads", str(args.reads), "--workers", str(args.workers)]
                    child = child_process(cmd, args.timeout)
                    if child.figures is None or child.returncode != 0:
                        r = {"peer": peer, "mode": mode, "rows_asked": rows, "error": child.tail()}
                    else:
                        r = child.figures
                    results.append(r)
                    print(render([r]).splitlines()[-1], flush=True)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"\nmachine: {machine_facts()}; wall {time.perf_counter() - wall:.0f} s")
    print(render(results))
    print()
    print(render_slopes(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": machine_facts(), "rows": results}, indent=1))


if __name__ == "__main__":
    main()
