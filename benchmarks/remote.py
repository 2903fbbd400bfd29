"""Object storage: reading one dataset from a real S3 server (moto's) over a shaped link, datasetrt
beside MosaicML Streaming and LitData, cold (an empty node cache) and warm (the second epoch),
with datasetrt reading the same cache from local disk as the reference for warm reads, datasetrt
under a node-cache limit, and the raw GET rate of the same objects as the physical floor.

Usage: python -m benchmarks.remote [--quick | --smoke] [--repeats R] [--peer-python PY]
                                   [--rate 800mbit] [--latency-ms 20] [--no-shape | --shape]
                                   [--transports https,http] [--no-peers] [--window-shards W]
                                   [--profile FILE] [--py-spy FILE] [--plot PNG]
                                   [--out bench-out/remote.json] [--report bench-out/remote.json]

Data (benchmarks.remote_records): N records of 16 KiB seeded random bytes (the first 8 bytes are
the record's index) and an int label; full 16,384 records (256 MiB, 16 MiB shards), --quick 3,072
(48 MiB, 8 MiB shards), --smoke 512 (8 MiB, 1 MiB shards; datasetrt and the floor only, one
repeat, unshaped, seconds). Each tool writes its own store of those records with shards of the
same size: datasetrt `DatasetRuntime.write_cache(..., "s3://bench/drt", writer_config=
WriterConfig(storage=StorageConfig(options=...)))`, Streaming MDS and LitData optimized chunks
uploaded with boto3 (benchmarks.remote_peers).

Servers (benchmarks.remote_servers): moto's server (tests/servers/moto.py) behind the tests'
FaultProxy, which counts requests and body bytes per contender; for https a TLS front (a
throw-away CA made for the run, trusted through SSL_CERT_FILE / AWS_CA_BUNDLE) before the proxy.
LitData's chunk reads (obstore) refuse plain http, so the comparison of all three is over https;
datasetrt and Streaming are also read over http.

Network (benchmarks.remote_net; default except --smoke): the proxy and the TLS front listen on
the host end of a veth pair into a network namespace made for the run, each end rate-limited by
a token bucket (`--rate`, tc tbf), and every reader child (contenders and floor) enters that
namespace before it starts, so all of its traffic crosses the link; the proxy also holds each
request `--latency-ms` before forwarding it (a first-byte latency per request: the kernel has no
netem). Checked per run: the child's namespace, and the bytes the link carried >= the bytes the
proxy served. `--no-shape` (or no root / no `ip netns`) reads over loopback, and the report says
why. Writes and uploads are not shaped and not timed.

Contenders, each run in a fresh child process per repeat with a fresh local cache directory, a
cold epoch then (full, quick) 3 warm epochs of which the one of median time is reported:
  datasetrt              CachedDataset(["s3://bench/drt/<cache>"], reader_config=ReaderConfig(
                         sampling="locality", window_shards=W, shuffle=True, seed=SEED,
                         storage=StorageConfig(options=..., cache_dir=<fresh>)), runtime=None or
                         DatasetRuntime(num_workers=2)), iter_batches(256) with the label column
  datasetrt, local disk  the same reader over the directory the previous datasetrt run left in
                         its node cache (its mirror: the same cache, now local), same order
  datasetrt, limit       StorageConfig(cache_limit_bytes=L) with L a fraction of the stored
                         bytes (full 1/4) and the largest window_shards the disk bound accepts
  MosaicML Streaming     StreamingDataset(remote=..., local=<fresh>, shuffle=True, batch_size=256)
                         in a torch DataLoader(batch_size=256, num_workers=0 or 2)
  LitData                litdata.StreamingDataset("s3://...", cache_dir=<fresh>, shuffle=True,
                         storage_options={"endpoint_url": ...}) in StreamingDataLoader(256, 0 or 2)
  GET floor              obstore GETs of datasetrt's shard objects into memory through the same
                         proxy (1 and 4 in flight), no disk, no decoding
The peers run in their own venv (--peer-python, default /tmp/peervenv/bin/python, see
docs/benchmarks.md); without it their rows say "skipped: <reason>".

Figures per contender and pass (benchmarks.remote_report; medians over the repeats): first batch
(seconds from the dataset's construction, its index fetch included, for the cold pass; from the
pass's start for the warm one), steady samples/s (the samples after the first batch over the
time after it), epoch samples/s, bytes the proxy served during the pass over the bytes the tool
stored, GETs, the most GETs in flight, peak local disk (the cache directory's allocated blocks,
sampled every 50 ms from here), peak PSS of the child's process tree (sampled from here), and the
targets of the object-storage issue. Every timed pass is checked (every record exactly once,
labels, a payload checksum; benchmarks.remote_records.Tally) and the first repeat of each
contender digests every payload on an extra untimed pass; a mismatch is printed and exits 1.
No speed is asserted.

The children (datasetrt's write and reads, the GET floor) live in benchmarks.remote_children;
this module is the orchestration, over 500 lines because `bench` is one sequence (servers, link,
stores, then every contender x transport x workers x variant x repeat) whose steps share its state.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

from benchmarks.common import ROOT, Digest, child_process, machine_facts
from benchmarks.remote_children import (
    BATCH,
    BUCKET,
    OURS_PREFIX,
    SEED,
    WORKERS,
    mirror_dir,
    s3_options,
)

RECORD = 16 << 10
MODES = {  # records, shard bytes, cold repeats, node-cache limit (a fraction of the stored bytes), warm passes
    "full": (16384, 16 << 20, 3, 0.25, 3),
    "quick": (3072, 8 << 20, 3, 0.5, 3),
    "smoke": (512, 1 << 20, 1, 0.5, 1),
}
OURS = "datasetrt"
STREAMING = "MosaicML Streaming"
LITDATA = "LitData"
FLOOR = "GET floor (obstore)"
REMOTE, LOCAL, LIMIT = "remote", "local disk", "limit"  # datasetrt's variants
PREFIX = {OURS: OURS_PREFIX, STREAMING: "mds", LITDATA: "lit"}
DEFAULT_PEER_PYTHON = os.environ.get("DATASETRT_BENCH_PEER_PYTHON", "/tmp/peervenv/bin/python")
PY_SPY = os.environ.get("DATASETRT_BENCH_PY_SPY", "/tmp/pyspy/bin/py-spy")
CHILD_TIMEOUT_S = 900.0
SAMPLE_S = 0.05


# ---------------------------------------------------------------------------- orchestration


class Sampler:
    """While a child runs: the link's transmitted bytes (the host end of the shaped link, from
    sysfs) and the local disk the cache directory holds, every SAMPLE_S; `peak_disk`,
    `peak_unlinked` (the part of it in files removed from the directory but still open in this
    process's descendants: their blocks stay allocated until closed), `timeline` [(time.time(),
    link bytes)]."""

    def __init__(self, cache_dir: Path | None, link_dev: str | None) -> None:
        self.cache_dir = cache_dir
        self.stat = Path(f"/sys/class/net/{link_dev}/statistics/tx_bytes") if link_dev else None
        self.peak_disk = 0
        self.peak_unlinked = 0
        self.timeline: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="remote-sampler", daemon=True)

    def sample(self) -> None:
        if self.stat is not None:
            try:
                self.timeline.append((time.time(), int(self.stat.read_text())))
            except (OSError, ValueError):
                pass
        if self.cache_dir is not None:
            unlinked = unlinked_bytes(str(self.cache_dir))
            self.peak_unlinked = max(self.peak_unlinked, unlinked)
            self.peak_disk = max(self.peak_disk, disk_bytes(self.cache_dir) + unlinked)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.sample()

    def __enter__(self) -> Sampler:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def link_bytes(self, t0: float = 0.0, t1: float = float("inf")) -> int | None:
        """Bytes the link carried between the samples nearest t0 and t1 (None: no link)."""
        inside = [b for t, b in self.timeline if t0 - SAMPLE_S <= t <= t1 + SAMPLE_S]
        return inside[-1] - inside[0] if len(inside) >= 2 else (None if self.stat is None else 0)


def launch(
    spec: dict,
    python: str | None = None,
    peak_pss: bool = False,
    module: str = "benchmarks.remote_children",
    sampler: Sampler | None = None,
) -> dict:
    """One child (`benchmarks.remote_children` in this venv, `benchmarks.remote_peers` in the peers' venv;
    `python` may be a wrapper that runs the interpreter, e.g. under py-spy)."""
    with sampler or Sampler(None, None):
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


def unlinked_bytes(under: str) -> int:
    """Blocks of files once under `under`, removed, and still open in a descendant process of
    this one (counted once per inode)."""
    import psutil

    seen: dict[tuple[int, int], int] = {}
    prefix = under.rstrip("/") + "/"
    try:
        procs = psutil.Process().children(recursive=True)
    except psutil.Error:
        return 0
    for proc in procs:
        fd_dir = f"/proc/{proc.pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
                if not (target.startswith(prefix) and target.endswith(" (deleted)")):
                    continue
                st = os.stat(f"{fd_dir}/{fd}")
            except OSError:
                continue
            seen[(st.st_dev, st.st_ino)] = st.st_blocks * 512
    return sum(seen.values())


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
    shape = parser.add_mutually_exclusive_group()
    shape.add_argument("--no-shape", action="store_false", dest="shape", default=None, help="loopback, no latency")
    shape.add_argument("--shape", action="store_true", dest="shape", help="shape --smoke too")
    parser.add_argument("--rate", default="800mbit", help="tc tbf rate of the link, each way (default 800mbit)")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="first-byte latency per request (default 20)")
    parser.add_argument("--window-shards", type=int, default=8, help="datasetrt's locality window (default 8)")
    parser.add_argument(
        "--variants", default="remote,local,limit", help="datasetrt's rows: remote, local (disk), limit (default all)"
    )
    parser.add_argument(
        "--limit-spare", type=int, default=1, help="limit run: shards of prefetch room beside its window (default 1)"
    )
    parser.add_argument("--fetch-concurrency", type=int, default=None, help="StorageConfig.fetch_concurrency")
    parser.add_argument("--prefetch-shards", type=int, default=None, help="StorageConfig.prefetch_shards")
    parser.add_argument("--profile", type=Path, default=None, help="cProfile datasetrt's first cold in-process epoch")
    parser.add_argument("--py-spy", type=Path, default=None, help="py-spy (all threads) of that child, speedscope")
    parser.add_argument("--plot", type=Path, default=None, help="write the figure (PNG) of the run")
    parser.add_argument("--out", type=Path, default=Path("bench-out/remote.json"))
    parser.add_argument("--report", type=Path, default=None, help="print the table of a saved run's JSON")
    args = parser.parse_args()
    args.mode = args.mode or "full"
    if args.shape is None:
        args.shape = args.mode != "smoke"
    if args.transports is None:
        args.transports = "http" if args.mode == "smoke" else "https,http"
    args.transport_list = [t for t in args.transports.split(",") if t]
    if set(args.transport_list) - {"http", "https"}:
        parser.error("--transports: https and/or http")
    names = {"remote": REMOTE, "local": LOCAL, "limit": LIMIT}
    args.variant_list = [names[v] for v in args.variants.split(",") if v in names]
    if REMOTE not in args.variant_list or len(args.variant_list) != len([v for v in args.variants.split(",") if v]):
        parser.error("--variants: remote, plus local and/or limit")
    return args


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def limit_plan(stored: list[tuple[str, int]], fraction: float, spare: int = 1) -> tuple[int, int]:
    """(cache_limit_bytes, window_shards) of the limited datasetrt run: `fraction` of the stored
    bytes, and the largest window the disk bound (datasetrt/dataset/remote.py: small files +
    (W + 1) x the largest shard) accepts with room for `spare` shards of prefetch beside it; the
    limit is raised to fit W = 1 if it must."""
    shards = [s for k, s in stored if "/shards/" in k]
    small = sum(s for k, s in stored if "/shards/" not in k)
    largest = max(shards)
    limit = int(sum(s for _, s in stored) * fraction)
    window = (limit - small) // largest - 1 - spare
    if window < 1:
        window, limit = 1, small + (2 + spare) * largest
    return limit, window


def bench(args: argparse.Namespace) -> tuple[list[dict], list[dict], dict, list[str]]:
    from benchmarks.remote_net import ShapedLink, namespace_inode
    from benchmarks.remote_records import read_records, write_records
    from benchmarks.remote_servers import CountingProxy, TLSFront, make_ca, summarize
    from tests.servers.moto import FAKE_ACCESS_KEY_ID, FAKE_SECRET_ACCESS_KEY, REGION, MotoServer

    count, shard_bytes, default_repeats, limit_fraction, warm_passes = MODES[args.mode]
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
    facts: dict = {
        "mode": args.mode,
        "records": count,
        "record_bytes": RECORD,
        "shard_bytes": shard_bytes,
        "window_shards": args.window_shards,
        "load": [load_average()],
    }
    link = None
    try:
        if args.shape:
            link, why = ShapedLink.create(args.rate)
            facts["network"] = (
                f"shaped: {link.describe()}; first-byte latency {args.latency_ms:g} ms per request at the proxy"
                if link
                else f"unshaped (loopback, no latency): {why}"
            )
        else:
            facts["network"] = "unshaped (loopback, no latency): --no-shape" + (
                " (--smoke)" if args.mode == "smoke" else ""
            )
        facts["rate"] = args.rate if link else None
        facts["latency_ms"] = args.latency_ms if link else 0.0
        print(f"network: {facts['network']}", flush=True)
        host = link.host_ip if link else "127.0.0.1"
        netns = link.ns_path if link else None
        want_inode = namespace_inode(netns) if netns else None

        records = workdir / "records.bin"
        expect = write_records(records, count, RECORD, SEED)
        written = Digest.of(read_records(str(records), RECORD))
        ca, cert, key = make_ca(workdir / "tls", hosts=(host,) if host != "127.0.0.1" else ())
        env_base = {"AWS_EC2_METADATA_DISABLED": "true"}
        for name in list(os.environ):
            if name.startswith(("AWS_", "S3_ENDPOINT", "SSL_CERT")):
                del os.environ[name]  # children must reach only the servers started here
        with (
            MotoServer() as moto,
            CountingProxy(moto.endpoint, host=host) as proxy,
            TLSFront(proxy.port, cert, key, host=host, upstream_host=host) as tls,
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

            # -- stores (not shaped: the writer runs in this namespace, the proxy holds nothing yet)
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
                    module="benchmarks.remote_peers",
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
                store["sizes"] = objs
            facts["stores"] = {
                k: {kk: vv for kk, vv in v.items() if kk not in ("keys", "sizes")} for k, v in stores.items()
            }
            shard_keys = [k for k in stores[OURS]["keys"] if "/shards/" in k]
            limit_bytes, limit_window = limit_plan(stores[OURS]["sizes"], limit_fraction, args.limit_spare)
            facts["limit"] = {"bytes": limit_bytes, "window_shards": limit_window, "fraction": limit_fraction}
            proxy.latency_s = args.latency_ms / 1000.0 if link else 0.0
            link_dev = link.host_dev if link else None

            def check_link(got: dict, served_bytes: int, sampler: Sampler, label: str) -> None:
                """The child ran in the namespace and its bytes crossed the link."""
                if link is None or got.get("error"):
                    return
                if got.get("netns_inode") != want_inode:
                    failures.append(f"{label}: the child was not in the shaped namespace")
                carried = sampler.link_bytes()
                got["link_bytes"] = carried
                # The proxy counts a response's body before it sends it, so a response its client
                # abandoned (a worker stopped mid-download) is counted whole; a child that bypassed
                # the link would leave it idle.
                if carried is not None and carried < served_bytes // 2:
                    failures.append(f"{label}: the link carried {carried} bytes, the proxy served {served_bytes}")

            # -- the physical floor
            for transport in args.transport_list:
                for conc in (1, 4):
                    sampler = Sampler(None, link_dev)
                    proxy.forget()
                    got = launch(
                        {
                            "task": "floor",
                            "options": options(transport),
                            "keys": shard_keys,
                            "concurrency": conc,
                            "repeats": max(3, repeats),
                            "env": env_of(transport),
                            "netns": netns,
                        },
                        sampler=sampler,
                    )
                    check_link(got, summarize(proxy.served)["bytes"], sampler, f"floor {transport} {conc}")
                    floors.append({"transport": transport, "concurrency": conc, **got})

            # -- reads
            pyspy_wrapper = None
            if args.py_spy is not None:
                pyspy_wrapper = workdir / "py-spy-python"
                pyspy_wrapper.write_text(
                    "#!/bin/sh\n"
                    f"exec {PY_SPY} record --threads --idle --rate 250 --format speedscope "
                    f'--output {args.py_spy} -- {sys.executable} "$@"\n'
                )
                pyspy_wrapper.chmod(0o755)
            profile_left = args.profile
            storage_knobs = {
                k: v
                for k, v in (("fetch_concurrency", args.fetch_concurrency), ("prefetch_shards", args.prefetch_shards))
                if v is not None
            }
            facts["storage_knobs"] = storage_knobs
            for transport in args.transport_list:
                for contender in (OURS, STREAMING, LITDATA):
                    for workers in (0, WORKERS):
                        where = "in-process" if workers == 0 else f"{workers} workers"
                        variants = tuple(args.variant_list) if contender == OURS else (REMOTE,)
                        vrows = {}
                        for variant in variants:
                            row = {
                                "transport": transport,
                                "contender": contender,
                                "variant": variant,
                                "where": where,
                                "runs": [],
                            }
                            if variant == LIMIT:
                                row["limit_bytes"], row["window_shards"] = limit_bytes, limit_window
                            else:
                                row["window_shards"] = args.window_shards
                            rows.append(row)
                            vrows[variant] = row
                        row = vrows[REMOTE]
                        if contender in peers_skip:
                            row["skipped"] = peers_skip[contender]
                            continue
                        if contender == LITDATA and transport == "http":
                            row["skipped"] = "LitData's chunk reads (obstore) need https"
                            continue
                        for variant in variants:
                            vrow = vrows[variant]
                            if vrow.get("stop"):
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
                                    "netns": netns,
                                    "window_shards": vrow["window_shards"],
                                    "storage": storage_knobs,
                                    "warm_passes": warm_passes,
                                    "paired_local": contender == OURS and variant == REMOTE,
                                }
                                python, module = None, "benchmarks.remote_children"
                                if contender != OURS:
                                    python, module = args.peer_python, "benchmarks.remote_peers"
                                if variant == LIMIT:
                                    spec["limit_bytes"] = limit_bytes
                                if variant == LOCAL:
                                    # the previous remote run's mirror, kept for this read
                                    src = (
                                        vrows[REMOTE]["runs"][rep].get("mirror")
                                        if rep < len(vrows[REMOTE]["runs"])
                                        else None
                                    )
                                    if not src:
                                        vrow["skipped"] = "no mirror left by the remote run"
                                        vrow["stop"] = True
                                        break
                                    spec["url"] = src
                                    spec["cache_dir"] = str(workdir / "unused-cache")
                                if variant == REMOTE and contender == OURS and workers == 0 and rep == 0:
                                    if profile_left is not None:
                                        spec["profile"] = str(profile_left)
                                        profile_left = None
                                    if pyspy_wrapper is not None:
                                        python = str(pyspy_wrapper)
                                        pyspy_wrapper = None
                                proxy.forget()
                                sampler = Sampler(cache_dir, link_dev)
                                got = launch(spec, python=python, peak_pss=True, module=module, sampler=sampler)
                                got["disk_bytes"] = disk_bytes(cache_dir)
                                got["peak_disk_bytes"] = sampler.peak_disk
                                got["peak_unlinked_bytes"] = sampler.peak_unlinked
                                got["load"] = load_average()
                                if variant == REMOTE and contender == OURS:
                                    keep = mirror_dir(cache_dir)
                                    if keep is not None:
                                        got["mirror"] = str(workdir / f"mirror-{transport}-{workers}-{rep}")
                                        os.rename(keep, got["mirror"])
                                elif variant == LOCAL:
                                    shutil.rmtree(spec["url"], ignore_errors=True)
                                shutil.rmtree(cache_dir, ignore_errors=True)
                                prefix = stores[contender]["prefix"] + "/"
                                for p in got.get("passes", {}).values():
                                    p["served"] = summarize(proxy.between(p["wall"][0], p["wall"][1], prefix))
                                    p["link_bytes"] = sampler.link_bytes(p["wall"][0], p["wall"][1])
                                    if p.get("first_batch_s") is not None:
                                        w0 = p["wall"][0]
                                        p["link_bytes_first_batch"] = sampler.link_bytes(w0, w0 + p["first_batch_s"])
                                got["served_all"] = summarize(proxy.between(0, time.time() + 1, prefix))
                                got["timeline"] = sampler.timeline
                                label = f"{contender} ({variant}), {where}, {transport}, repeat {rep}"
                                check_link(got, got["served_all"]["bytes"], sampler, label)
                                vrow["runs"].append(got)
                                if got.get("error"):
                                    # datasetrt failing is a broken run; a peer's failure is its row's finding
                                    (failures if contender == OURS else vrow.setdefault("errors", [])).append(
                                        f"{label}: {got['error']}"
                                    )
                                    print(f"  {label}: ERROR {got['error'][:300]}", flush=True)
                                    if got.get("traceback"):
                                        print(got["traceback"], flush=True)
                                    vrow["stop"] = True
                                    break
                                for p in got.get("problems", []):
                                    failures.append(f"{label}: {p}")
                                if rep == 0 and got.get("multiset") != written["multiset"]:
                                    failures.append(f"{label}: payload digest differs from the written records")
                                c, w = got["passes"]["cold"], got["passes"]["warm"]
                                print(
                                    f"  {label}: first batch {c['first_batch_s']:.2f} s, cold "
                                    f"{c['samples'] / c['s']:,.0f} samples/s, warm {w['samples'] / w['s']:,.0f}, "
                                    f"served {c['served']['bytes'] / 2**20:.1f} + {w['served']['bytes'] / 2**20:.1f} MiB, "
                                    f"peak disk {sampler.peak_disk / 2**20:.1f} MiB, load {got['load']}",
                                    flush=True,
                                )
                                facts["load"].append(got["load"])
                        for vrow in vrows.values():
                            for run in vrow["runs"]:
                                if run.get("mirror"):
                                    shutil.rmtree(run["mirror"], ignore_errors=True)
        facts["expect"] = expect
        facts["stored_dataset_bytes"] = count * RECORD
    finally:
        if link is not None:
            link.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return rows, floors, facts, failures


def main() -> None:
    args = parse_args()
    from benchmarks.remote_report import header, plot, table, targets

    if args.report:
        doc = json.loads(args.report.read_text())
        print(f"{header(doc)}\n")
        print(table(doc["rows"], doc["floors"], doc))
        print("\n" + targets(doc["rows"], doc))
        if args.plot:
            plot(doc, args.plot)
        return
    for name in ("profile", "py_spy"):
        path = getattr(args, name)
        if path is not None:
            setattr(args, name, path.resolve())
            path.resolve().parent.mkdir(parents=True, exist_ok=True)
    # SIGTERM unwinds like Ctrl-C: the running child's session is killed, the servers stopped,
    # the namespace deleted.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    started = time.perf_counter()
    t_start = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    rows, floors, facts, failures = bench(args)
    facts["load"].append(load_average())
    doc = {
        "machine": machine_facts(),
        **facts,
        "repeats": args.repeats or MODES[args.mode][2],
        "warm_passes": MODES[args.mode][4],
        "started_utc": t_start,
        "ended_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "wall_s": time.perf_counter() - started,
        "rows": rows,
        "floors": floors,
        "failures": failures,
    }
    print(f"\n{header(doc)}\n")
    print(table(rows, floors, doc))
    print("\n" + targets(rows, doc))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2, default=str))
    if args.plot:
        plot(doc, args.plot)
    if failures:
        print("\nPROBLEMS:\n" + "\n".join(failures))
        sys.exit(1)
    print("\nevery contender read every record exactly once, with the written bytes")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
