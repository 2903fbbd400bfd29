"""Real signatures (for `help()`, IDEs and `inspect`) that match dataset-rt 0.4.8's where it has the
method: `CachedDataset.to_torch_dataloader` / `to_torch_iterable_dataset` and
`DatasetRuntime.write_cache` (same names, kinds and defaults; datasetrt only adds keywords with
defaults), and that stay equal to the torch adapters they forward to (datasetrt/dataset/cached.py
repeats datasetrt/integrations/torch's signatures so that reading them needs no torch)."""

from __future__ import annotations

import inspect
import pydoc

import dataset_rt as rt

import datasetrt as drt
from datasetrt.integrations.torch import batches, iterable, loader


def shape(func, drop: int = 0) -> list[tuple[str, object, object]]:
    """(name, kind, default) of each parameter of `func` after the first `drop` ones; a default
    that is an object (a config) by its class name, since each library has its own classes."""
    params = list(inspect.signature(func).parameters.values())[drop:]
    return [(p.name, p.kind, _plain(p.default)) for p in params]


def _plain(default: object) -> object:
    if default is inspect.Parameter.empty or isinstance(default, (str, int, float, bool, type(None))):
        return default
    return type(default).__name__


def test_to_torch_dataloader_has_dataset_rts_signature_and_no_kwargs():
    ours = shape(drt.CachedDataset.to_torch_dataloader)
    assert ours == shape(rt.CachedDataset.to_torch_dataloader)
    assert all(kind is not inspect.Parameter.VAR_KEYWORD for _, kind, _ in ours)
    assert ours[1:] == shape(loader.to_torch_dataloader, drop=1)  # `self` where the adapter has `dataset`
    text = pydoc.render_doc(drt.CachedDataset.to_torch_dataloader, renderer=pydoc.plaintext)
    assert "batch_size: 'int' = 1" in text and "multiprocessing_context: 'Any' = 'spawn'" in text


def test_to_torch_batches_and_iterable_dataset_forward_their_adapters_signatures():
    assert shape(drt.CachedDataset.to_torch_batches, drop=1) == shape(batches.to_torch_batches, drop=1)
    assert shape(drt.CachedDataset.to_torch_iterable_dataset) == shape(rt.CachedDataset.to_torch_iterable_dataset)
    for method, returned in [
        (drt.CachedDataset.to_torch_dataloader, loader.DatasetRTDataLoader),
        (drt.CachedDataset.to_torch_batches, batches.DatasetRTBatchLoader),
        (drt.CachedDataset.to_torch_iterable_dataset, iterable.CachedIterableDataset),
    ]:  # annotations name the classes (imported for type checkers only: the core never imports torch)
        assert returned.__name__ in inspect.signature(method).return_annotation.split(" | ")


def test_write_cache_keeps_dataset_rts_parameters_and_adds_if_exists():
    theirs = shape(rt.DatasetRuntime.write_cache)
    ours = shape(drt.DatasetRuntime.write_cache)
    assert ours[: len(theirs)] == theirs
    assert ours[len(theirs) :] == [("if_exists", inspect.Parameter.KEYWORD_ONLY, "error")]
