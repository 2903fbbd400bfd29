"""format_version 2 manifests (no cache_id): positional ids on load, and `update_manifests(3)`.

A v2 cache takes its position in `paths` as cache_id; a v3 cache keeps its persisted id, and the
two mix. `update_manifests(3)` rewrites v2 manifests as v3 with cache_id = position (status
"updated"), leaves v3 ones alone ("unchanged"), and refuses any other target with an Err value.
"""

from __future__ import annotations

import json
import shutil

import pytest

from tests.interop._interop import (
    LIBS,
    identities,
    open_ds,
    plain_items,
    read_manifest,
    rewrite_as_v2,
    take,
    write,
)

pytestmark = pytest.mark.interop

SPEC = {"old": plain_items(14, "old"), "new": plain_items(9, "new")}
BAD_TARGET_MESSAGE = "unsupported manifest migration target; expected integer 3"


@pytest.fixture(params=["rt", "drt"], ids=["written-by-rt", "written-by-drt"])
def caches(request, runtimes, tmp_path):
    """{"old": v2 cache path, "new": v3 cache path, "new_id": its cache_id, "v2_doc": the v2 manifest}."""
    label = request.param
    old, new = write(runtimes[label], LIBS[label], SPEC, tmp_path / "caches")
    rewrite_as_v2(old)
    return {"old": old, "new": new, "new_id": read_manifest(new)["cache_id"], "v2_doc": read_manifest(old)}


def _pair(runtimes, paths, **reader_kw):
    return {label: open_ds(runtimes[label], lib, paths, **reader_kw) for label, lib in LIBS.items()}


def test_v2_manifest_shape(caches):
    doc = caches["v2_doc"]
    assert doc["format_version"] == 2 and "cache_id" not in doc
    assert (caches["old"] / "manifest.json").read_text().startswith('{\n  "format_version": 2,\n')


@pytest.mark.parametrize("order", ["v2-first", "v3-first"])
@pytest.mark.parametrize("validate", [False, True])
def test_v2_loads_with_positional_id_mixed_with_v3(runtimes, caches, order, validate):
    paths = [caches["old"], caches["new"]] if order == "v2-first" else [caches["new"], caches["old"]]
    old_id = paths.index(caches["old"])
    for shuffle in (False, True):
        pair = _pair(runtimes, paths, shuffle=shuffle, seed=31, validate_cache=validate)
        got = {label: take(ds, iterators=2) for label, ds in pair.items()}
        assert got["drt"] == got["rt"]
        assert {cid for cid, _ in identities(got["rt"])} == {old_id, caches["new_id"]}
        for ds in pair.values():
            ids = ds.get_metadata()["cache_id"].unique(maintain_order=True).to_list()
            assert ids == [old_id if p == caches["old"] else caches["new_id"] for p in paths]
            assert ds.get_item(old_id, 13).data == SPEC["old"][13][0]


def test_datasetrt_migration_then_dataset_rt_loads_same_ids(runtimes, caches):
    paths = [caches["new"], caches["old"]]  # the v2 cache sits at position 1
    before = {label: take(ds) for label, ds in _pair(runtimes, paths, shuffle=True, seed=2).items()}
    assert before["drt"] == before["rt"]

    ds = open_ds(runtimes["drt"], LIBS["drt"], paths)
    first = ds.update_manifests(3)
    assert isinstance(first, LIBS["drt"].Ok), first
    entries = [(e.path, e.cache_id, e.status) for e in first.value.entries]
    assert entries == [
        (caches["new"] / "manifest.json", caches["new_id"], "unchanged"),
        (caches["old"] / "manifest.json", 1, "updated"),
    ]
    second = ds.update_manifests(3)
    assert [(e.cache_id, e.status) for e in second.value.entries] == [(caches["new_id"], "unchanged"), (1, "unchanged")]

    migrated = read_manifest(caches["old"])
    assert list(migrated)[:2] == ["format_version", "cache_id"]
    assert (migrated.pop("format_version"), migrated.pop("cache_id")) == (3, 1)
    assert migrated == {k: v for k, v in caches["v2_doc"].items() if k != "format_version"}

    # The id is now persisted: position no longer matters, for either library.
    after = {label: take(ds) for label, ds in _pair(runtimes, paths, shuffle=True, seed=2, validate_cache=True).items()}
    assert after["rt"] == after["drt"] == before["rt"]
    for label, lib in LIBS.items():
        alone = open_ds(runtimes[label], lib, [caches["old"]], shuffle=False)
        assert {cid for cid, _ in identities(take(alone))} == {1}


def test_migrations_by_both_libraries_agree(runtimes, caches, tmp_path):
    copies = {}
    for label in LIBS:
        copies[label] = [shutil.copytree(p, tmp_path / label / p.name) for p in (caches["new"], caches["old"])]
    reports = {}
    for label, lib in LIBS.items():
        result = open_ds(runtimes[label], lib, copies[label]).update_manifests(3)
        assert type(result).__name__ == "Ok", result
        reports[label] = [(e.path.relative_to(tmp_path / label), e.cache_id, e.status) for e in result.value.entries]
    assert reports["drt"] == reports["rt"]
    rt_doc, drt_doc = read_manifest(copies["rt"][1]), read_manifest(copies["drt"][1])
    assert list(drt_doc) == list(rt_doc)
    assert drt_doc == rt_doc


@pytest.mark.parametrize("target", [2, 4, "3", 3.0, True, None], ids=repr)
@pytest.mark.parametrize("label", list(LIBS))
def test_bad_migration_target_is_an_err_value(runtimes, caches, label, target):
    lib = LIBS[label]
    ds = open_ds(runtimes[label], lib, [caches["old"], caches["new"]])
    result = ds.update_manifests(target)
    assert isinstance(result, lib.Err), result
    error = result.error
    assert isinstance(error, lib.ManifestUpdateError)
    assert error.message == BAD_TARGET_MESSAGE
    assert error.path == lib.AbsentManifestTarget("unsupported migration request")
    assert tuple(error.entries) == ()
    assert read_manifest(caches["old"]) == caches["v2_doc"]


@pytest.mark.parametrize("caches", ["rt"], indirect=True)
def test_entry_path_is_canonical_for_relative_and_symlinked_paths(runtimes, caches, tmp_path, monkeypatch):
    (tmp_path / "link").symlink_to(caches["old"].parent, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    v2_bytes = (caches["old"] / "manifest.json").read_bytes()
    reports = {}
    for label, lib in LIBS.items():
        (caches["old"] / "manifest.json").write_bytes(v2_bytes)
        result = open_ds(runtimes[label], lib, ["link/./old"]).update_manifests(3)
        reports[label] = [(e.path, e.status) for e in result.value.entries]
    assert reports["rt"] == [(caches["old"].resolve() / "manifest.json", "updated")]
    assert reports["drt"] == reports["rt"]


def test_migrated_manifest_text_matches_dataset_rt(runtimes, tmp_path):
    """serde_json (and datasetrt's own writer) keep non-ASCII text raw; the migration must too."""
    spec = {"données-😀": plain_items(4, "u")}
    (v2,) = write(runtimes["rt"], LIBS["rt"], spec, tmp_path / "src")
    rewrite_as_v2(v2)
    texts = {}
    for label, lib in LIBS.items():
        copy = shutil.copytree(v2, tmp_path / label / v2.name)
        assert type(open_ds(runtimes[label], lib, [copy]).update_manifests(3)).__name__ == "Ok"
        texts[label] = (copy / "manifest.json").read_text(encoding="utf-8")
        reread = open_ds(runtimes["rt"], LIBS["rt"], [copy], shuffle=False)  # both forms parse
        assert {cid for cid, _ in identities(take(reread))} == {0}
    assert texts["drt"].rstrip("\n") == texts["rt"]  # datasetrt ends its manifests with a newline


def test_v2_identity_edge_cases_match(runtimes, caches):
    """The same v2 cache twice gets two positional ids; a stale cache_id in a v2 manifest is ignored;
    a v3 id equal to a v2 position is a duplicate on both libraries."""
    old, new = caches["old"], caches["new"]
    stale = dict(caches["v2_doc"], cache_id=77)
    (old / "manifest.json").write_text(json.dumps(stale, indent=2))
    for paths in ([old, old], [new, old, old]):
        got = {label: take(ds) for label, ds in _pair(runtimes, paths, shuffle=True, seed=6).items()}
        assert got["drt"] == got["rt"]
        assert {cid for cid, _ in identities(got["rt"])} == {k for k, p in enumerate(paths) if p == old} | (
            {caches["new_id"]} if new in paths else set()
        )
    v3_id1 = dict(read_manifest(new), cache_id=1)
    (new / "manifest.json").write_text(json.dumps(v3_id1, indent=2))
    for label, lib in LIBS.items():
        with pytest.raises(ValueError, match="duplicate cache_id 1"):
            open_ds(runtimes[label], lib, [new, old])


@pytest.mark.parametrize("caches", ["rt"], indirect=True)
def test_duplicate_migration_target_is_refused(runtimes, caches):
    old, new = caches["old"], caches["new"]
    results = {}
    for label, lib in LIBS.items():
        (old / "manifest.json").write_text(json.dumps(caches["v2_doc"], indent=2))
        result = open_ds(runtimes[label], lib, [new, old, old]).update_manifests(3)
        assert read_manifest(old) == caches["v2_doc"], label  # nothing written
        results[label] = result
    assert isinstance(results["rt"], LIBS["rt"].Err)
    error = results["rt"].error
    assert (error.path, error.message, tuple(error.entries)) == (
        old / "manifest.json",
        "duplicate migration target or cache_id",
        (),
    )
    assert isinstance(results["drt"], LIBS["drt"].Err)
    got = results["drt"].error
    assert (got.path, got.message, tuple(got.entries)) == (error.path, error.message, ())
