"""Shared benchmark plumbing: deterministic workloads, repeat-and-median timing, ratio tables.

Speed figures are ratios measured in the same process run against the peers; nothing here asserts
a speed. Medians over repeats, with min and max, because the machine is shared and noisy.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class Measurement:
    """One contender on one workload: `values` are per-repeat rates (higher is better) or seconds."""

    workload: str
    contender: str
    unit: str
    values: list[float] = field(default_factory=list)
    higher_is_better: bool = True

    @property
    def median(self) -> float:
        return statistics.median(self.values)


def repeat(fn: Callable[[], float], repeats: int) -> list[float]:
    """Run `fn` (returns one figure) `repeats` times with a GC between runs."""
    out = []
    for _ in range(repeats):
        gc.collect()
        out.append(fn())
    return out


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class PayloadSource:
    """A CacheSource of `count` payloads of `payload_bytes` each, content (position u64, index u64)
    repeated, as dataset-rt's own benchmark; metadata {benchmark_position: int, wide: str}."""

    def __init__(self, name: str, count: int, payload_bytes: int, make_input: Callable) -> None:
        self.name = name
        self.count = count
        self.payload_bytes = payload_bytes
        self.make_input = make_input

    def __iter__(self):
        reps = self.payload_bytes // 16 + 1
        for i in range(self.count):
            payload = ((i).to_bytes(8, "little") + (i * 7919).to_bytes(8, "little")) * reps
            yield self.make_input(payload[: self.payload_bytes], {"benchmark_position": i, "wide": f"w{i % 97:04d}"})


def machine_facts() -> dict:
    import psutil

    return {
        "cpu_count": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


def ratio_table(measurements: list[Measurement], baseline: str) -> str:
    """Markdown table: one row per (workload, contender), median [min-max], ratio of datasetrt to it."""
    by_workload: dict[str, list[Measurement]] = {}
    for m in measurements:
        by_workload.setdefault(m.workload, []).append(m)
    lines = ["| workload | contender | median | min - max | datasetrt / contender |", "|---|---|---:|---:|---:|"]
    for workload, ms in by_workload.items():
        base = next((m for m in ms if m.contender == baseline), None)
        for m in ms:
            if base is None or not m.values:
                ratio = ""
            elif m.higher_is_better:
                ratio = f"{base.median / m.median:.2f}x"
            else:
                ratio = f"{m.median / base.median:.2f}x"
            lines.append(
                f"| {workload} | {m.contender} | {_fmt(m.median)} {m.unit} | {_fmt(min(m.values))} - {_fmt(max(m.values))} | {ratio} |"
            )
    return "\n".join(lines)


def _fmt(x: float) -> str:
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.4f}"


def save_json(path: Path, measurements: list[Measurement], extra: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": machine_facts(), **extra, "measurements": [asdict(m) for m in measurements]}, indent=2))
