"""Object storage: reading one dataset from a real S3 server (moto's), datasetrt beside MosaicML
Streaming and LitData, cold (an empty node cache) and warm (the second epoch), with the raw GET
rate of the same objects as the physical floor.

Usage: python -m benchmarks.remote [--quick | --smoke] [--repeats R] [--peer-python PY]
                                   [--transports https,http] [--no-peers] [--profile FILE]
                                   [--out bench-out/remote.json] [--report bench-out/remote.json]

Data (benchmarks.remote_records): N records of 16 KiB seeded random bytes (the first 8 bytes are
the record's index) and an int label; full 16,384 records (256 MiB, 16 MiB shards), --quick 3,072
(48 MiB, 8 MiB shards), --smoke 512 (8 MiB, 1 MiB shards; datasetrt and the floor only, one
repeat, seconds). Each tool writes its own store of those records with shards of the same size:
datasetrt `DatasetRuntime.write_cache(..., "s3://bench/drt", writer_config=WriterConfig(storage=
StorageConfig(options=...)))`, Streaming MDS and LitData optimized chunks uploaded with boto3
(benchmarks.remote_peers).

Servers (benchmarks.remote_servers): moto's server (tests/servers/moto.py) behind the tests'
FaultProxy, which counts requests and body bytes per contender; for https a TLS front (a
throw-away CA made for the run, trusted through SSL_CERT_FILE / AWS_CA_BUNDLE) before the proxy.
Everything on loopback. LitData's chunk reads (obstore) refuse plain http, so the comparison of
all three is over https; datasetrt and Streaming are also read over http.

Contenders, each run in a fresh child process per repeat with a fresh local cache directory:
  datasetrt              CachedDataset(["s3://bench/drt/<cache>"], reader_config=ReaderConfig(
                         sampling="locality", window_shards=8, shuffle=True, seed=SEED,
                         storage=StorageConfig(options=..., cache_dir=<fresh>)), runtime=None or
                         DatasetRuntime(num_workers=2)), iter_batches(256) with the label column
  MosaicML Streaming     StreamingDataset(remote=..., local=<fresh>, shuffle=True, batch_size=256)
                         in a torch DataLoader(batch_size=256, num_workers=0 or 2)
  LitData                litdata.StreamingDataset("s3://...", cache_dir=<fresh>, shuffle=True,
                         storage_options={"endpoint_url": ...}) in StreamingDataLoader(256, 0 or 2)
  GET floor              obstore GETs of datasetrt's shard objects into memory through the same
                         proxy (1 and 4 in flight), no disk, no decoding
The peers run in their own venv (--peer-python, default /tmp/peervenv/bin/python, see
docs/benchmarks.md); without it their rows say "skipped: <reason>".

Figures per contender (medians over the repeats, min-max beside): cold epoch (construction of the
dataset, its index fetch included, to the last batch) in MiB/s and samples/s, its first batch,
the warm epoch (the same loader's second pass), requests and body bytes the proxy served during
the cold and the warm epoch, the most GETs of any one object, the local disk the cache dir holds
afterwards, peak PSS of the child's process tree (workers and helpers included, sampled from
here), and ratios to datasetrt in the same run. Every timed pass is checked (every record exactly
once, labels, a payload checksum; benchmarks.remote_records.Tally) and the first repeat of each
contender digests every payload on an extra untimed pass; a mismatch is printed and exits 1.
No speed is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

from benchmarks.common import ROOT, Digest, child_process, machine_facts

SEED = 11
BATCH = 256
RECORD = 16 << 10
WORKERS = 2
BUCKET = "bench"
MODES = {  # records, shard bytes, default cold repeats
    "full": (16384, 16 << 20, 3),
    "quick": (3072, 8 << 20, 3),
    "smoke": (512, 1 << 20, 1),
}
OURS = "datasetrt"
STREAMING = "MosaicML Streaming"
LITDATA = "LitData"
FLOOR = "GET floor (obstore)"
PREFIX = {OURS: "drt", STREAMING: "mds", LITDATA: "lit"}
DEFAULT_PEER_PYTHON = os.environ.get("DATASETRT_BENCH_PEER_PYTHON", "/tmp/peervenv/bin/python")
CHILD_TIMEOUT_S = 900.0


# ---------------------------------------------------------------------------- children (main venv)


def s3_options(endpoint: str) -> dict:
    from tests.servers.moto import s3_options as options

    return options(endpoint)


def child_write(spec: dict) -> dict:
    """datasetrt writes the records as one cache under s3://bench/drt (through the proxy)."""
    import datasetrt as drt
    from benchmarks.remote_records import read_records

    rows = read_records(spec["records"], spec["size"])

    class Records:
        name = "records"

        def __iter__(self):
            for i in range(len(rows)):
                yield drt.CacheInput(rows[i].tobytes(), {"label": i % 1000})

    storage = drt.StorageConfig(options=spec["options"], cache_dir=spec["cache_dir"])
    cfg = drt.WriterConfig(show_progress=False, max_shard_bytes=spec["shard_bytes"], storage=storage)
    t0 = time.perf_counter()
    with drt.DatasetRuntime(num_workers=WORKERS) as rt:
        [result] = rt.write_cache([Records()], f"s3://{BUCKET}/{PREFIX[OURS]}", writer_config=cfg)
    if not isinstance(result, drt.CacheWriteSuccess):
        return {"error": f"write_cache: {result}"}
    return {"url": str(result.path), "write_s": time.perf_counter() - t0}


def child_read(spec: dict) -> dict:
    """datasetrt's cold epoch (construction to last batch), warm epoch, optional digest pass."""
    import numpy as np

    import datasetrt as drt
    from benchmarks.remote_records import Tally

    size = spec["size"]
    storage = drt.StorageConfig(options=spec["options"], cache_dir=spec["cache_dir"])
    cfg = drt.ReaderConfig(seed=SEED, shuffle=True, sampling="locality", window_shards=8, storage=storage)
    # The metadata stack a label column needs is imported before the clock, as every contender's
    # libraries are: polars, pyarrow, and pandas, which pyarrow imports on its first pa.array()
    # when it is installed (0.5-0.8 s on datasetrt's first batch here otherwise).
    import polars  # noqa: F401
    import pyarrow

    pyarrow.array([0])

    result: dict = {"passes": {}, "problems": []}
    profiler = None
    if spec.get("profile"):
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    t_open = time.time()
    start = time.perf_counter()
    runtime = drt.DatasetRuntime(num_workers=spec["workers"]) if spec["workers"] else None
    ds = drt.CachedDataset([spec["url"]], reader_config=cfg, runtime=runtime)
    result["open_s"] = time.perf_counter() - start
    for name in ("cold", "warm"):
        tally = Tally(spec["expect"])
        wall0 = t_open if name == "cold" else time.time()
        t0 = start if name == "cold" else time.perf_counter()
        first = None
        for b in ds.iter_batches(BATCH):
            if first is None:
                first = time.perf_counter() - t0
            rows = np.frombuffer(b.data, dtype=np.uint8).reshape(len(b), size)
            tally.add_rows(rows, b.columns(["label"])["label"])
            del rows, b
        dt = time.perf_counter() - t0
        if profiler is not None and name == "cold":
            profiler.disable()
            profiler.dump_stats(spec["profile"])
            profiler = None
        result["passes"][name] = {
            "s": dt,
            "first_batch_s": first,
            "samples": tally.samples,
            "bytes": tally.bytes,
            "wall": [wall0, time.time()],
            "order_head": tally.order_head(),
        }
        result["problems"] += [f"{name}: {p}" for p in tally.problems()]
    if spec.get("verify"):
        d = Digest()
        for b in ds.iter_batches(BATCH, with_metadata=False):
            for i in range(len(b)):
                d.add(b.payload(i))
            del b
        result.update(d.result())
    ds.close()
    if runtime is not None:
        runtime.close()
    return result


def child_floor(spec: dict) -> dict:
    """GET every named object into memory, `concurrency` at a time, `repeats` times: MiB/s each."""
    from concurrent.futures import ThreadPoolExecutor

    import obstore as obs
    from obstore.store import S3Store

    opts = dict(spec["options"])
    endpoint = opts.pop("endpoint")
    client = {"allow_http": bool(opts.pop("allow_http", False))}
    store = S3Store(
        BUCKET,
        endpoint=endpoint,
        region=opts["region"],
        access_key_id=opts["access_key_id"],
        secret_access_key=opts["secret_access_key"],
        client_options=client,
    )
    keys = spec["keys"]

    def get(key: str) -> int:
        return len(obs.get(store, key).bytes())

    rates = []
    for _ in range(spec["repeats"]):
        t0 = time.perf_counter()
        with ThreadPoolExecutor(spec["concurrency"]) as pool:
            total = sum(pool.map(get, keys))
        rates.append(total / 2**20 / (time.perf_counter() - t0))
    return {"rates": rates, "bytes": total, "gets": len(keys)}


def run_child(spec: dict) -> None:
    os.environ.update(spec.get("env", {}))
    task = spec["task"]
    try:
        figures = {"write": child_write, "read": child_read, "floor": child_floor}[task](spec)
    except Exception as exc:  # reported as the row's error (datasetrt's errors are findings too)
        import traceback

        figures = {"error": f"{type(exc).__name__}: {exc}"[:2000], "traceback": traceback.format_exc()[-4000:]}
    print(json.dumps(figures), flush=True)


# ---------------------------------------------------------------------------- orchestration


def launch(spec: dict, python: str | None = None, peak_pss: bool = False) -> dict:
    """One child (`benchmarks.remote` in this venv, `benchmarks.remote_peers` in the peers' venv)."""
    module = "benchmarks.remote_peers" if python else "benchmarks.remote"
    child = child_process(
        ["-m", module, "--child", json.dumps(spec)], timeout_s=CHILD_TIMEOUT_S, peak_pss=peak_pss, python=python
    )
    failure = child.failure()
    figures = child.figures or {}
    if failure and not figures.get("error"):
        figures["error"] = failure
    if child.peak_pss_bytes is not None:
        figures["peak_pss_mib"] = child.peak_pss_bytes / 2**20
    return figures


def list_objects(endpoint: str, prefix: str) -> list[tuple[str, int]]:
    """(key, size) of every object under `prefix` (unsigned ListObjectsV2 straight to moto)."""
    out: list[tuple[str, int]] = []
    token = None
    ns = "{http://s3.amazonaws.com/doc/2006-03-01/}"
    while True:
        q = f"list-type=2&prefix={urllib.request.quote(prefix + '/')}"
        if token:
            q += f"&continuation-token={urllib.request.quote(token)}"
        with urllib.request.urlopen(f"{endpoint}/{BUCKET}?{q}", timeout=60) as r:
            root = ET.fromstring(r.read())
        for c in root.iter(f"{ns}Contents"):
            out.append((c.findtext(f"{ns}Key"), int(c.findtext(f"{ns}Size"))))
        token = root.findtext(f"{ns}NextContinuationToken")
        if not token:
            return out


def disk_bytes(path: Path) -> int:
    """Bytes the files under `path` occupy on disk (st_blocks)."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def peers_missing(python: str) -> dict[str, str]:
    """{peer: reason} for the peers that cannot run from the interpreter `python`."""
    import subprocess

    if not Path(python).exists():
        reason = f"no peer venv at {python} (see docs/benchmarks.md, 'Object storage')"
        return {STREAMING: reason, LITDATA: reason}
    out = subprocess.run(
        [
            python,
            "-c",
            "import importlib.util as u, json; print(json.dumps({m: bool(u.find_spec(m)) "
            "for m in ('streaming', 'litdata', 'torch', 'boto3', 'numpy')}))",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if out.returncode != 0:
        reason = f"{python} does not run: {out.stderr.strip()[-200:]}"
        return {STREAMING: reason, LITDATA: reason}
    have = json.loads(out.stdout.strip().splitlines()[-1])
    missing = {}
    for peer, module in ((STREAMING, "streaming"), (LITDATA, "litdata")):
        lack = [m for m in (module, "torch", "boto3", "numpy") if not have.get(m)]
        if lack:
            missing[peer] = f"{', '.join(lack)} not installed in {python}"
    return missing


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_const", const="quick", dest="mode")
    mode.add_argument("--smoke", action="store_const", const="smoke", dest="mode", help="tiny data, datasetrt only")
    parser.add_argument("--repeats", type=int, default=None, help="cold repeats per contender (default 3; smoke 1)")
    parser.add_argument("--peer-python", default=DEFAULT_PEER_PYTHON, help="the peers' venv interpreter")
    parser.add_argument("--no-peers", action="store_true", help="datasetrt and the floor only")
    parser.add_argument("--transports", default=None, help="comma list of https,http (default both; smoke: http)")
    parser.add_argument("--profile", type=Path, default=None, help="cProfile datasetrt's first cold in-process epoch")
    parser.add_argument("--out", type=Path, default=Path("bench-out/remote.json"))
    parser.add_argument("--report", type=Path, default=None, help="print the table of a saved run's JSON")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.mode = args.mode or "full"
    if args.transports is None:
        args.transports = "http" if args.mode == "smoke" else "https,http"
    args.transport_list = [t for t in args.transports.split(",") if t]
    if set(args.transport_list) - {"http", "https"}:
        parser.error("--transports: https and/or http")
    return args


def med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def bench(args: argparse.Namespace) -> tuple[list[dict], list[dict], dict, list[str]]:
    from benchmarks.remote_records import read_records, write_records
    from benchmarks.remote_servers import CountingProxy, TLSFront, make_ca, summarize
    from tests.servers.moto import FAKE_ACCESS_KEY_ID, FAKE_SECRET_ACCESS_KEY, REGION, MotoServer

    count, shard_bytes, default_repeats = MODES[args.mode]
    repeats = args.repeats or default_repeats
    if args.no_peers or args.mode == "smoke":
        reason = "--no-peers" if args.no_peers else "--smoke reads datasetrt and the floor only"
        peers_skip = {STREAMING: reason, LITDATA: reason}
    else:
        peers_skip = peers_missing(args.peer_python)
    workdir = Path(tempfile.mkdtemp(prefix="datasetrt-bench-remote-"))
    failures: list[str] = []
    rows: list[dict] = []
    floors: list[dict] = []
    facts: dict = {"mode": args.mode, "records": count, "record_bytes": RECORD, "shard_bytes": shard_bytes}
    try:
        records = workdir / "records.bin"
        expect = write_records(records, count, RECORD, SEED)
        written = Digest.of(read_records(str(records), RECORD))
        ca, cert, key = make_ca(workdir / "tls")
        env_base = {"AWS_EC2_METADATA_DISABLED": "true"}
        for name in list(os.environ):
            if name.startswith(("AWS_", "S3_ENDPOINT", "SSL_CERT")):
                del os.environ[name]  # children must reach only the servers started here
        with (
            MotoServer() as moto,
            CountingProxy(moto.endpoint) as proxy,
            TLSFront(proxy.port, cert, key) as tls,
        ):
            moto.create_bucket(BUCKET)
            endpoints = {"http": proxy.endpoint, "https": tls.endpoint}

            def options(transport: str) -> dict:
                opts = s3_options(endpoints[transport])
                if transport == "https":
                    opts.pop("allow_http")
                return opts

            def env_of(transport: str) -> dict:
                env = {
                    **env_base,
                    "AWS_ACCESS_KEY_ID": FAKE_ACCESS_KEY_ID,
                    "AWS_SECRET_ACCESS_KEY": FAKE_SECRET_ACCESS_KEY,
                    "AWS_DEFAULT_REGION": REGION,
                    "AWS_REGION": REGION,
                    "S3_ENDPOINT_URL": endpoints[transport],
                }
                if transport == "https":
                    env |= {"SSL_CERT_FILE": str(ca), "AWS_CA_BUNDLE": str(ca), "REQUESTS_CA_BUNDLE": str(ca)}
                return env

            # -- stores
            t0 = time.perf_counter()
            wrote = launch(
                {
                    "task": "write",
                    "records": str(records),
                    "size": RECORD,
                    "shard_bytes": shard_bytes,
                    "options": options("http"),
                    "cache_dir": str(workdir / "write-staging"),
                    "env": env_of("http"),
                }
            )
            if wrote.get("error"):
                raise RuntimeError(
                    f"datasetrt could not write its cache: {wrote['error']}\n{wrote.get('traceback', '')}"
                )
            write_served = summarize(proxy.served)
            proxy.forget()
            facts["datasetrt_write"] = {**wrote, "served": write_served, "s": time.perf_counter() - t0}
            url = wrote["url"]
            stores: dict[str, dict] = {
                OURS: {"prefix": url.split(f"s3://{BUCKET}/", 1)[1]},
            }
            for peer in (STREAMING, LITDATA):
                if peer in peers_skip:
                    continue
                built = launch(
                    {
                        "task": "build",
                        "contender": peer,
                        "records": str(records),
                        "size": RECORD,
                        "count": count,
                        "shard_bytes": shard_bytes,
                        "out": str(workdir / f"build-{PREFIX[peer]}"),
                        "upload_endpoint": moto.endpoint,
                        "bucket": BUCKET,
                        "prefix": PREFIX[peer],
                        "env": env_of("http"),
                    },
                    python=args.peer_python,
                )
                shutil.rmtree(workdir / f"build-{PREFIX[peer]}", ignore_errors=True)
                if built.get("error"):
                    peers_skip[peer] = f"build failed: {built['error']}"
                    continue
                stores[peer] = {"prefix": PREFIX[peer], "build": built}
            for store in stores.values():
                objs = list_objects(moto.endpoint, store["prefix"])
                store["objects"] = len(objs)
                store["stored_bytes"] = sum(s for _, s in objs)
                store["keys"] = [k for k, s in objs]
            facts["stores"] = {k: {kk: vv for kk, vv in v.items() if kk != "keys"} for k, v in stores.items()}
            shard_keys = [k for k in stores[OURS]["keys"] if "/shards/" in k]

            # -- the physical floor
            for transport in args.transport_list:
                for conc in (1, 4):
                    got = launch(
                        {
                            "task": "floor",
                            "options": options(transport),
                            "keys": shard_keys,
                            "concurrency": conc,
                            "repeats": max(3, repeats),
                            "env": env_of(transport),
                        }
                    )
                    floors.append({"transport": transport, "concurrency": conc, **got})
                    proxy.forget()

            # -- reads
            profile_left = args.profile
            for transport in args.transport_list:
                for contender in (OURS, STREAMING, LITDATA):
                    for workers in (0, WORKERS):
                        where = "in-process" if workers == 0 else f"{workers} workers"
                        row = {"transport": transport, "contender": contender, "where": where, "runs": []}
                        rows.append(row)
                        if contender in peers_skip:
                            row["skipped"] = peers_skip[contender]
                            continue
                        if contender == LITDATA and transport == "http":
                            row["skipped"] = "LitData's chunk reads (obstore) need https"
                            continue
                        for rep in range(repeats):
                            cache_dir = workdir / f"cache-{PREFIX[contender]}-{transport}-{workers}-{rep}"
                            spec = {
                                "task": "read",
                                "contender": contender,
                                "bucket": BUCKET,
                                "prefix": stores[contender]["prefix"],
                                "url": url,
                                "endpoint": endpoints[transport],
                                "options": options(transport),
                                "env": env_of(transport),
                                "cache_dir": str(cache_dir),
                                "workers": workers,
                                "batch": BATCH,
                                "seed": SEED,
                                "size": RECORD,
                                "expect": expect,
                                "verify": rep == 0,
                            }
                            if contender == OURS and workers == 0 and profile_left is not None:
                                spec["profile"] = str(profile_left)
                                profile_left = None
                            proxy.forget()
                            got = launch(spec, python=None if contender == OURS else args.peer_python, peak_pss=True)
                            got["disk_bytes"] = disk_bytes(cache_dir)
                            shutil.rmtree(cache_dir, ignore_errors=True)
                            prefix = stores[contender]["prefix"] + "/"
                            for p in got.get("passes", {}).values():
                                p["served"] = summarize(proxy.between(p["wall"][0], p["wall"][1], prefix))
                            got["served_all"] = summarize(proxy.between(0, time.time() + 1, prefix))
                            row["runs"].append(got)
                            label = f"{contender}, {where}, {transport}, repeat {rep}"
                            if got.get("error"):
                                # datasetrt failing is a broken run; a peer's failure is its row's finding
                                (failures if contender == OURS else row.setdefault("errors", [])).append(
                                    f"{label}: {got['error']}"
                                )
                                print(f"  {label}: ERROR {got['error'][:300]}", flush=True)
                                if got.get("traceback"):
                                    print(got["traceback"], flush=True)
                                break
                            for p in got.get("problems", []):
                                failures.append(f"{label}: {p}")
                            if rep == 0 and got.get("multiset") != written["multiset"]:
                                failures.append(f"{label}: payload digest differs from the written records")
                            c = got["passes"]["cold"]
                            print(
                                f"  {label}: cold {c['bytes'] / 2**20 / c['s']:.1f} MiB/s, warm "
                                f"{got['passes']['warm']['bytes'] / 2**20 / got['passes']['warm']['s']:.1f} MiB/s, "
                                f"served {c['served']['bytes'] / 2**20:.1f} MiB in {c['served']['gets']} GETs",
                                flush=True,
                            )
        facts["expect"] = expect
        facts["stored_dataset_bytes"] = count * RECORD
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return rows, floors, facts, failures


# ---------------------------------------------------------------------------- report


def summarize_row(row: dict) -> dict:
    """Medians (and min-max) of a row's runs."""
    runs = [r for r in row["runs"] if not r.get("error")]
    out: dict = {}
    if not runs:
        return out

    def per_run(name: str, fn) -> list[float]:
        return [fn(r["passes"][name]) for r in runs]

    for name in ("cold", "warm"):
        xs = per_run(name, lambda p: p["bytes"] / 2**20 / p["s"])
        out[f"{name}_mib_s"] = med(xs)
        out[f"{name}_range"] = (min(xs), max(xs))
        out[f"{name}_samples_s"] = med(per_run(name, lambda p: p["samples"] / p["s"]))
        out[f"{name}_served_mib"] = med(per_run(name, lambda p: p["served"]["bytes"] / 2**20))
        out[f"{name}_gets"] = med(per_run(name, lambda p: p["served"]["gets"]))
        out[f"{name}_ranged"] = med(per_run(name, lambda p: p["served"]["ranged_gets"]))
        out[f"{name}_requests"] = max(per_run(name, lambda p: p["served"]["requests"]))
        out[f"{name}_in_flight"] = max(per_run(name, lambda p: p["served"].get("peak_gets_in_flight", 0)))
    out["first_batch_s"] = med([r["passes"]["cold"]["first_batch_s"] or 0.0 for r in runs])
    out["open_s"] = med([r["open_s"] for r in runs])
    out["served_max_mib"] = max(r["passes"]["cold"]["served"]["bytes"] / 2**20 for r in runs)
    out["errors"] = max(r["served_all"]["errors"] for r in runs)
    out["disk_mib"] = med([r["disk_bytes"] / 2**20 for r in runs])
    out["pss_mib"] = med([r["peak_pss_mib"] for r in runs if r.get("peak_pss_mib") is not None])
    out["repeats"] = len(runs)
    return out


def fmt(x, spec: str = ".0f") -> str:
    return "" if x is None else format(x, spec)


COLUMNS = (
    "transport",
    "contender",
    "where",
    "cold MiB/s (min-max)",
    "cold samples/s",
    "first batch s",
    "warm MiB/s",
    "cold served MiB (max) / stored",
    "cold GETs (ranged) / most in flight",
    "warm requests",
    "local disk MiB",
    "peak PSS MiB",
    "cold, x datasetrt",
    "warm, x datasetrt",
)


def table(rows: list[dict], floors: list[dict], facts: dict) -> str:
    """Markdown: one line per (transport, contender, where), then the GET floors. The ratios are
    the contender's median over datasetrt's in the same transport and place (>1: faster)."""
    stored = {k: v["stored_bytes"] / 2**20 for k, v in facts.get("stores", {}).items()}
    lines = ["| " + " | ".join(COLUMNS) + " |", "|---|---|---|" + "---:|" * (len(COLUMNS) - 3)]
    empty = " |" * (len(COLUMNS) - 4)
    base: dict[tuple[str, str], dict] = {}
    for row in rows:
        row["summary"] = summarize_row(row)
        if row["contender"] == OURS and row["summary"]:
            base[(row["transport"], row["where"])] = row["summary"]
    for row in rows:
        s = row["summary"]
        head = f"| {row['transport']} | {row['contender']} | {row['where']} |"
        if row.get("skipped"):
            lines.append(f"{head} skipped: {row['skipped']} |{empty}")
            continue
        if not s:
            err = next((r.get("error") for r in row["runs"] if r.get("error")), "no run")
            lines.append(f"{head} error: {str(err)[:160]} |{empty}")
            continue
        failed = len(row["runs"]) - s["repeats"]
        if failed:
            head = f"| {row['transport']} | {row['contender']} | {row['where']} ({failed} of {len(row['runs'])} runs failed) |"
        b = base.get((row["transport"], row["where"]))
        lo, hi = s["cold_range"]
        st = stored.get(row["contender"], 0.0)
        lines.append(
            f"{head} {s['cold_mib_s']:.1f} ({lo:.1f}-{hi:.1f}) | {s['cold_samples_s']:,.0f} | {s['first_batch_s']:.2f} |"
            f" {s['warm_mib_s']:,.0f} | {s['cold_served_mib']:.1f} ({s['served_max_mib']:.1f}) / {st:.1f} |"
            f" {s['cold_gets']:.0f} ({s['cold_ranged']:.0f}) / {s['cold_in_flight'] or '-'} | {s['warm_requests']} |"
            f" {s['disk_mib']:.1f} |"
            f" {fmt(s['pss_mib'])} | {s['cold_mib_s'] / b['cold_mib_s']:.2f}x | {s['warm_mib_s'] / b['warm_mib_s']:.2f}x |"
            if b
            else f"{head} {s['cold_mib_s']:.1f} | | | | | | | | | | |"
        )
    for f in floors:
        head = f"| {f['transport']} | {FLOOR} | {f['concurrency']} in flight |"
        if f.get("error"):
            lines.append(f"{head} error: {f['error'][:160]} |{empty}")
            continue
        xs = f["rates"]
        b = base.get((f["transport"], "in-process"))
        ratio = f"{med(xs) / b['cold_mib_s']:.2f}x" if b else ""
        lines.append(
            f"{head} {med(xs):.1f} ({min(xs):.1f}-{max(xs):.1f}) | | | | {f['bytes'] / 2**20:.1f} per pass |"
            f" {f['gets']} (0) / {f['concurrency']} | | | | {ratio} | |"
        )
    notes = [e for row in rows for e in row.get("errors", [])]
    if notes:
        lines += ["", "failed runs (their figures are not in the medians):"]
        lines += [f"- {e.splitlines()[0][:300]}" for e in notes]
    return "\n".join(lines)


def header(doc: dict) -> str:
    return (
        f"machine: {doc['machine']}; mode={doc['mode']}, {doc['records']} records x {doc['record_bytes']} B "
        f"({doc['records'] * doc['record_bytes'] / 2**20:.0f} MiB), shards {doc['shard_bytes'] >> 20} MiB, "
        f"batch {BATCH}, cold repeats {doc.get('repeats', '?')}, wall {doc['wall_s']:.0f} s"
    )


def main() -> None:
    args = parse_args()
    if args.child:
        run_child(json.loads(args.child))
        return
    if args.report:
        doc = json.loads(args.report.read_text())
        print(f"{header(doc)}\n")
        print(table(doc["rows"], doc["floors"], doc))
        return
    if args.profile is not None:
        args.profile = args.profile.resolve()
        args.profile.parent.mkdir(parents=True, exist_ok=True)
    # SIGTERM unwinds like Ctrl-C: the running child's session is killed, the servers stopped.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    started = time.perf_counter()
    rows, floors, facts, failures = bench(args)
    doc = {
        "machine": machine_facts(),
        **facts,
        "repeats": args.repeats or MODES[args.mode][2],
        "wall_s": time.perf_counter() - started,
        "rows": rows,
        "floors": floors,
        "failures": failures,
    }
    print(f"\n{header(doc)}\n")
    print(table(rows, floors, facts))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2, default=str))
    if failures:
        print("\nPROBLEMS:\n" + "\n".join(failures))
        sys.exit(1)
    print("\nevery contender read every record exactly once, with the written bytes")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
