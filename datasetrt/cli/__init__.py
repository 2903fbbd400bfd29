"""The `datasetrt` console command and its subcommands (layer 7): `main` parses and dispatches
(`main.py`); `convert` (caches from files), `demo` (the main job), `inspect` (the shallow report)
and `pss` (the process-tree memory sampler) each own one subcommand.

Boundary: the public API, the format layer and the sources; nothing below imports this package.
"""

from datasetrt.cli.main import main

__all__ = ["main"]
