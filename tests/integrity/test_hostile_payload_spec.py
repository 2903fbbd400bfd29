"""Hostile or malformed `datasetrt.payload_spec` sections: refused at open by the manifest parser
(ManifestJSONError, a RuntimeError, naming manifest.json, the section and the key), in both reader
modes, before a dataset exists. A valid section on an otherwise identical cache opens."""

from __future__ import annotations

import pytest

import datasetrt as drt
from datasetrt.errors import ManifestJSONError
from tests.integrity.corrupt import assert_fault, edit_manifest, manifest_path, probe


def _set_spec(value):
    def edit(doc):
        doc.setdefault("datasetrt", {})["payload_spec"] = value

    return edit


BAD_SPECS = [
    ([1, 2], "expected a map"),
    ("int32", "expected a map"),
    ({"shape": [2]}, "missing field `dtype`"),
    ({"dtype": "int32"}, "missing field `shape`"),
    ({"dtype": "object", "shape": [2]}, "field `dtype`"),
    ({"dtype": "int", "shape": [2]}, "field `dtype`"),
    ({"dtype": "<i4", "shape": [2]}, "field `dtype`"),
    ({"dtype": 5, "shape": [2]}, "field `dtype`"),
    ({"dtype": "int32", "shape": "12"}, "field `shape`"),
    ({"dtype": "int32", "shape": [None, None]}, "at most one dimension"),
    ({"dtype": "int32", "shape": [-1]}, "integers >= 0"),
    ({"dtype": "int32", "shape": [1.5]}, "integers >= 0"),
    ({"dtype": "int32", "shape": [True]}, "integers >= 0"),
    ({"dtype": "int32", "shape": [[2]]}, "integers >= 0"),
    ({"dtype": "int32", "shape": [None, 0]}, "other dimensions must be > 0"),
    ({"dtype": "int32", "shape": [2**62, 4]}, "too large"),
    ({"dtype": "int32", "shape": [2], "order": "F"}, "unknown field `order`"),
]


@pytest.mark.parametrize(("spec", "words"), BAD_SPECS, ids=[str(s)[:40] for s, _ in BAD_SPECS])
def test_bad_payload_spec_is_refused_at_open(opener, fresh_cache, spec, words):
    edit_manifest(fresh_cache, _set_spec(spec))
    for validate in (False, True):
        out = probe(opener, fresh_cache, validate=validate)
        assert_fault(
            out,
            "open",
            ManifestJSONError,
            RuntimeError,
            "JSON error",
            manifest_path(fresh_cache),
            "datasetrt.payload_spec",
            words,
        )


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"dtype": "uint8", "shape": [None]}, drt.PayloadSpec("uint8", (None,))),
        ({"dtype": "complex128", "shape": []}, drt.PayloadSpec("complex128", ())),
    ],
)
def test_valid_payload_spec_opens_and_is_the_datasets(opener, fresh_cache, spec, expected):
    # The template's payloads are 0..148 bytes: every length is a multiple of 1, and no record is
    # read here as typed, so the spec is only parsed and reported.
    edit_manifest(fresh_cache, _set_spec(spec))
    ds = opener.cached_dataset([fresh_cache], reader_config=drt.ReaderConfig(seed=0))
    assert ds.payload_spec == expected
