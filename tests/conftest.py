"""Shared fixtures: deterministic sources and small caches written by datasetrt.

`ListSource(name, items)` yields the given (data, metadata) pairs; `sample_items(n, ...)` makes a
deterministic mix of payload sizes and the four metadata kinds.

Hypothesis profiles: `ci` (derandomized: the same examples on every run, no example database)
and `explore` (random examples, Hypothesis's defaults), picked by DATASETRT_HYPOTHESIS_PROFILE;
scripts/test.sh sets `ci`, a bare pytest run explores. Edge cases a property must always cover
are `@example`s, so they run under either profile. Test order is shuffled by pytest-randomly
(dev extra); the seed is printed at the end of every run (`--randomly-seed=N` repeats it,
`-p no:randomly` turns shuffling off).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

import datasetrt as drt

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore")
settings.load_profile(os.environ.get("DATASETRT_HYPOTHESIS_PROFILE", "explore"))


def pytest_terminal_summary(terminalreporter, config):
    """Print how to repeat this run's order and examples, also under -q (which hides the header)."""
    seed = getattr(config.option, "randomly_seed", None)
    if seed is not None and config.pluginmanager.has_plugin("randomly"):
        terminalreporter.write_line(
            f"test order: pytest-randomly seed {seed} (repeat: --randomly-seed={seed}; fixed order: -p no:randomly)"
        )
    terminalreporter.write_line(f"hypothesis profile: {settings.get_current_profile_name()}")


class ListSource:
    """A CacheSource over a list of (data, metadata) items."""

    def __init__(self, name, items):
        self.name = name
        self.items = list(items)

    def __iter__(self):
        for data, metadata in self.items:
            yield drt.CacheInput(data, metadata)

    def __len__(self):
        return len(self.items)


def sample_items(n: int, *, seed: int = 0, payload_bytes: int | None = None, tag: str = "s"):
    """n deterministic (payload, metadata) pairs; payload sizes vary 0..300 unless fixed."""
    items = []
    for i in range(n):
        size = payload_bytes if payload_bytes is not None else (i * 37 + seed) % 301
        payload = (
            bytes((i * 7 + j + seed) % 251 for j in range(size))
            if size < 512
            else (f"{tag}{i}:".encode() * size)[:size]
        )
        meta = {"index": i, "kept": i % 3 != 0, "label": f"{tag}-{i % 5}", "score": i * 0.25 + seed}
        items.append((payload, meta))
    return items


def json_like_items(n: int, *, seed: int = 0, tag: str = "j"):
    """n deterministic (payload, metadata) pairs whose payloads are small, similar JSON-like
    records (~90-130 bytes): the corpus a zstd_dict dictionary is for, large enough to train one
    from 200 records on."""
    items = []
    for i in range(n):
        k = i + seed
        payload = (
            f'{{"id": {k}, "user": "user-{k % 53:03d}", "kind": "{("click", "view", "buy")[k % 3]}", '
            f'"tags": ["t{k % 7}", "u{k % 11}"], "score": {k * 0.25}}}'
        ).encode()
        items.append((payload, {"index": i, "kept": i % 3 != 0, "label": f"{tag}-{i % 5}", "score": i * 0.25 + seed}))
    return items


QUIET = drt.WriterConfig(show_progress=False)


def writer_config(algo: str = "none", **kw) -> drt.WriterConfig:
    return drt.WriterConfig(show_progress=False, shard_compression=drt.ShardCompression(algo=algo), **kw)


@pytest.fixture
def runtime():
    rt = drt.DatasetRuntime(num_workers=2)
    yield rt
    rt.close()


@pytest.fixture
def write_caches(tmp_path, runtime):
    """write_caches({name: n_samples, ...}, algo=...) -> list of cache paths (in dict order)."""

    def _write(spec: dict[str, int], algo: str = "none", base: Path | None = None, **kw) -> list[Path]:
        base = base or tmp_path / "caches"
        sources = [ListSource(name, sample_items(n, seed=k, tag=name)) for k, (name, n) in enumerate(spec.items())]
        results = runtime.write_cache(sources, base, writer_config=writer_config(algo, **kw))
        for r in results:
            assert isinstance(r, drt.CacheWriteSuccess), r
        return [r.path for r in results]

    return _write
