"""Typed batches: `to_numpy` / `to_torch` / DLPack / `columns` on caches written with a
PayloadSpec, every codec, dense and ragged, the fixed-length projection, in-process and through
reader workers; untyped caches read as ragged bytes; release and `with`."""

from __future__ import annotations

import numpy as np
import pytest

import datasetrt as drt
from datasetrt.errors import ArgumentTypeError, BatchReleasedError, ConfigError
from tests.conftest import ListSource, writer_config

CODECS = ["none", "lz4", "zstd", "zstd_dict"]


@pytest.fixture(scope="module")
def workers():
    rt = drt.DatasetRuntime(num_workers=2, start_method="fork")
    rt.start_workers()  # batches come from the workers, not the in-process head start
    yield rt
    rt.close()


def _dense_items(n):
    return [(np.arange(i, i + 24, dtype=np.float32).reshape(2, 3, 4), {"i": i, "score": i / 2}) for i in range(n)]


def _ragged_items(n, axis_last=False):
    rng = np.random.default_rng(7)
    out = []
    for i in range(n):
        k = int(rng.integers(0, 9))
        arr = np.arange(i * 100, i * 100 + 3 * k, dtype=np.int64).reshape((3, k) if axis_last else (k, 3))
        out.append((arr, {"i": i, "score": float(k)}))
    return out


def _cache(tmp_path, items, spec, algo):
    with drt.DatasetRuntime(num_workers=1) as rt:
        [res] = rt.write_cache(
            [ListSource(f"c{algo}", items)], tmp_path / algo, writer_config=writer_config(algo, payload_spec=spec)
        )
    assert isinstance(res, drt.CacheWriteSuccess), res
    return res.path


def _open(path, runtime, shuffle=False):
    return drt.CachedDataset([path], reader_config=drt.ReaderConfig(seed=3, shuffle=shuffle), runtime=runtime)


def _expected(ds, spec):
    ref = drt.CachedDataset(ds.cache_paths, reader_config=ds.reader_config)
    return [spec.decode(s.data) for s in ref]


@pytest.mark.parametrize("algo", CODECS)
@pytest.mark.parametrize("parallel", [False, True], ids=["inline", "workers"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_dense_to_numpy_torch_dlpack(tmp_path, workers, algo, parallel, shuffle):
    torch = pytest.importorskip("torch")
    spec = drt.PayloadSpec("float32", (2, 3, 4))
    ds = _open(_cache(tmp_path, _dense_items(70), spec, algo), workers if parallel else None, shuffle)
    want = np.stack(_expected(ds, spec))
    got, position = [], 0
    for batch in ds.iter_batches(16):
        arr = batch.to_numpy()
        assert arr.shape == (len(batch), 2, 3, 4) and arr.dtype == np.float32
        assert np.shares_memory(arr, batch.data)  # a view, not a copy
        tensor = batch.to_torch()
        assert tensor.dtype == torch.float32 and tensor.data_ptr() == arr.ctypes.data
        assert torch.equal(torch.from_dlpack(batch), tensor) and np.array_equal(np.from_dlpack(batch), arr)
        assert batch.__dlpack_device__() == (1, 0)
        assert batch.columns(["i", "score"])["score"].tolist() == [float(v) / 2 for v in batch.columns(["i"])["i"]]
        got.append(arr.copy())
        position += len(batch)
    assert position == 70 and np.array_equal(np.concatenate(got), want)


@pytest.mark.parametrize("algo", CODECS)
@pytest.mark.parametrize("parallel", [False, True], ids=["inline", "workers"])
@pytest.mark.parametrize("axis_last", [False, True], ids=["ragged-first", "ragged-last"])
def test_ragged_values_offsets_shapes_and_projection(tmp_path, workers, algo, parallel, axis_last):
    spec = drt.PayloadSpec("int64", (3, None) if axis_last else (None, 3))
    ds = _open(_cache(tmp_path, _ragged_items(45, axis_last), spec, algo), workers if parallel else None)
    want = _expected(ds, spec)
    axis = 1 if axis_last else 0
    position = 0
    for batch in ds.iter_batches(8):
        values, offsets, shapes = batch.to_numpy()
        n = len(batch)
        mine = want[position : position + n]
        assert offsets.dtype == np.int64 and offsets.tolist() == np.cumsum([0] + [m.shape[axis] for m in mine]).tolist()
        assert shapes.dtype == np.int64 and shapes.tolist() == [list(m.shape) for m in mine]
        flat = values.reshape(-1)
        for i, m in enumerate(mine):
            assert np.array_equal(flat[offsets[i] * 3 : offsets[i + 1] * 3].reshape(shapes[i]), m)
        if not axis_last:
            assert values.shape == (offsets[-1], 3)
        fixed = batch.to_numpy(length=4, pad=-7)
        assert fixed.shape == ((n, 3, 4) if axis_last else (n, 4, 3))
        for i, m in enumerate(mine):
            k = m.shape[axis]
            head = np.take(fixed[i], range(min(k, 4)), axis=axis)
            assert np.array_equal(head, np.take(m, range(min(k, 4)), axis=axis))
            assert (np.take(fixed[i], range(min(k, 4), 4), axis=axis) == -7).all()
        position += n
    assert position == 45


def test_projection_to_the_records_own_length_is_a_view(tmp_path):
    spec = drt.PayloadSpec("int32", (None,))
    items = [(np.full(6, i, dtype=np.int32), {"i": i}) for i in range(10)]
    ds = _open(_cache(tmp_path, items, spec, "none"), None)
    [batch] = list(ds.iter_batches(10))
    same = batch.to_numpy(length=6)
    assert np.shares_memory(same, batch.data) and same.tolist() == [[i] * 6 for i in range(10)]
    short = batch.to_numpy(length=2)
    assert not np.shares_memory(short, batch.data) and short.tolist() == [[i] * 2 for i in range(10)]
    assert batch.to_numpy(length=0).shape == (10, 0)


def test_untyped_batches_read_as_ragged_bytes(tmp_path, workers):
    items = [(bytes(range(i)), {"i": i}) for i in range(20)]
    with drt.DatasetRuntime(num_workers=1) as rt:
        [res] = rt.write_cache([ListSource("u", items)], tmp_path, writer_config=writer_config("lz4"))
    ds = _open(res.path, workers)
    [batch] = list(ds.iter_batches(20))
    values, offsets, shapes = batch.to_numpy()
    assert values.dtype == np.uint8 and offsets.tolist() == batch.offsets.tolist()
    assert shapes[:, 0].tolist() == list(range(20))
    assert batch.to_numpy(length=3, pad=255)[1].tolist() == [0, 255, 255]
    with pytest.raises(ConfigError, match="ragged payloads"):
        batch.__dlpack__()


def test_errors_name_what_is_wrong(tmp_path):
    spec = drt.PayloadSpec("float32", (2, 3, 4))
    ds = _open(_cache(tmp_path, _dense_items(4), spec, "none"), None)
    [batch] = list(ds.iter_batches(4))
    with pytest.raises(ConfigError, match=r"float32\[2, 3, 4\] is dense"):
        batch.to_numpy(length=3)
    with pytest.raises(ConfigError, match="no metadata column 'nope'"):
        batch.columns(["nope"])
    with pytest.raises(ArgumentTypeError, match="list of column names"):
        batch.columns("i")
    [bare] = list(ds.iter_batches(4, with_metadata=False))
    with pytest.raises(ConfigError, match="no metadata"):
        bare.columns(["i"])
    ragged = _open(_cache(tmp_path / "r", _ragged_items(4), drt.PayloadSpec("int64", (None, 3)), "none"), None)
    [rb] = list(ragged.iter_batches(4))
    with pytest.raises(ConfigError, match="pad=.* is not a int64 value"):
        rb.to_numpy(length=2, pad="x")
    with pytest.raises(ConfigError, match="length must be >= 0"):
        rb.to_numpy(length=-1)
    with pytest.raises(ArgumentTypeError, match="length must be an integer"):
        rb.to_numpy(length=2.0)


def test_release_and_with(tmp_path):
    spec = drt.PayloadSpec("float32", (2, 3, 4))
    ds = _open(_cache(tmp_path, _dense_items(8), spec, "none"), None)
    first, second = ds.iter_batches(4)
    kept = first.to_numpy()
    first.release()
    assert first.released and "released" in repr(first)
    for use in (lambda: first.data, lambda: first.to_numpy(), lambda: first.payload(0)):
        with pytest.raises(BatchReleasedError):
            use()
    assert kept[0].tolist() == _dense_items(1)[0][0].tolist()  # a view made before release stays valid
    with second as b:
        assert b.to_numpy().shape == (4, 2, 3, 4)
    assert second.released
