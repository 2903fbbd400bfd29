"""Hugging Face source (datasetrt/sources/hf.py) on datasets built in the test (never downloaded);
skipped only when the `hf` extra (`datasets`) is not installed."""

from __future__ import annotations

import pytest

from datasetrt import PayloadSpec
from datasetrt.errors import ArgumentTypeError, SourceInputError
from datasetrt.sources import HFDatasetSource

datasets = pytest.importorskip("datasets")


def make(n: int = 50):
    return datasets.Dataset.from_dict(
        {
            "text": [f"text {i}" * (i % 4) for i in range(n)],
            "label": [i % 5 for i in range(n)],
            "ids": [list(range(i % 6)) for i in range(n)],
        },
        features=datasets.Features(
            {
                "text": datasets.Value("string"),
                "label": datasets.ClassLabel(num_classes=5),
                "ids": datasets.Sequence(datasets.Value("int32")),
            }
        ),
    )


def test_dataset_rows_in_its_order_after_shuffle_and_select():
    ds = make().shuffle(seed=3).select(range(10, 40))
    source = HFDatasetSource("h", ds, payload="text", metadata=["label"], batch_rows=7)
    out = [(bytes(memoryview(d)), m) for d, m in source]
    assert len(source) == 30
    assert out == [(r["text"].encode(), {"label": r["label"]}) for r in ds]


def test_sequence_feature_is_a_typed_payload():
    ds = make(20)
    source = HFDatasetSource("h", ds, payload="ids", metadata=["label"])
    out = list(source)
    assert source.payload_spec == PayloadSpec("int32", (None,))
    assert [d.tolist() for d, _ in out] == ds["ids"]


def test_iterable_dataset():
    ds = make(30).to_iterable_dataset(num_shards=3)
    out = list(HFDatasetSource("it", ds, payload="text", metadata=["label"], batch_rows=4))
    assert [bytes(memoryview(d)) for d, _ in out] == [r["text"].encode() for r in make(30)]


def test_null_payload_names_the_row_and_wrong_objects_are_refused():
    ds = datasets.Dataset.from_dict({"text": ["a", "b", None, "d"], "n": [1, 2, 3, 4]})
    with pytest.raises(SourceInputError) as info:
        list(HFDatasetSource("h", ds, payload="text", batch_rows=2))
    assert str(info.value) == "Hugging Face dataset of source 'h': row 2: payload column 'text' (string) is null"
    with pytest.raises(ArgumentTypeError):
        HFDatasetSource("h", [1, 2], payload="text")


def test_image_feature_payload_is_the_encoded_file():
    images = [b"\x89PNG\r\n\x1a\n" + bytes([i]) * (10 + i) for i in range(3)]  # stored as given, never decoded
    ds = datasets.Dataset.from_dict(
        {"image": [{"bytes": b, "path": None} for b in images], "label": [0, 1, 2]},
        features=datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")}),
    )
    out = [(bytes(memoryview(d)), m) for d, m in HFDatasetSource("img", ds, payload="image")]
    assert out == [(b, {"label": i}) for i, b in enumerate(images)]
    by_path = datasets.Dataset.from_dict(
        {"image": [{"bytes": None, "path": "/nowhere/x.png"}], "label": [0]}, features=ds.features
    )
    with pytest.raises(
        SourceInputError, match=r"row 0: payload column 'image' .* has no bytes \(a file stored by path only\)"
    ):
        list(HFDatasetSource("img", by_path, payload="image"))


def test_a_dataset_dict_is_refused_when_built_naming_its_splits():
    """`load_dataset` without `split=` gives a DatasetDict: refused at once (not at write time)."""
    splits = datasets.DatasetDict({"train": make(4), "test": make(2)})
    with pytest.raises(ArgumentTypeError) as info:
        HFDatasetSource("h", splits, payload="text")
    assert str(info.value) == (
        "dataset must be a datasets.Dataset or IterableDataset, got a DatasetDict of splits "
        "['train', 'test']: pass one split, e.g. dataset['train'], or one source per split"
    )
    streaming = datasets.IterableDatasetDict({"train": make(4).to_iterable_dataset()})
    with pytest.raises(ArgumentTypeError, match=r"IterableDatasetDict of splits \['train'\]"):
        HFDatasetSource("h", streaming, payload="text")
    assert len(list(HFDatasetSource("h", splits["test"], payload="text", metadata=["label"]))) == 2
