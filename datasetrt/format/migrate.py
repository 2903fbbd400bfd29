"""Manifest migration: rewrite format_version 2 manifests as v3, atomically per manifest.

Boundary: manifest.json files of caches the caller has opened; knows nothing of datasets, tables or
sampling. The caller supplies each cache's identity (for v2 caches: its position in the dataset's
paths, the id readers already gave it), so a migrated cache keeps the cache_id it was read with.

Per manifest: a v3 manifest is left alone ("unchanged"); a v2 one is rewritten with
`format_version: 3` and `cache_id` first, every other key kept in order, and replaced atomically
by `manifest.write_manifest` (through `manifest.json.partial`, fsynced, renamed over the manifest,
then the cache directory fsynced: "updated"; "durability_unknown" when that directory fsync
fails). The first failure stops the run and is returned with the entries done so far; nothing is
raised for bad files.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from datasetrt.format.layout import MANIFEST_NAME
from datasetrt.format.manifest import write_manifest
from datasetrt.format.results import (
    AbsentManifestTarget,
    Err,
    ManifestUpdateEntry,
    ManifestUpdateError,
    ManifestUpdateReport,
    Ok,
)


def update_manifests(cache_dirs: Sequence[Path], cache_ids: Sequence[int], version: Any) -> Ok | Err:
    """Migrate the manifests of `cache_dirs` (cache_ids[k] is cache k's identity) to `version`
    (only the integer 3 is a migration target). O(caches) file rewrites.

    Returns Ok(ManifestUpdateReport) with one entry per cache, or Err(ManifestUpdateError) for an
    unsupported target, two paths naming the same manifest, or the first manifest that cannot be
    read, parsed or replaced (its entries so far attached).
    """
    if type(version) is not int or version != 3:
        return Err(
            ManifestUpdateError(
                AbsentManifestTarget("unsupported migration request"),
                "unsupported manifest migration target; expected integer 3",
            )
        )
    entries: list[ManifestUpdateEntry] = []
    targets = [Path(d).resolve() / MANIFEST_NAME for d in cache_dirs]
    seen: set[Path] = set()
    for target in targets:
        if target in seen:
            return Err(ManifestUpdateError(target, "duplicate migration target or cache_id", ()))
        seen.add(target)
    for path, cache_id in zip(targets, cache_ids):
        cache_id = int(cache_id)
        try:
            doc = json.loads(path.read_text())
            if doc.get("format_version") == 3:
                entries.append(ManifestUpdateEntry(path, cache_id, "unchanged"))
                continue
            migrated = {"format_version": 3, "cache_id": cache_id}
            migrated.update({k: v for k, v in doc.items() if k not in ("format_version", "cache_id")})
            durable = write_manifest(path.parent, migrated)
            status: Literal["updated", "durability_unknown"] = "updated" if durable else "durability_unknown"
            entries.append(ManifestUpdateEntry(path, cache_id, status))
        except (OSError, ValueError) as exc:
            return Err(ManifestUpdateError(path, f"manifest update failed: {exc}", tuple(entries)))
    return Ok(ManifestUpdateReport(tuple(entries)))
