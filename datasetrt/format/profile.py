"""Write profiling: per-stage counters of each source (`StageProfile`) and the
WriterProfilerConfig JSON file (`write_profile`, dataset-rt's layout).

Boundary: counters and one JSON file; knows nothing of what the stages do.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

_UNTIMED = nullcontext()


class StageProfile:
    """Per-stage counters (calls, total_ns, bytes) of one source; a no-op when disabled."""

    STAGES = (
        "compression",
        "disk_write",
        "finish_index",
        "finish_manifest",
        "finish_metadata",
        "ingress_wait",
        "metadata_validate",
        "publish",
        "python_extract",
        "python_next",
        "record_encode",
        "shard_flush",
    )

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.stages = {name: [0, 0, 0] for name in self.STAGES}

    def stage(self, name: str, nbytes: int = 0) -> AbstractContextManager:
        """Time the `with` block as stage `name` (a shared no-op context when disabled: the
        writer enters two per sample)."""
        return self._timed(name, nbytes) if self.enabled else _UNTIMED

    @contextmanager
    def _timed(self, name: str, nbytes: int) -> Iterator[None]:
        start = time.perf_counter_ns()
        try:
            yield
        finally:
            entry = self.stages[name]
            entry[0] += 1
            entry[1] += time.perf_counter_ns() - start
            entry[2] += nbytes

    def add(self, name: str, elapsed_ns: int, nbytes: int = 0) -> None:
        if self.enabled:
            entry = self.stages[name]
            entry[0] += 1
            entry[1] += elapsed_ns
            entry[2] += nbytes

    def to_json(self) -> list[dict]:
        return [
            {"name": name, "calls": c, "total_ns": t, "bytes": b} for name, (c, t, b) in sorted(self.stages.items())
        ]


def write_profile(path: Path, elapsed_ns: int, profiles: list[tuple[str, StageProfile]]) -> None:
    """The WriterProfilerConfig JSON (dataset-rt's layout, format_version 1)."""
    import json

    doc = {
        "format_version": 1,
        "elapsed_ns": elapsed_ns,
        "sources": [{"source_name": name, "stages": p.to_json()} for name, p in profiles],
    }
    Path(path).write_text(json.dumps(doc, indent=2) + "\n")
