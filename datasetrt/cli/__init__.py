"""The `datasetrt` console command and its subcommands (layer 7): `main` parses and dispatches
(`command.py`); `convert` (caches from files), `demo` (the main job), `inspect` (the shallow report),
`prune` (unpublished caches' objects in an object store) and `pss` (the process-tree memory
sampler, which benchmarks import on its own) each own one subcommand; `remote` holds the storage
flags they share and which caches a path or URL names. `main` loads lazily, so importing a subcommand's module loads only that module.

Boundary: the public API, the format layer and the sources; nothing below imports this package.
"""

from __future__ import annotations

from typing import Any

__all__ = ["main"]


def __getattr__(name: str) -> Any:
    if name == "main":
        from datasetrt.cli.command import main

        globals()["main"] = main
        return main
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
