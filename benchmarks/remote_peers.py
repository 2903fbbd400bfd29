"""MosaicML Streaming and LitData in the object-storage benchmark (benchmarks.remote): their stores
written from the benchmark's records and uploaded to the S3 server, then read back from it
through their documented remote paths. Runs in the peers' own venv
(`python -m benchmarks.remote_peers --child SPEC`, SPEC as JSON; the last stdout line is the
figures), started by benchmarks.remote.

- Streaming: `streaming.MDSWriter(columns={"data": "bytes", "label": "int"}, size_limit=SHARD)`
  into a local directory, uploaded object by object with boto3; read with
  `StreamingDataset(remote="s3://...", local=<fresh dir>, shuffle=True, shuffle_seed=SEED,
  batch_size=B)` in a `torch.utils.data.DataLoader(batch_size=B, num_workers=W)`. Streaming
  reaches the server through `S3_ENDPOINT_URL` and the `AWS_*` variables (plus
  `AWS_CA_BUNDLE` over https); `streaming` is imported without its vision subpackages
  (benchmarks.stream_peers.import_streaming).
- LitData: `litdata.optimize` of {"data": uint8[SIZE], "label": int} items (one worker,
  `chunk_bytes=SHARD`), uploaded with boto3; read with `litdata.StreamingDataset("s3://...",
  cache_dir=<fresh dir>, shuffle=True, seed=SEED, storage_options={"endpoint_url": ...})` in a
  `litdata.StreamingDataLoader(batch_size=B, num_workers=W)`. Its chunk downloads go through
  obstore, which refuses plain http, so LitData is only read over https (a throw-away CA in
  `SSL_CERT_FILE` / `AWS_CA_BUNDLE`).

A read child given `netns` enters that network namespace first (benchmarks.remote_net), so its
loader's workers and downloads all use the benchmark's shaped link. Both loaders are built once; the cold epoch runs from the dataset's construction (its index
download included) to the last batch, the warm epochs are the loader's next `warm_passes` passes
over the local copies (`persistent_workers=True` with workers), reported as the one of median time. Each pass is checked (benchmarks.remote_records.Tally);
a `verify` run adds an untimed third pass digesting every payload.

Boundary: never imports datasetrt; a peer's failure is the row's `error`, never raised.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

STREAMING = "MosaicML Streaming"
LITDATA = "LitData"


def _s3(endpoint: str):
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 10}),
    )


def upload_dir(local: Path, endpoint: str, bucket: str, prefix: str) -> int:
    """Put every file under `local` as `prefix/<relative path>`; returns the bytes put."""
    client = _s3(endpoint)
    total = 0
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        rel = path.relative_to(local).as_posix()
        client.upload_file(str(path), bucket, f"{prefix}/{rel}")
        total += path.stat().st_size
    return total


def litdata_item(item):
    """litdata.optimize's fn: (records path, index, size) -> {"data": uint8[size], "label": int}."""
    import numpy as np

    path, i, size = item
    with open(path, "rb") as f:
        f.seek(i * size)
        raw = f.read(size)
    return {"data": np.frombuffer(raw, dtype=np.uint8).copy(), "label": i % 1000}


def build(spec: dict) -> dict:
    """Write the peer's store locally from the records, upload it under `spec["prefix"]`."""
    from benchmarks.remote_records import read_records

    out = Path(spec["out"])
    t0 = time.perf_counter()
    if spec["contender"] == STREAMING:
        from benchmarks.stream_peers import import_streaming

        MDSWriter, _ = import_streaming()
        rows = read_records(spec["records"], spec["size"])
        with MDSWriter(
            out=str(out),
            columns={"data": "bytes", "label": "int"},
            size_limit=spec["shard_bytes"],
            progress_bar=False,
        ) as writer:
            for i in range(len(rows)):
                writer.write({"data": rows[i].tobytes(), "label": i % 1000})
    else:
        import litdata

        items = [(spec["records"], i, spec["size"]) for i in range(spec["count"])]
        litdata.optimize(
            fn=litdata_item,
            inputs=items,
            output_dir=str(out),
            chunk_bytes=spec["shard_bytes"],
            num_workers=1,
            start_method="fork",
            mode="overwrite",
        )
    built = time.perf_counter() - t0
    nbytes = upload_dir(out, spec["upload_endpoint"], spec["bucket"], spec["prefix"])
    return {"build_s": built, "upload_s": time.perf_counter() - t0 - built, "stored_bytes": nbytes}


def _loader(spec: dict):
    batch, workers, seed = spec["batch"], spec["workers"], spec["seed"]
    url = f"s3://{spec['bucket']}/{spec['prefix']}"
    if spec["contender"] == STREAMING:
        from torch.utils.data import DataLoader

        from benchmarks.stream_peers import import_streaming

        _, StreamingDataset = import_streaming()
        ds = StreamingDataset(remote=url, local=spec["cache_dir"], shuffle=True, shuffle_seed=seed, batch_size=batch)
        return DataLoader(ds, batch_size=batch, num_workers=workers, persistent_workers=workers > 0)
    import litdata

    ds = litdata.StreamingDataset(
        url,
        cache_dir=spec["cache_dir"],
        shuffle=True,
        seed=seed,
        storage_options={"endpoint_url": spec["endpoint"]},
    )
    return litdata.StreamingDataLoader(ds, batch_size=batch, num_workers=workers, persistent_workers=workers > 0)


def _add(tally, batch) -> None:
    data, labels = batch["data"], batch["label"]
    labels = labels.numpy() if hasattr(labels, "numpy") else labels
    if hasattr(data, "numpy"):
        tally.add_rows(data.numpy(), labels)
    else:
        tally.add_list(data, labels)


def read(spec: dict) -> dict:
    """Cold epoch (construction to last batch), warm epoch, optional digest pass."""
    from benchmarks.common import Digest
    from benchmarks.remote_records import Tally

    if spec["contender"] == STREAMING:
        from benchmarks.stream_peers import import_streaming

        import_streaming()
    else:
        import litdata  # noqa: F401
    import torch  # noqa: F401  (imports stay out of the clock, as for datasetrt)

    result: dict = {"passes": {}, "problems": []}
    t_open = time.time()
    start = time.perf_counter()
    loader = _loader(spec)
    result["open_s"] = time.perf_counter() - start
    warm: list[dict] = []
    for name in ("cold", *["warm"] * spec.get("warm_passes", 1)):
        tally = Tally(spec["expect"])
        wall0 = t_open if name == "cold" else time.time()
        t0 = start if name == "cold" else time.perf_counter()
        first = first_n = None
        for batch in loader:
            if first is None:
                first, first_n = time.perf_counter() - t0, len(batch["label"])
            _add(tally, batch)
        dt = time.perf_counter() - t0
        figures = {
            "s": dt,
            "first_batch_s": first,
            "first_n": first_n or 0,
            "samples": tally.samples,
            "bytes": tally.bytes,
            "wall": [wall0, time.time()],
            "order_head": tally.order_head(),
        }
        if name == "cold":
            result["passes"]["cold"] = figures
        else:
            warm.append(figures)
        result["problems"] += [f"{name}: {p}" for p in tally.problems()]
    result["passes"]["warm"] = median_pass(warm)
    result["warm_all_s"] = [p["s"] for p in warm]
    if spec.get("verify"):
        d = Digest()
        for batch in loader:
            data = batch["data"]
            for row in data.numpy() if hasattr(data, "numpy") else data:
                d.add(row)
        result.update(d.result())
    del loader
    return result


def median_pass(passes: list[dict]) -> dict:
    """The pass of median time among `passes` (the lower one of an even count)."""
    return sorted(passes, key=lambda p: p["s"])[(len(passes) - 1) // 2]


def main() -> None:
    if len(sys.argv) != 3 or sys.argv[1] != "--child":
        raise SystemExit("usage: python -m benchmarks.remote_peers --child SPEC (started by benchmarks.remote)")
    spec = json.loads(sys.argv[2])
    netns_inode = None
    if spec.get("netns"):  # first, before any thread: the whole child reads over the shaped link
        from benchmarks.remote_net import enter

        netns_inode = enter(spec["netns"])
    os.environ.update(spec.get("env", {}))
    try:
        figures = build(spec) if spec["task"] == "build" else read(spec)
    except Exception as exc:  # a peer API failure is a finding, not a crash
        figures = {"error": f"{type(exc).__name__}: {exc}"[:2000], "traceback": traceback.format_exc()[-3000:]}
    figures["netns_inode"] = netns_inode
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
