"""Token batches against the numpy memmap gather: shuffled `[256, 512]` int32 batches of one
uncompressed typed cache, read by datasetrt with reader workers and in-process, beside the
physical reference (`mm[order[s:s + 256]]` on an `[N, 512]` int32 memmap of the same payloads,
in datasetrt's order).

Boundary: a focused benchmark script; each measurement runs in a fresh child process that runs
this file by its path with PYTHONPATH set to the checkout under test (so that checkout's
`datasetrt` comes before the invoking checkout's and before any installed one); the child
reports the `datasetrt` it imported and the parent refuses a measurement of the wrong tree. Two
checkouts (before / after a change) are measured alternately in one run on the same files.

    python -m benchmarks.token_batches [--count 32768] [--rounds 5] [--repeats 3] [--workers 2]
        [--tree NAME=PATH ...]

Every child reads the whole shuffled window `repeats` times (the first one warms the page cache
and the workers and is not counted) and reports MiB/s per timed pass; the parent prints the
median over rounds per (tree, contender), its ratio to the gather's median and the load average.
Each datasetrt child checks its batches equal the memmap gather's rows (a digest of the first pass).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BATCH = 256
SEED = 11
ROW_INTS = 512


def _prepare(workdir: Path, count: int) -> dict:
    import numpy as np

    import datasetrt

    rng = np.random.default_rng(SEED)
    ids = ((rng.zipf(1.3, (count, ROW_INTS)) - 1) % 32000).astype("<i4")
    flat = workdir / "payloads.bin"
    ids.tofile(flat)

    class Source:
        name = "tokens"

        def __iter__(self):
            for row in ids:
                yield datasetrt.CacheInput(row.tobytes(), {"n": 0})

    cfg = datasetrt.WriterConfig(
        show_progress=False,
        shard_compression=datasetrt.ShardCompression(algo="none"),
        payload_spec=datasetrt.PayloadSpec("<i4", (ROW_INTS,)),
    )
    rt = datasetrt.DatasetRuntime(num_workers=1)
    try:
        [res] = rt.write_cache([Source()], workdir / "cache", writer_config=cfg)
        assert isinstance(res, datasetrt.CacheWriteSuccess), res
    finally:
        rt.close()
    ds = datasetrt.CachedDataset(
        [res.path], reader_config=datasetrt.ReaderConfig(seed=SEED, shuffle=True), runtime=None
    )
    order = np.fromiter((s.sample_id for s in ds), dtype=np.int64)
    np.save(workdir / "order.npy", order)
    return {"cache": str(res.path), "flat": str(flat), "order": str(workdir / "order.npy"), "count": count}


def _child(contender: str, spec: dict, repeats: int, workers: int) -> dict:
    import numpy as np

    order = np.load(spec["order"])
    rates: list[float] = []
    digest = None
    if contender == "gather":
        mm = np.memmap(spec["flat"], dtype="<i4", mode="r").reshape(spec["count"], ROW_INTS)

        def batches():
            for s in range(0, len(order), BATCH):
                yield mm[order[s : s + BATCH]]

        close = None
    else:
        import datasetrt

        cfg = datasetrt.ReaderConfig(seed=SEED, shuffle=True)
        if contender == "in-process":
            runtime = None
            ds = datasetrt.CachedDataset([spec["cache"]], reader_config=cfg, runtime=None)
        else:
            runtime = datasetrt.DatasetRuntime(num_workers=workers)
            ds = runtime.cached_dataset([spec["cache"]], reader_config=cfg)

        def batches():
            for b in ds.iter_batches(BATCH):
                yield b.to_numpy()

        close = runtime.close if runtime is not None else None
    try:
        for rep in range(repeats + 1):
            h = hashlib.blake2b() if rep == 0 else None
            nbytes = 0
            t0 = time.perf_counter()
            for arr in batches():
                nbytes += arr.nbytes
                if h is not None:
                    h.update(np.ascontiguousarray(arr).tobytes())
                del arr
            dt = time.perf_counter() - t0
            if h is not None:
                digest = h.hexdigest()
            else:
                rates.append(nbytes / dt / 2**20)
    finally:
        if close is not None:
            close()
    return {"rates": rates, "digest": digest, "imported": _imported_tree()}


def _imported_tree() -> str | None:
    """The checkout the child's `datasetrt` came from (None when the child never imported it)."""
    module = sys.modules.get("datasetrt")
    return str(Path(module.__file__).resolve().parent.parent) if module and module.__file__ else None


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=32768)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--tree", action="append", default=[], help="NAME=PATH of a checkout (default: this one)")
    ap.add_argument("--contenders", default="gather,workers,in-process")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        contender, spec = json.loads(args.child)
        print(json.dumps(_child(contender, spec, args.repeats, args.workers)))
        return
    here = str(Path(__file__).resolve().parent.parent)
    trees = [t.split("=", 1) for t in args.tree] or [["this", here]]
    contenders = args.contenders.split(",")
    with tempfile.TemporaryDirectory(prefix="drt-tokens-") as tmp:
        spec = _prepare(Path(tmp), args.count)
        results: dict[tuple[str, str], list[float]] = {}
        digests: dict[tuple[str, str], str] = {}
        loads = []
        for rnd in range(args.rounds):
            for name, path in trees if rnd % 2 == 0 else trees[::-1]:
                for contender in contenders:
                    if contender == "gather" and name != trees[0][0]:
                        continue  # one reference, measured with the first tree's rounds
                    env = {**os.environ, "PYTHONPATH": path}
                    child = json.dumps([contender, spec])
                    out = subprocess.run(
                        [
                            sys.executable,
                            str(Path(__file__).resolve()),
                            "--child",
                            child,
                            "--repeats",
                            str(args.repeats),
                            "--workers",
                            str(args.workers),
                        ],
                        env=env,
                        cwd=path,
                        capture_output=True,
                        text=True,
                        check=True,
                    )
                    r = json.loads(out.stdout.strip().splitlines()[-1])
                    if r["imported"] not in (None, str(Path(path).resolve())):
                        sys.exit(f"tree {name}: the child imported datasetrt from {r['imported']}, not {path}")
                    results.setdefault((name, contender), []).extend(r["rates"])
                    digests[(name, contender)] = r["digest"]
            loads.append(os.getloadavg()[0])
        ref = statistics.median(results[(trees[0][0], "gather")]) if (trees[0][0], "gather") in results else None
        gather_digest = digests.get((trees[0][0], "gather"))
        print(
            f"records {args.count} x {ROW_INTS} int32, batch {BATCH}, workers {args.workers}, "
            f"rounds {args.rounds} x {args.repeats} timed passes; load avg (1 min) per round: "
            + ", ".join(f"{x:.2f}" for x in loads)
        )
        for (name, contender), rates in results.items():
            ratio = f"{statistics.median(rates) / ref:.3f}x gather" if ref else ""
            same = "" if gather_digest is None or digests[(name, contender)] == gather_digest else "  DIGEST DIFFERS"
            print(
                f"{name:>8} {contender:<11} median {statistics.median(rates):8.1f} MiB/s  "
                f"(min {min(rates):.1f}, max {max(rates):.1f}, n={len(rates)})  {ratio}{same}"
            )
        differs = [key for key, d in digests.items() if gather_digest is not None and d != gather_digest]
        if differs:
            sys.exit(f"batches differ from the memmap gather's rows: {differs}")
        print("every contender's batches equal the memmap gather's rows")


if __name__ == "__main__":
    main()
