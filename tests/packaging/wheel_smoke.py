"""Smoke test of an INSTALLED datasetrt, run by the venv's interpreter outside the repository.

Boundary: the public API, datasetrt.errors and the installed files only; imports nothing from the
repository (tests/packaging/test_installed_wheels.py runs it with the cwd in a temp dir).

  python wheel_smoke.py EXPECTED_VERSION WORKDIR

Checks, each an assertion (exit 1 with the traceback on the first failure):
  - datasetrt and its compiled kernels load from site-packages, version as expected;
  - write: two caches (lz4, zstd) with per-record checksums, through DatasetRuntime(num_workers=2);
  - read with worker processes under fork and under spawn (workers really started): every sample
    once, bytes and metadata equal to what was written, then the same as batches of 64;
  - checksums are verified: one flipped payload byte in an uncompressed copy is an IntegrityError;
  - an optional feature without its extra (torch is not installed here) raises MissingExtraError
    naming `pip install 'datasetrt[torch]'`.
Prints "wheel smoke ok" last.
"""

from __future__ import annotations

import hashlib
import importlib
import pkgutil
import shutil
import sys
import sysconfig
from pathlib import Path

import datasetrt as drt
from datasetrt import errors

SAMPLES = 300


def payload(cache: int, i: int) -> bytes:
    """Deterministic payload of sample i of cache `cache`: 0..4 KiB, compressible and not."""
    size = (i * 53 + cache * 17) % 4097
    seed = hashlib.sha256(f"{cache}:{i}".encode()).digest()
    return (seed * (size // 32 + 1))[:size] if i % 2 else bytes([i % 251]) * size


class Source:
    def __init__(self, name: str, cache: int) -> None:
        self.name, self.cache = name, cache

    def __iter__(self):
        for i in range(SAMPLES):
            yield drt.CacheInput(payload(self.cache, i), {"i": i, "cache": self.cache, "label": f"c{i % 4}"})


def check_installed(expected_version: str) -> None:
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    assert drt.__version__ == expected_version, (drt.__version__, expected_version)
    assert Path(drt.__file__).resolve().is_relative_to(site), f"datasetrt imported from {drt.__file__}, not {site}"
    import datasetrt._native

    kernels = [info.name for info in pkgutil.iter_modules(datasetrt._native.__path__)]
    assert {"codec", "gather", "batch", "draws"} <= set(kernels), kernels
    for name in kernels:
        module = importlib.import_module(f"datasetrt._native.{name}")
        assert Path(module.__file__).resolve().is_relative_to(site), module.__file__
        assert module.__file__.endswith(".so"), module.__file__


def write(base: Path) -> list[Path]:
    with drt.DatasetRuntime(num_workers=2) as rt:
        paths = []
        for k, algo in enumerate(("lz4", "zstd")):
            config = drt.WriterConfig(show_progress=False, shard_compression=drt.ShardCompression(algo=algo))
            [result] = rt.write_cache(Source(f"part{k}", k), base, writer_config=config)
            assert isinstance(result, drt.CacheWriteSuccess), result
            paths.append(Path(result.path))
    return paths


def read_with_workers(paths: list[Path], start_method: str) -> None:
    with drt.DatasetRuntime(num_workers=2, start_method=start_method) as rt:
        assert len(rt.start_workers()) == 2
        ds = rt.cached_dataset(paths, reader_config=drt.ReaderConfig(seed=11, shuffle=False))
        seen = set()
        for sample in ds:
            cache = sample.metadata["cache"]
            assert sample.data == payload(cache, sample.sample_id), (start_method, cache, sample.sample_id)
            assert sample.metadata["i"] == sample.sample_id
            seen.add((cache, sample.sample_id))
        assert seen == {(c, i) for c in (0, 1) for i in range(SAMPLES)}, (start_method, len(seen))
        assert len(rt.worker_pids) == 2
        rows = 0
        for batch in ds.iter_batches(64):
            for j in range(len(batch)):
                cache = batch.metadata.column("cache")[j].as_py()
                assert bytes(batch.payload(j)) == payload(cache, int(batch.sample_id[j]))
            rows += len(batch)
        assert rows == 2 * SAMPLES, rows
        ds.close()
    print(f"read {len(seen)} samples and {rows} as batches with 2 {start_method} workers")


def check_corruption_detected(base: Path) -> None:
    config = drt.WriterConfig(show_progress=False, shard_compression=drt.ShardCompression(algo="none"))
    with drt.DatasetRuntime(num_workers=1) as rt:
        [result] = rt.write_cache(Source("plain", 0), base, writer_config=config)
    shard = sorted(Path(result.path, "shards").iterdir())[-1]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # the last byte of the last record's payload (uncompressed: stored as is)
    shard.write_bytes(bytes(data))
    ds = drt.CachedDataset([result.path], reader_config=drt.ReaderConfig(seed=0, shuffle=False), runtime=None)
    try:
        for _ in ds:
            pass
    except errors.IntegrityError as exc:
        print(f"flipped byte detected: {str(exc)[:90]}...")
    else:
        raise AssertionError("a flipped payload byte was read without an IntegrityError")
    finally:
        ds.close()


def check_missing_extra(paths: list[Path]) -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    else:
        raise AssertionError("torch is installed in the smoke venv; the check needs it absent")
    ds = drt.CachedDataset(paths, reader_config=drt.ReaderConfig(seed=0), runtime=None)
    try:
        ds.to_torch_dataloader(batch_size=4)
    except errors.MissingExtraError as exc:
        assert "pip install 'datasetrt[torch]'" in str(exc), str(exc)
    else:
        raise AssertionError("to_torch_dataloader without torch did not raise MissingExtraError")
    finally:
        ds.close()


def main(argv: list[str]) -> int:
    expected_version, workdir = argv[0], Path(argv[1])
    check_installed(expected_version)
    paths = write(workdir / "caches")
    for start_method in ("fork", "spawn"):
        read_with_workers(paths, start_method)
    check_corruption_detected(workdir / "corrupt")
    check_missing_extra(paths)
    shutil.rmtree(workdir / "caches")
    print("wheel smoke ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
