"""End-to-end loader benchmark: datasetrt's `ds.to_torch_dataloader(...)` vs dataset-rt 0.4.8's
`to_torch_dataloader(...)` vs a plain `torch.utils.data.DataLoader` over a map-style dataset that
reads the same records from numpy memmap files, in one run, on the same records.

Workload: `count` records of 4 KiB (PayloadSource content, one cache written by datasetrt and read
by both libraries; the same payloads written to one raw `.bin` + `.npy` offsets for the plain
loader). Every contender uses batch_size=64, shuffle=False, the same sample transform (first
1 KiB of the payload as a float tensor) and the same stacking collate; `num_workers` K = 0, 1, 2,
start methods fork and spawn for K > 0; `persistent_workers` as each library defaults (datasetrt
and dataset-rt: True with workers; torch: False). The datasets are built on
`DatasetRuntime(num_workers=2)`, as a user of either library would.

Figures per contender and configuration, each measured in its own fresh subprocess (repeated
`--repeats` times, interleaved): samples/s of passes 2.. (median over passes and repeats; pass 1
reported apart), time to first batch (from before the loader is built: includes worker start-up),
loader construction time, and peak PSS of the process tree (benchmarks.common.PeakPss, from before
importing torch and the library). The measuring process runs torch with one intra-op thread (as
torch does in DataLoader workers): with the default two, collating and stacking in the main process
(K=0) swing 10-30x when other processes load the machine (OpenMP spin-waits). Every pass's batches are reduced to (cache_id, sample_id,
payload checksum) rows; the per-pass multiset must be the same for every contender (checked), and
whether the order equals datasetrt's is reported. A contender that fails (non-zero exit, timeout)
is recorded with its error text instead of figures.

Usage: python -m benchmarks.loader [--quick] [--repeats R] [--passes P] [--out bench-out/loader.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks.caches import PayloadSource, rt_lib
from benchmarks.common import DATASET_RT, Measurement, PeakPss, child_figures, machine_facts, save_json
from benchmarks.report import summarize

BATCH = 64
PAYLOAD = 4096
FEATURES = 1024
SEED = 11
RUNTIME_WORKERS = 2
DATASETRT = "datasetrt"
DATASETRT_INPROC = "datasetrt (runtime=None)"
PLAIN = "torch DataLoader + memmap"
CONFIGS = [(0, None), (1, "fork"), (1, "spawn"), (2, "fork"), (2, "spawn")]


# --------------------------------------------------------------------------------------------
# identical for every contender (module level: picklable by reference under spawn)


def transform(sample):
    """Payload -> fixed-size float tensor, plus the sample's identity."""
    import torch

    x = torch.frombuffer(bytearray(sample.data[:FEATURES]), dtype=torch.uint8).float()
    return x, sample.cache_id, sample.sample_id


def collate(items):
    import torch

    xs, cids, sids = zip(*items)
    return torch.stack(xs), torch.tensor(cids, dtype=torch.int64), torch.tensor(sids, dtype=torch.int64)


class Record:
    """What the plain loader hands the transform: the attributes a CachedSample has."""

    __slots__ = ("data", "cache_id", "sample_id")

    def __init__(self, data: bytes, cache_id: int, sample_id: int) -> None:
        self.data = data
        self.cache_id = cache_id
        self.sample_id = sample_id


class MemmapRecords:
    """Map-style dataset: record i is bytes(data[offsets[i]:offsets[i+1]]) of a raw uint8 memmap.
    Pickles as paths (each worker maps the files itself)."""

    def __init__(self, data_path: str, offsets_path: str, cache_id: int, sample_transform) -> None:
        import numpy as np

        self.data_path = data_path
        self.offsets_path = offsets_path
        self.cache_id = cache_id
        self.transform = sample_transform
        self._n = len(np.load(offsets_path, mmap_mode="r")) - 1
        self._data = self._offsets = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_data": None, "_offsets": None}

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int):
        if self._data is None:
            import numpy as np

            self._data = np.memmap(self.data_path, dtype=np.uint8, mode="r")
            self._offsets = np.load(self.offsets_path, mmap_mode="r")
        lo, hi = int(self._offsets[i]), int(self._offsets[i + 1])
        return self.transform(Record(bytes(self._data[lo:hi]), self.cache_id, i))


# --------------------------------------------------------------------------------------------
# one contender, one configuration, in a fresh process


def run_child(spec: dict) -> dict:
    """One contender and configuration in this fresh process: `passes` passes over its loader."""
    contender, workers, method, passes = spec["contender"], spec["workers"], spec["method"], spec["passes"]
    result: dict = {"pass_s": [], "pass_n": [], "ordered": [], "multiset": [], "head": []}
    with PeakPss() as pss:
        import numpy as np
        import torch

        torch.set_num_threads(1)  # as in DataLoader workers: OpenMP spin-waits on a busy 2-vCPU machine cost 30x
        from benchmarks import loader as mod  # transform/collate by their importable name, not __main__

        runtime = None
        if contender == PLAIN:
            from torch.utils.data import DataLoader

            records = mod.MemmapRecords(spec["data"], spec["offsets"], spec["cache_id"], mod.transform)
            start = time.perf_counter()
            dl = DataLoader(
                records,
                batch_size=BATCH,
                shuffle=False,
                num_workers=workers,
                collate_fn=mod.collate,
                multiprocessing_context=method if workers else None,
            )
        else:
            lib = rt_lib(contender)
            cfg = lib.ReaderConfig(seed=SEED, shuffle=False)
            t_open = time.perf_counter()
            if contender == DATASETRT_INPROC:
                ds = lib.CachedDataset([spec["cache"]], reader_config=cfg, runtime=None)
            else:
                runtime = lib.DatasetRuntime(num_workers=RUNTIME_WORKERS)
                ds = runtime.cached_dataset([spec["cache"]], reader_config=cfg)
            result["open_s"] = time.perf_counter() - t_open
            kwargs = {
                "shuffle": False,
                "batch_size": BATCH,
                "num_workers": workers,
                "sample_transform_fn": mod.transform,
                "collate_fn": mod.collate,
                "verbose": False,
            }
            if workers:
                kwargs["multiprocessing_context"] = method
            start = time.perf_counter()
            dl = ds.to_torch_dataloader(**kwargs)
        result["build_s"] = time.perf_counter() - start
        result["first_batch_s"] = None
        for _p in range(passes):
            rows = []
            t0 = time.perf_counter()
            for x, cid, sid in dl:
                if result["first_batch_s"] is None:
                    result["first_batch_s"] = time.perf_counter() - start
                rows.append(torch.stack([cid, sid, x.sum(1).to(torch.int64)], 1))
            result["pass_s"].append(time.perf_counter() - t0)
            arr = torch.cat(rows).numpy() if rows else np.zeros((0, 3), dtype=np.int64)
            result["pass_n"].append(len(arr))
            result["ordered"].append(hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest())
            srt = arr[np.lexsort((arr[:, 2], arr[:, 1], arr[:, 0]))]
            result["multiset"].append(hashlib.sha256(np.ascontiguousarray(srt).tobytes()).hexdigest())
            result["head"].append(arr[: 2 * BATCH : BATCH // 2, 1].tolist())  # a few sample ids, for the report
        t_close = time.perf_counter()
        del dl
        if runtime is not None and hasattr(runtime, "close"):
            runtime.close()
        result["teardown_s"] = time.perf_counter() - t_close
    result["peak_pss_mib"] = pss.peak / 2**20
    return result


# --------------------------------------------------------------------------------------------
# workload files


def write_workload(base: Path, count: int) -> tuple[Path, Path, Path, int]:
    import numpy as np

    import datasetrt

    rt = datasetrt.DatasetRuntime(num_workers=2)
    cfg = datasetrt.WriterConfig(show_progress=False, shard_compression=datasetrt.ShardCompression(algo="none"))
    [res] = rt.write_cache(
        [PayloadSource("bench", count, PAYLOAD, datasetrt.CacheInput)], base / "cache", writer_config=cfg
    )
    rt.close()
    assert isinstance(res, datasetrt.CacheWriteSuccess), res
    ds = datasetrt.CachedDataset(
        [res.path], reader_config=datasetrt.ReaderConfig(seed=SEED, shuffle=False), runtime=None
    )
    cache_id = next(iter(ds)).cache_id
    # the plain loader's files, written from the source itself (not from the cache)
    payloads = [p for p, _ in PayloadSource("bench", count, PAYLOAD, lambda data, meta: (data, meta))]
    offsets = np.zeros(count + 1, dtype=np.int64)
    np.cumsum([len(p) for p in payloads], out=offsets[1:])
    data_path, offsets_path = base / "payloads.bin", base / "offsets.npy"
    with open(data_path, "wb") as f:
        for p in payloads:
            f.write(p)
    np.save(offsets_path, offsets)
    return Path(res.path), data_path, offsets_path, int(cache_id)


# --------------------------------------------------------------------------------------------
# report


def _config_name(workers: int, method: str | None) -> str:
    return f"K={workers}" + (f" {method}" if method else "")


def _fmt_s(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1e3:,.0f} ms" if s < 10 else f"{s:,.1f} s"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def check_outputs(rows: list[dict], count: int) -> dict:
    """Per config: every successful run's per-pass multiset equal to datasetrt's (assert) and
    whether its order equals datasetrt's (reported)."""
    verdicts: dict = {}
    ok_rows = [r for r in rows if "error" not in r]
    for r in ok_rows:
        assert all(n == count for n in r["pass_n"]), (
            f"{r['config']} {r['contender']}: pass sizes {r['pass_n']} != {count}"
        )
    expected_multiset = None
    for r in ok_rows:
        for m in r["multiset"]:
            expected_multiset = expected_multiset or m
            assert m == expected_multiset, (
                f"{r['config']} {r['contender']}: a pass read a different multiset of samples"
            )
    for config in dict.fromkeys(r["config"] for r in rows):
        ref = next((r for r in ok_rows if r["config"] == config and r["contender"] == DATASETRT), None)
        for r in ok_rows:
            if r["config"] != config:
                continue
            same = None if ref is None else all(a == b for a, b in zip(r["ordered"], ref["ordered"]))
            key = f"{config} | {r['contender']}"
            prev = verdicts.get(key)
            verdicts[key] = same if prev is None else (prev and same)
    return verdicts


def render(summary: dict, verdicts: dict, contenders: list[str]) -> str:
    lines = [
        "| config | contender | samples/s (median) | min - max | pass 1 samples/s | first batch | loader build "
        "| peak tree PSS | datasetrt / contender: samples/s | first batch | PSS | same order as datasetrt |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for workers, method in CONFIGS:
        config = _config_name(workers, method)
        base = summary.get((config, DATASETRT))
        for contender in contenders:
            s = summary.get((config, contender))
            if s is None:
                continue
            if s["rate"] is None:
                lines.append(
                    f"| {config} | {contender} | **failed**: {'; '.join(dict.fromkeys(s['errors']))} "
                    "| | | | | | | | | |"
                )
                continue
            order = verdicts.get(f"{config} | {contender}")
            order_txt = "-" if contender == DATASETRT or order is None else ("yes" if order else "no")
            note = ""
            if s["errors"]:
                note += f" ({len(s['errors'])} of {len(s['errors']) + len(s['first_batch_s'])} runs failed: {s['errors'][0]})"
            if s["notes"]:
                note += f" ({len(s['notes'])} runs: {s['notes'][0]})"
            lines.append(
                f"| {config} | {contender}{note} | {s['rate']:,.0f} | {min(s['rates']):,.0f} - {max(s['rates']):,.0f} "
                f"| {s['first_pass_rate']:,.0f} | {_fmt_s(s['first_batch'])} | {_fmt_s(s['build'])} | {s['pss']:,.0f} MiB "
                f"| {_ratio(base and base['rate'], s['rate'])} | {_ratio(base and base['first_batch'], s['first_batch'])} "
                f"| {_ratio(base and base['pss'], s['pss'])} | {order_txt} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--count", type=int, default=None, help="records (default 20,000; 4,000 with --quick)")
    parser.add_argument("--repeats", type=int, default=None, help="fresh processes per contender and config")
    parser.add_argument("--passes", type=int, default=None, help="passes per process (the first is reported apart)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds before a contender run counts as failed")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=Path("bench-out/loader.json"))
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_child(json.loads(args.child))), flush=True)
        return
    count = args.count or (4_000 if args.quick else 20_000)
    repeats = args.repeats or (1 if args.quick else 3)
    passes = args.passes or (3 if args.quick else 4)
    timeout_s = args.timeout or (60.0 if args.quick else 240.0)
    contenders = [DATASETRT, DATASET_RT, PLAIN]
    wall = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="datasetrt-bench-loader-"))
    rows: list[dict] = []
    try:
        cache, data_path, offsets_path, cache_id = write_workload(workdir, count)
        for rep in range(repeats):
            for workers, method in CONFIGS:
                config = _config_name(workers, method)
                for contender in contenders + ([DATASETRT_INPROC] if workers == 0 else []):
                    spec = {
                        "contender": contender,
                        "workers": workers,
                        "method": method,
                        "passes": passes,
                        "cache": str(cache),
                        "data": str(data_path),
                        "offsets": str(offsets_path),
                        "cache_id": cache_id,
                    }
                    r = child_figures("benchmarks.loader", spec, timeout_s)
                    rows.append({"config": config, "contender": contender, "repeat": rep, **r})
                    if "error" in r:
                        print(f"[{rep}] {config:10} {contender:26} FAILED: {r['error']}", flush=True)
                    else:
                        rates = [n / t for n, t in zip(r["pass_n"], r["pass_s"])]
                        print(
                            f"[{rep}] {config:10} {contender:26} passes {' '.join(f'{x:,.0f}' for x in rates)} samples/s"
                            f"  first batch {_fmt_s(r['first_batch_s'])}  build {_fmt_s(r['build_s'])}"
                            f"  peak PSS {r['peak_pss_mib']:,.0f} MiB"
                            + (f"  [{r['exit_note']}]" if "exit_note" in r else ""),
                            flush=True,
                        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    verdicts = check_outputs(rows, count)
    summary = summarize(rows)
    wall = time.perf_counter() - wall
    all_contenders = [DATASETRT, DATASETRT_INPROC, DATASET_RT, PLAIN]
    print(
        f"\nmachine: {machine_facts()}; {count:,} x {PAYLOAD // 1024} KiB records, batch {BATCH}, shuffle=False, "
        f"{repeats} process(es) x {passes} passes per contender and config; wall {wall:.0f} s"
    )
    print("every pass of every successful run read the same multiset of (cache_id, sample_id, payload checksum): yes")
    print(render(summary, verdicts, all_contenders))
    measurements = [Measurement(c, k, "samples/s", s["rates"]) for (c, k), s in summary.items()]
    save_json(
        args.out,
        measurements,
        {
            "count": count,
            "payload_bytes": PAYLOAD,
            "batch": BATCH,
            "repeats": repeats,
            "passes": passes,
            "wall_s": wall,
            "same_multiset": True,
            "same_order_as_datasetrt": verdicts,
            "summary": [dict(s.items()) for s in summary.values()],
            "runs": rows,
        },
    )


if __name__ == "__main__":
    main()
