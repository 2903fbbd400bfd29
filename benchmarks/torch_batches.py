"""Torch end to end: int32[512] token records to `[256, 512]` int32 tensors through each
library's torch path with 2 torch workers, fork and spawn.

Boundary: measures and checks; knows the suite's workload dict (benchmarks.workloads.prepare) but
builds no store itself (except when run alone, through that function). Streaming / LitData rows need the `bench` extra; `to_torch_batches` is
measured only when `CachedDataset` has it (no placeholder row otherwise).

Contenders (each configuration in a fresh process, `torch.set_num_threads(1)` as in DataLoader
workers, batch 256, no shuffle, 2 torch workers with the given start method):
  datasetrt to_torch_dataloader   `ds.to_torch_dataloader(batch_size=256, num_workers=2,
                                  sample_transform_fn=<frombuffer int32>, collate_fn=<stack>)`
                                  on `DatasetRuntime(num_workers=2).cached_dataset(...)`: today's
                                  path, the baseline of the ">= 3x" target
  datasetrt to_torch_batches      `ds.to_torch_batches(256, num_workers=2,
                                  multiprocessing_context=...)`, the batch's "payload" tensor
  datasetrt to_torch_batches,     `ds.to_torch_batches(256, num_workers=0)` on
    reader workers                `DatasetRuntime(num_workers=2, start_method=...)`: no torch
                                  worker; the runtime's 2 reader processes gather each batch into
                                  a ring slot and the tensors are views of it (docs/pytorch.md,
                                  way 2). Its config's start method is the reader workers'.
  MosaicML Streaming              DataLoader(StreamingDataset(local=mds, batch_size=256)) over an MDS
                                  column `ndarray:int32:512` (benchmarks.stream_peers)
  LitData                         StreamingDataLoader(StreamingDataset(dir)) over numpy int32[512] items
Figures: samples/s over passes 2.. (pass 1 apart: it includes worker start-up and computes the
digests), time to first batch from before the dataset is opened (library imports excluded),
peak tree PSS. Every pass's tensors must be [n, 512] int32; pass 1's rows are digested and their
multiset must equal the written records' (ordered digest reported against datasetrt's).

Usage: python -m benchmarks.torch_batches (--smoke | --quick | --full) [--out bench-out/torch-batches.json]
(standalone: prepares its own int32[512] workload; benchmarks.run runs the same rows on its own).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks.common import Digest, PeakPss, child_figures, exit_on_different_bytes, machine_facts
from benchmarks.report import summarize, torch_table
from benchmarks.stream_peers import (
    import_library,
    install_streaming_package,
    litdata_loader,
    streaming_loader,
)
from benchmarks.suite import BATCH, LITDATA, SEED, STREAMING, TOKENS512, TTB, TTBR, TTD

install_streaming_package()  # a spawned DataLoader worker imports this module before unpickling a StreamingDataset

TORCH_WORKERS = 2
METHODS = {"smoke": ("fork",), "quick": ("fork", "spawn"), "full": ("fork", "spawn")}
PASSES = {"smoke": 1, "quick": 3, "full": 4}
REPEATS = {"smoke": 1, "quick": 1, "full": 2}
COUNTS = {"smoke": 1024, "quick": 8192, "full": 32768}


def token_transform(sample):
    """Today's per-sample user path: the payload as an int32 [512] tensor (one copy)."""
    import torch

    return torch.frombuffer(bytearray(sample.data), dtype=torch.int32)


def stack(items):
    import torch

    return torch.stack(items)


def has_to_torch_batches() -> bool:
    from datasetrt.dataset.cached import CachedDataset

    return hasattr(CachedDataset, "to_torch_batches")


def contenders(stream_peers: bool) -> list[str]:
    return [TTD] + ([TTB, TTBR] if has_to_torch_batches() else []) + ([STREAMING, LITDATA] if stream_peers else [])


def _loader(spec: dict):
    """(loader, batch -> [n, 512] int32 tensor, runtime or None) for one contender."""
    contender, method = spec["contender"], spec["method"]
    if contender == STREAMING:
        return streaming_loader(spec["store"], False, SEED, TORCH_WORKERS, method), (lambda b: b["data"]), None
    if contender == LITDATA:
        return litdata_loader(spec["store"], False, SEED, TORCH_WORKERS, method), (lambda b: b["data"]), None
    import datasetrt
    from benchmarks import torch_batches as mod  # transform/collate by importable name (spawn pickles them)

    runtime = datasetrt.DatasetRuntime(num_workers=2, start_method=method if contender == TTBR else None)
    ds = runtime.cached_dataset([spec["cache"]], reader_config=datasetrt.ReaderConfig(seed=SEED, shuffle=False))
    if contender == TTBR:
        dl = ds.to_torch_batches(BATCH, num_workers=0)
        return dl, (lambda b: b["payload"]), runtime
    if contender == TTB:
        dl = ds.to_torch_batches(BATCH, num_workers=TORCH_WORKERS, multiprocessing_context=method)
        return dl, (lambda b: b["payload"] if isinstance(b, dict) else b), runtime
    dl = ds.to_torch_dataloader(
        batch_size=BATCH,
        shuffle=False,
        num_workers=TORCH_WORKERS,
        sample_transform_fn=mod.token_transform,
        collate_fn=mod.stack,
        multiprocessing_context=method,
        verbose=False,
    )
    return dl, (lambda b: b), runtime


def run_child(spec: dict) -> dict:
    """One contender and start method in this fresh process: `passes` passes over the loader."""
    result: dict = {
        "pass_s": [],
        "pass_n": [],
        "digest": None,
        "multiset": None,
        "first_batch_s": None,
        "build_s": None,
    }
    with PeakPss() as pss:
        import numpy as np
        import torch

        torch.set_num_threads(1)
        if spec["contender"] in (STREAMING, LITDATA):
            import_library(spec["contender"])
        else:
            # `import datasetrt` is lazy (PEP 562): its API, pydantic and the torch integration
            # load at first use. Load them here, as `import litdata` / `streaming.base` load theirs,
            # so "library imports excluded" holds for every contender (~0.5 s here otherwise).
            import datasetrt.api
            import datasetrt.integrations.torch.batches  # noqa: F401  (the package is lazy: its modules too)
        start = time.perf_counter()
        dl, payload_of, runtime = _loader(spec)
        result["build_s"] = time.perf_counter() - start
        for p in range(spec["passes"]):
            d = Digest() if p == 0 else None
            n = 0
            t0 = time.perf_counter()
            for batch in dl:
                x = payload_of(batch)
                if result["first_batch_s"] is None:
                    result["first_batch_s"] = time.perf_counter() - start
                if x.dtype != torch.int32 or tuple(x.shape[1:]) != (512,):
                    raise TypeError(f"{spec['contender']}: batch {tuple(x.shape)} {x.dtype}, expected [n, 512] int32")
                n += len(x)
                if d is not None:
                    for row in np.ascontiguousarray(x.numpy()):
                        d.add(row)
            result["pass_s"].append(time.perf_counter() - t0)
            result["pass_n"].append(n)
            if d is not None:
                result.update({k: v for k, v in d.result().items() if k != "count"})
        del dl
        if runtime is not None:
            runtime.close()
    result["peak_pss_mib"] = pss.peak / 2**20
    return result


def bench(wl: dict, mode: str, stream_peers: bool, failures: list[str], timeout_s: float = 600) -> list[dict]:
    """Every contender x start method on a prepared int32[512] workload (benchmarks.workloads.prepare,
    raw codec); prints one line per run; byte mismatches go to `failures`."""
    rows: list[dict] = []
    for rep in range(REPEATS[mode]):
        for method in METHODS[mode]:
            for contender in contenders(stream_peers):
                store = wl["stores"].get((contender, "raw"), {})
                if contender in (STREAMING, LITDATA) and store.get("error"):
                    r = {"error": store["error"]}
                else:
                    spec = {
                        "contender": contender,
                        "method": method,
                        "passes": PASSES[mode],
                        "cache": wl["caches"]["none"],
                        "store": store.get("path"),
                    }
                    r = child_figures("benchmarks.torch_batches", spec, timeout_s)
                config = f"K={TORCH_WORKERS} {method}"
                row = {"config": config, "contender": contender, "repeat": rep, **r}
                if "error" not in r:
                    if r["multiset"] != wl["written"]["multiset"] or any(n != wl["count"] for n in r["pass_n"]):
                        row["check"] = "DIFFERENT BYTES"
                        failures.append(
                            f"torch {config} {contender}: multiset {r['multiset']} passes {r['pass_n']} "
                            f"vs written {wl['written']['multiset']}"
                        )
                    else:
                        row["check"] = (
                            "same bytes, same order"
                            if r["digest"] == wl["written"]["digest"]
                            else "same bytes (multiset)"
                        )
                rows.append(row)
                if "error" in r:
                    print(f"torch [{rep}] {config:12} {contender:32} FAILED: {r['error']}", flush=True)
                else:
                    rates = " ".join(f"{n / t:,.0f}" for n, t in zip(r["pass_n"], r["pass_s"]))
                    print(
                        f"torch [{rep}] {config:12} {contender:32} passes {rates} samples/s  first batch "
                        f"{r['first_batch_s'] * 1e3:,.0f} ms  PSS {r['peak_pss_mib']:,.0f} MiB  {row['check']}",
                        flush=True,
                    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group()
    for m in ("smoke", "quick", "full"):
        mode.add_argument(f"--{m}", action="store_const", const=m, dest="mode")
    parser.add_argument("--stream-peers", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--out", type=Path, default=Path("bench-out/torch-batches.json"))
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_child(json.loads(args.child))), flush=True)
        return
    from benchmarks.workloads import prepare

    mode = args.mode or "quick"
    stream_peers = mode != "smoke" if args.stream_peers is None else args.stream_peers
    workdir = Path(tempfile.mkdtemp(prefix="datasetrt-bench-torch-"))
    failures: list[str] = []
    started = time.perf_counter()
    try:
        wl = prepare(workdir, TOKENS512, "tok512", 2048, COUNTS[mode], ["none"], 2, stream_peers)
        rows = bench(wl, mode, stream_peers, failures)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(
        f"\nmachine: {machine_facts()}; {COUNTS[mode]:,} int32[512] records, batch {BATCH}, "
        f"wall {time.perf_counter() - started:.0f} s\n"
    )
    print(torch_table(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "machine": machine_facts(),
                "mode": mode,
                "rows": rows,
                "median_samples_per_s": {f"{c} | {k}": s["rate"] for (c, k), s in summarize(rows).items()},
            },
            indent=2,
        )
    )
    exit_on_different_bytes(failures)


if __name__ == "__main__":
    main()
