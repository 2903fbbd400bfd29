"""`CachedDataset.to_torch_map_dataset()` (datasetrt/integrations/torch/mapped.py) with real torch
DataLoaders and the user's own samplers: item i is `ds[i]` of the table it was built on, in the
main process and in fork and spawn workers (which get paths, config and a population snapshot
path, never the table), batches read through `__getitems__`, typed index errors."""

from __future__ import annotations

import gc
import pickle

import polars as pl
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import BatchSampler, DataLoader, Dataset, SubsetRandomSampler  # noqa: E402

import datasetrt as drt  # noqa: E402
from datasetrt.errors import ArgumentTypeError, SampleIndexError  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


def key(sample) -> tuple:
    return (sample.cache_id, sample.sample_id, sample.data, tuple(sorted(sample.metadata.items())))


def keys(batch) -> list:
    return [key(s) for s in batch]


def sample_id(sample) -> int:
    return sample.sample_id


@pytest.fixture
def paths(write_caches):
    return write_caches({"m0": 37, "m1": 26})


def open_ds(paths, update=False):
    ds = drt.CachedDataset(paths, reader_config=drt.ReaderConfig(seed=5), runtime=None)
    if update:  # filtered, reordered, a duplicated row: unlike the physical table
        md = ds.get_metadata()
        ds.update_metadata(pl.concat([md.filter(pl.col("kept")).reverse(), md.head(1)]))
    return ds


def test_items_are_the_tables_rows_and_batches_read_at_once(paths):
    ds = open_ds(paths, update=True)
    mapped = ds.to_torch_map_dataset()
    assert isinstance(mapped, Dataset) and len(mapped) == len(ds.get_metadata())
    assert key(mapped[0]) == key(ds[0]) and key(mapped[-1]) == key(ds[-1])
    picks = [5, 0, 5, len(mapped) - 1]
    assert keys(mapped.__getitems__(picks)) == [key(ds[i]) for i in picks]
    assert keys(mapped.__getitems__([torch.tensor(3), torch.tensor(1)])) == [key(ds[3]), key(ds[1])]
    ds.update_metadata(ds.get_metadata().head(4))  # later tables do not reach a built map dataset
    assert len(mapped) > 4 and len(ds.to_torch_map_dataset()) == 4


def test_transform_and_typed_errors(paths):
    ds = open_ds(paths)
    mapped = ds.to_torch_map_dataset(sample_id)
    assert [mapped[i] for i in (0, 40, -1)] == [0, 3, 25]
    with pytest.raises(SampleIndexError, match="row 63 is out of range for the 63 rows of this map dataset"):
        mapped.__getitems__([1, 63])
    with pytest.raises(ArgumentTypeError, match="dataset indices must be integers"):
        mapped[1.5]
    with pytest.raises(ArgumentTypeError, match="sample_transform_fn must be callable"):
        ds.to_torch_map_dataset(3)


@pytest.mark.parametrize("context", ["fork", "spawn"])
@pytest.mark.parametrize("update", [False, True])
def test_own_sampler_with_workers_reads_the_rows_it_asks_for(paths, context, update):
    ds = open_ds(paths, update=update)
    mapped = ds.to_torch_map_dataset()
    order = list(SubsetRandomSampler(range(len(mapped)), generator=torch.Generator().manual_seed(1)))[:30]
    batches = list(BatchSampler(order, 4, False))  # the user's sampler, drawn once
    expected = [[key(ds[i]) for i in batch] for batch in batches]
    loader = DataLoader(mapped, batch_sampler=batches, num_workers=2, collate_fn=keys, multiprocessing_context=context)
    assert list(loader) == expected
    where = mapped._snapshots.directory
    assert (where is not None) == (update and context == "spawn")  # a physical table ships no snapshot
    del loader, mapped
    gc.collect()
    assert where is None or not where.exists()


def test_a_spawned_copy_reopens_the_caches_from_its_recipe(paths):
    ds = open_ds(paths, update=True)
    mapped = ds.to_torch_map_dataset(sample_id)
    copy = pickle.loads(pickle.dumps(mapped))
    assert copy._dataset is None and len(copy) == len(mapped)
    assert [copy[i] for i in range(len(copy))] == [mapped[i] for i in range(len(mapped))]
    assert pickle.loads(pickle.dumps(copy))[2] == mapped[2]  # a copy of a copy ships the same recipe
