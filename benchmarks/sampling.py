"""Planning throughput (plan positions per second) of the sampling modes, in one run: dataset-rt's
shuffled draws (uniform over physical rows, and weighted over an active table), exactly-once
epochs (unit and repeat counts), a 3-stream mixture (0.5 / 0.3 / 0.2 over streams of very
different sizes) and a 3-stage curriculum. Planning only: no payload I/O (the reader benchmarks
measure reads). Each contender plans the same number of positions in blocks of the reader's
sizes (256 per sample, 4096 per batch task), from a position far into the plan.

Usage: python -m benchmarks.sampling [--quick] [--repeats R] [--rows N]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks.common import Measurement, machine_facts, ratio_table, repeat, save_json, timed
from datasetrt.sampling import Curriculum, CurriculumPlan, EpochPermutation, Mixture, MixturePlan, Stage, Stream, StreamRows
from datasetrt.sampling.planner import ActiveRows, Population, Window
from datasetrt.table.catalog import CacheCatalog

SEED = 20240601
BASELINE = "shuffled (uniform draws)"


def contenders(rows: int) -> dict[str, Callable[[int, int], np.ndarray]]:
    """name -> rows(first, count) over a population of `rows` rows."""
    catalog = CacheCatalog([1], [rows], ["bench"])
    weights = (np.arange(rows) % 3 + 1).astype(np.float64)
    active = ActiveRows(np.zeros(rows, dtype=np.int64), np.arange(rows, dtype=np.uint64), weights)
    uniform = Window(Population(catalog), True, SEED, 0, 1 << 62)
    weighted = Window(Population(catalog, active), True, SEED, 0, 1 << 62)
    weighted.population.cumulative()  # built once per table, as the dataset does
    third = rows // 3
    sizes = {"small": 10, "medium": max(1, third // 100), "large": rows - 10 - max(1, third // 100)}
    streams = {n: Stream.by_column("source", n) for n in sizes}
    bounds = np.cumsum([0, *sizes.values()])
    stream_rows = StreamRows({n: np.arange(a, b) for n, a, b in zip(sizes, bounds[:-1], bounds[1:])})
    mix = Mixture({"small": 0.5, "medium": 0.3, "large": 0.2}, streams)
    curriculum = Curriculum([Stage(Mixture({"small": 0.2, "medium": 0.3, "large": 0.5}, streams), batches=1000),
                             Stage(mix, batches=1000), Stage(Mixture({"large": 1}, streams))], batch_size=256)
    return {
        BASELINE: uniform.rows,
        "shuffled (weighted draws)": weighted.rows,
        "permutation": EpochPermutation(SEED, rows).rows,
        "permutation (repeat counts 1-3)": EpochPermutation.from_weights(SEED, weights).rows,
        "mixture 0.5/0.3/0.2 (3 streams)": MixturePlan(mix, stream_rows, SEED).rows,
        "curriculum (3 stages)": CurriculumPlan(curriculum, stream_rows, SEED).rows,
    }


def plan_rate(rows_of: Callable[[int, int], np.ndarray], positions: int, block: int) -> float:
    """Positions per second planning `positions` positions in blocks of `block`."""
    start = 10**9 + 12345  # far into the plan (many epochs in, past the curriculum's first stages)

    def run() -> None:
        for first in range(start, start + positions, block):
            rows_of(first, block)

    return positions / timed(run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--rows", type=int, default=10**7, help="population rows (default 10^7)")
    parser.add_argument("--out", type=Path, default=Path("bench-out/sampling.json"))
    args = parser.parse_args()
    repeats = args.repeats or (3 if args.quick else 7)
    positions = 1 << (17 if args.quick else 20)
    plans = contenders(args.rows)
    ms: list[Measurement] = []
    for block in (256, 4096):
        workload = f"{args.rows:,} rows, blocks of {block}"
        for name, rows_of in plans.items():
            rows_of(10**9, block)  # warm up
            ms.append(Measurement(workload, name, "positions/s", repeat(lambda: plan_rate(rows_of, positions, block), repeats)))
    print(f"machine: {machine_facts()}")
    print(f"planning {positions:,} positions per repeat, {repeats} repeats; last column: baseline / contender "
          f"(baseline: {BASELINE}; < 1 means the contender is faster)")
    print(ratio_table(ms, BASELINE))
    save_json(args.out, ms, {"benchmark": "sampling", "repeats": repeats, "rows": args.rows, "positions": positions})


if __name__ == "__main__":
    main()
