"""Manifest migration (migrate.py) and the manifest writes it shares with the writer
(manifest.write_manifest): one on-disk form, atomic replacement, the durability it reports.

v2 caches read and migrated by both libraries are in tests/interop/test_manifest_v2.py.
"""

from __future__ import annotations

import json
import os

import pytest

from datasetrt.format import durable
from datasetrt.format.manifest import manifest_text, parse_manifest, write_manifest
from datasetrt.format.migrate import update_manifests
from datasetrt.format.results import Err, Ok
from tests.conftest import sample_items
from tests.unit.format.sources import write_one


@pytest.fixture
def cache(runtime, tmp_path):
    path, _ = write_one(runtime, tmp_path, "m", sample_items(5), algo="lz4")
    return path


def _as_v2(cache) -> dict:
    doc = json.loads((cache / "manifest.json").read_text())
    v2 = {"format_version": 2, **{k: v for k, v in doc.items() if k not in ("format_version", "cache_id")}}
    (cache / "manifest.json").write_text(json.dumps(v2, indent=2) + "\n")
    return v2


def test_the_writer_wrote_the_one_manifest_form(cache):
    text = (cache / "manifest.json").read_text()
    assert manifest_text(json.loads(text)) == text
    assert parse_manifest(text.encode(), cache).to_json() == text


def test_staged_write_is_in_place_and_not_synced(tmp_path, monkeypatch, cache):
    m = parse_manifest((cache / "manifest.json").read_bytes(), cache)
    synced = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd))
    assert write_manifest(tmp_path, m, durable=False) is False
    assert (tmp_path / "manifest.json").read_text() == m.to_json()
    assert synced == [] and not (tmp_path / "manifest.json.partial").exists()


def test_durable_write_replaces_through_the_partial_file(tmp_path, monkeypatch):
    (tmp_path / "manifest.json").write_text("old")
    steps = []
    real_replace = os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: steps.append("fsync file"))
    monkeypatch.setattr(os, "replace", lambda a, b: (steps.append(("replace", a, b)), real_replace(a, b))[1])
    monkeypatch.setattr(durable, "fsync_path", lambda p: steps.append(("fsync dir", p)))
    assert write_manifest(tmp_path, {"format_version": 3, "name": "café"}) is True
    partial, target = str(tmp_path / "manifest.json.partial"), str(tmp_path / "manifest.json")
    assert steps == ["fsync file", ("replace", partial, target), ("fsync dir", tmp_path)]
    assert (tmp_path / "manifest.json").read_text() == '{\n  "format_version": 3,\n  "name": "café"\n}\n'
    assert os.listdir(tmp_path) == ["manifest.json"]


def test_a_failed_directory_fsync_reports_the_write_as_not_durable(tmp_path, monkeypatch):
    def failing(path):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(durable, "fsync_path", failing)
    assert write_manifest(tmp_path, {"format_version": 3}) is False
    assert json.loads((tmp_path / "manifest.json").read_text()) == {"format_version": 3}


def test_a_failure_before_the_rename_keeps_the_old_manifest(tmp_path, monkeypatch):
    (tmp_path / "manifest.json").write_text("old")

    def failing(a, b):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(OSError, match="No space left"):
        write_manifest(tmp_path, {"format_version": 3})
    assert (tmp_path / "manifest.json").read_text() == "old"


def test_v2_is_rewritten_with_cache_id_first_and_every_key_kept_in_order(cache):
    v2 = _as_v2(cache)
    result = update_manifests([cache], [7], 3)
    assert isinstance(result, Ok)
    assert [(e.path, e.cache_id, e.status) for e in result.value.entries] == [(cache / "manifest.json", 7, "updated")]
    text = (cache / "manifest.json").read_text()
    doc = json.loads(text)
    assert list(doc)[:2] == ["format_version", "cache_id"] and (doc["format_version"], doc["cache_id"]) == (3, 7)
    assert list(doc)[2:] == list(v2)[1:] and {k: doc[k] for k in list(v2)[1:]} == {k: v2[k] for k in list(v2)[1:]}
    assert text == manifest_text(doc)
    assert os.listdir(cache).count("manifest.json.partial") == 0
    again = update_manifests([cache], [7], 3)
    assert [e.status for e in again.value.entries] == ["unchanged"]


def test_migration_reports_unknown_durability_when_the_directory_fsync_fails(cache, monkeypatch):
    _as_v2(cache)

    def failing(path):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(durable, "fsync_path", failing)
    result = update_manifests([cache], [3], 3)
    assert [e.status for e in result.value.entries] == ["durability_unknown"]
    assert json.loads((cache / "manifest.json").read_text())["cache_id"] == 3


def test_a_manifest_that_cannot_be_replaced_is_an_err_with_the_entries_so_far(runtime, tmp_path, monkeypatch):
    first, _ = write_one(runtime, tmp_path, "a", sample_items(3))
    second, _ = write_one(runtime, tmp_path, "b", sample_items(3))
    _as_v2(second)

    def failing(a, b):
        raise OSError(13, "Permission denied")

    monkeypatch.setattr(os, "replace", failing)
    result = update_manifests([first, second], [0, 1], 3)
    assert isinstance(result, Err)
    assert result.error.message == "manifest update failed: [Errno 13] Permission denied"
    assert [e.status for e in result.error.entries] == ["unchanged"]
