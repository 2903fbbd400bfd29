"""`SampleBatch.to_jax`: typed batches as `jax.Array`s through DLPack, dense and ragged, the
fixed-length projection, in-process and through reader workers. Zero-copy is checked by buffer
address (`unsafe_buffer_pointer()` equal to the numpy view's): ring slot payloads are 64-byte
aligned, so a batch from the workers is imported in place; a private in-process buffer may not be
aligned, and then JAX copies (the values are checked either way). 64-bit payloads need
`jax_enable_x64`. (Without jax installed: tests/unit/integrations/test_missing_extras.py.)

Each check runs in a fresh interpreter (`_in_fresh_interpreter`): JAX's CPU backend starts threads
and from then on warns at every os.fork(), so the pytest process, whose other tests fork reader
workers, never initialises it. A check starts its reader workers before it imports JAX.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import datasetrt as drt
from datasetrt.errors import ConfigError
from tests.conftest import ListSource, writer_config

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax is not installed (dev extra)")


def _in_fresh_interpreter(check: str, *args) -> None:
    code = f"import sys; from tests.integration.test_jax_batches import {check}; {check}(*sys.argv[1:])"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-c", code, *map(str, args)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"{check} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"


def _workers():
    rt = drt.DatasetRuntime(num_workers=2, start_method="fork")
    rt.start_workers()  # before JAX starts its threads
    return rt


def _cache(tmp_path, items, spec, algo="lz4"):
    with drt.DatasetRuntime(num_workers=1) as rt:
        [res] = rt.write_cache(
            [ListSource(f"j{algo}", items)], tmp_path / algo, writer_config=writer_config(algo, payload_spec=spec)
        )
    assert isinstance(res, drt.CacheWriteSuccess), res
    return res.path


def _open(path, runtime):
    return drt.CachedDataset([path], reader_config=drt.ReaderConfig(seed=5, shuffle=True), runtime=runtime)


def _dense(n):
    return [(np.arange(i, i + 24, dtype=np.float32).reshape(2, 3, 4), {"i": i}) for i in range(n)]


@pytest.mark.parametrize("parallel", [False, True], ids=["inline", "workers"])
def test_dense_batches_as_jax_arrays_in_place_from_the_ring(tmp_path, parallel):
    _in_fresh_interpreter("check_dense", tmp_path, parallel)


def check_dense(tmp: str, parallel: str) -> None:
    tmp_path, parallel = Path(tmp), parallel == "True"
    spec = drt.PayloadSpec("float32", (2, 3, 4))
    workers = _workers() if parallel else None
    ds = _open(_cache(tmp_path, _dense(50), spec), workers)
    import jax

    kept, want, in_place = [], [], 0
    for batch in ds.iter_batches(16):
        arr = batch.to_numpy()
        x = batch.to_jax()
        assert isinstance(x, jax.Array) and x.dtype == np.float32 and x.shape == (len(batch), 2, 3, 4)
        assert x.devices() == {jax.devices("cpu")[0]}
        in_place += x.unsafe_buffer_pointer() == arr.ctypes.data
        want.append(arr.copy())
        kept.append(x)  # a zero-copy array keeps its ring slot leased: later batches must not overwrite it
        batch.release()
    assert np.array_equal(np.concatenate([np.asarray(x) for x in kept]), np.concatenate(want))
    if parallel:
        assert in_place == len(kept) == 4  # every ring slot payload starts 64-byte aligned
        del kept
        ds.close()
        workers.close()


@pytest.mark.parametrize("axis_last", [False, True], ids=["ragged-first", "ragged-last"])
def test_ragged_and_projected_batches(tmp_path, axis_last):
    _in_fresh_interpreter("check_ragged", tmp_path, axis_last)


def check_ragged(tmp: str, axis_last: str) -> None:
    tmp_path, axis_last = Path(tmp), axis_last == "True"
    workers = _workers()
    rng = np.random.default_rng(3)
    items = []
    for i in range(30):
        k = int(rng.integers(0, 7))
        items.append((np.full((3, k) if axis_last else (k, 3), i, dtype=np.int32), {"i": i}))
    spec = drt.PayloadSpec("int32", (3, None) if axis_last else (None, 3))
    ds = _open(_cache(tmp_path, items, spec), workers)
    import jax

    for batch in ds.iter_batches(8):
        values, offsets, shapes = batch.to_numpy()
        jv, jo, js = batch.to_jax()
        assert all(isinstance(a, jax.Array) for a in (jv, jo, js))
        assert jv.unsafe_buffer_pointer() == values.ctypes.data  # values: a view of the ring slot
        assert np.array_equal(np.asarray(jv), values) and np.asarray(jo).tolist() == offsets.tolist()
        assert np.asarray(js).tolist() == shapes.tolist()
        fixed = batch.to_numpy(length=4, pad=-1)
        jfixed = batch.to_jax(length=4, pad=-1)
        assert np.array_equal(np.asarray(jfixed), fixed)
    # a projection is a new array, allocated 64-byte aligned: JAX imports it in place too
    [whole] = list(_open(ds.cache_paths[0], None).iter_batches(30))
    projected = whole.to_jax(length=2, pad=0)
    assert projected.shape == ((30, 3, 2) if axis_last else (30, 2, 3))
    assert projected.unsafe_buffer_pointer() % 64 == 0
    ds.close()
    workers.close()


def test_64_bit_payloads_need_jax_x64(tmp_path):
    _in_fresh_interpreter("check_64_bit", tmp_path)


def check_64_bit(tmp: str) -> None:
    import jax

    tmp_path = Path(tmp)
    items = [(np.array([2**40 + i, -i], dtype=np.int64), {"i": i}) for i in range(6)]
    ds = _open(_cache(tmp_path, items, drt.PayloadSpec("int64", (2,)), "none"), None)
    [batch] = list(ds.iter_batches(6))
    with pytest.raises(ConfigError, match=r"int64 payloads need 64-bit JAX types.*jax_enable_x64"):
        batch.to_jax()  # JAX would narrow 2**40 to 0
    with jax.enable_x64(True):
        x = batch.to_jax()
        assert x.dtype == np.int64 and np.asarray(x).tolist() == batch.to_numpy().tolist()


def test_untyped_batches_read_as_ragged_bytes(tmp_path):
    _in_fresh_interpreter("check_untyped", tmp_path)


def check_untyped(tmp: str) -> None:
    tmp_path = Path(tmp)
    items = [(bytes(range(i)), {"i": i}) for i in range(12)]
    with drt.DatasetRuntime(num_workers=1) as rt:
        [res] = rt.write_cache([ListSource("u", items)], tmp_path, writer_config=writer_config("none"))
    [batch] = list(_open(res.path, None).iter_batches(12))
    values, offsets, _shapes = batch.to_jax()
    assert values.dtype == np.uint8 and np.asarray(offsets).tolist() == batch.offsets.tolist()
    assert np.asarray(values).tobytes() == bytes(batch.data[: batch.offsets[-1]])
