"""The suite's read section (parent side): which contenders read each row, one fresh child per
contender, and the byte checks that decide whether a row's figures count.

Every contender's payload bytes are checked equal to datasetrt's: the ordered digest where it
reproduces datasetrt's order, else the multiset (Streaming and LitData shuffle with their own
permutation: their shuffled rows are checked against the written records' multiset).

Boundary: launches children and compares their digests; the contenders themselves are in
benchmarks.cache_reads, benchmarks.peers and benchmarks.stream_peers.
"""

from __future__ import annotations

from benchmarks.common import median, new_result
from benchmarks.suite import (
    BATCHES,
    BATCHES_INPROC,
    GATHER,
    INPROC,
    LITDATA,
    LOADERX,
    MEMMAP_COPY,
    ORDER_FOLLOWERS,
    OURS,
    OWN_ORDER,
    PREAD,
    ROW,
    RT,
    SEED,
    STREAMING,
    TO_NUMPY,
    TORCH_MEMMAP,
    contender_child,
)


def read_contenders(kind: str, algo: str, stream_peers: bool) -> list[str]:
    """The read contenders of one row. Byte workloads: datasetrt per-sample and batches (reader
    workers and in-process), dataset-rt (not zstd), loaderx, torch over memmap and the two limits.
    int32[512]: datasetrt per-sample + np.stack, batches + reshape, `.to_numpy()` when SampleBatch
    has it, the in-process pair, loaderx Dense, the numpy memmap gather and the pread limit."""
    if kind == "tok512":
        from datasetrt.runtime.sample_batch import SampleBatch

        ours = [OURS, BATCHES] + ([TO_NUMPY] if hasattr(SampleBatch, "to_numpy") else []) + [INPROC, BATCHES_INPROC]
        peers = [LOADERX, GATHER, PREAD]
    else:
        ours = [OURS, BATCHES, INPROC, BATCHES_INPROC] + ([RT] if algo != "zstd" else [])
        peers = [LOADERX, TORCH_MEMMAP, MEMMAP_COPY, PREAD]
    return ours + peers + ([STREAMING, LITDATA] if stream_peers else [])


def check_read(
    results: dict[str, dict], shuffle: bool, written_multiset: str, workload: str, failures: list[str]
) -> dict:
    """Sets each result's "check" against datasetrt's bytes: the same ordered digest, else (for a
    contender that does not replay datasetrt's plan) the same multiset; Streaming and LitData on
    shuffled rows (their own permutation) against the multiset of the written records. Returns the
    contenders matched per kind of check."""
    ref = results[OURS]
    matched: dict[str, list[str]] = {"ordered": [], "multiset": [], "written multiset": []}
    for contender, r in results.items():
        if r.get("error"):
            r["check"] = "not compared"
            continue
        if r["digest"] == ref["digest"]:
            r["check"] = "same bytes, same order"
            matched["ordered"].append(contender)
        elif contender in OWN_ORDER and shuffle and r["multiset"] == written_multiset:
            r["check"] = "same bytes as written (multiset)"
            matched["written multiset"].append(contender)
        elif contender not in ORDER_FOLLOWERS and r["multiset"] == ref["multiset"]:
            r["check"] = "same bytes (multiset)"
            matched["multiset"].append(contender)
        else:
            r["check"] = "DIFFERENT BYTES"
            failures.append(
                f"{workload}: {contender} ordered {r['digest']} multiset {r['multiset']} "
                f"vs datasetrt {ref['digest']} {ref['multiset']}"
            )
        if r.get("note"):
            r["check"] += f"; {r['note']}"
    return matched


def read_one(wl: dict, spec: dict, contender: str, algo: str, codec: str) -> dict:
    """One contender's figures on one row (its child), or the row's error when its store is missing."""
    store = wl["stores"].get((contender, codec), {})
    if contender == LOADERX and spec["loaderx"] is None:
        return {
            **new_result(),
            "error": f"store build failed: {wl['loaderx_errors'].get(codec)}",
            "peak_pss_mib": None,
        }
    if contender in OWN_ORDER and store.get("error"):
        return {**new_result(), "error": store["error"], "peak_pss_mib": None}
    r = contender_child({**spec, "contender": contender, "store": store.get("path")}, timeout=600)
    if contender == LOADERX and algo == "lz4" and not r.get("error"):
        r["note"] = f"{r.get('note', '')}; store codec {codec} (loaderx has no {algo})".lstrip("; ")
    if contender in OWN_ORDER and algo == "lz4" and not r.get("error"):
        r["note"] = f"{r.get('note', '')}; store codec zstd (lz4 rows read the zstd store)"
    return r


def bench_reads(
    wl: dict,
    name: str,
    kind: str,
    count: int,
    algos: list[str],
    stream_peers: bool,
    workers: int,
    repeats: int,
    failures: list[str],
) -> list[dict]:
    """Every read row of one prepared workload (benchmarks.workloads.prepare): each codec, ordered
    and shuffled, each contender in a fresh child; prints a line per contender and the row's byte
    check; mismatches go to `failures`."""
    rows = []
    for algo in algos:
        codec = "raw" if algo == "none" else "zstd"
        for shuffle in (False, True):
            workload = f"{name} x {count} {algo} {'shuffled' if shuffle else 'ordered'}"
            spec = {
                "cache": wl["caches"][algo],
                "flat": wl["flat"],
                "loaderx": wl["loaderx"].get(codec),
                "fixed": wl["fixed_size"] is not None,
                "shuffle": shuffle,
                "typed": wl["typed"],
                "dtype": wl["dtype"],
                "row_shape": ROW["shape"],
                "order": wl["orders"][algo] if shuffle else None,
                "repeats": repeats,
                "workers": workers,
                "seed": SEED,
            }
            results = {c: read_one(wl, spec, c, algo, codec) for c in read_contenders(kind, algo, stream_peers)}
            matched = check_read(results, shuffle, wl["written"]["multiset"], workload, failures)
            for contender, r in results.items():
                rows.append(
                    {
                        "workload": workload,
                        "base": name,
                        "algo": algo,
                        "contender": contender,
                        **{k: v for k, v in r.items() if k not in ("traceback",)},
                    }
                )
                if r.get("error"):
                    print(
                        f"{workload:34} {contender:27} {'n/a' if r['error'].startswith('no shuffle') else 'ERROR'} {r['error']}",
                        flush=True,
                    )
                else:
                    print(
                        f"{workload:34} {contender:27} {median(r['rates']):>11,.0f} samples/s {median(r['mib']):>8,.0f} MiB/s"
                        f"  first {(r['first_sample_s'] or 0) * 1e3:7.1f} ms  PSS {r['peak_pss_mib'] or 0:5.0f} MiB  {r['check']}",
                        flush=True,
                    )
            print(
                f"same bytes: {workload}: ordered digest {', '.join(matched['ordered'])}"
                + (f"; multiset {', '.join(matched['multiset'])}" if matched["multiset"] else "")
                + (
                    f"; written multiset {', '.join(matched['written multiset'])}"
                    if matched["written multiset"]
                    else ""
                ),
                flush=True,
            )
    return rows
