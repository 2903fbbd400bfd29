"""Planning throughput (plan positions per second) of the sampling modes, in one run: dataset-rt's
shuffled draws (uniform over physical rows, and weighted over an active table), exactly-once
epochs (unit and repeat counts), a 3-stream mixture (0.5 / 0.3 / 0.2 over streams of very
different sizes) and a 3-stage curriculum. Each contender plans the same number of positions in
blocks of the reader's sizes (256 per sample, 4096 per batch task), from a position far into the
plan.

Then reads (`--reads`, on by default; `--smoke` reads only, tiny): samples per second of one
`CachedDataset` window on the same three caches (sizes 100:10:1, 1 KiB records, uncompressed)
with dataset-rt's shuffled draws, `ReaderConfig(sampling="permutation")` and a 3-stream mixture
(`ds.set_mixture`, 0.5 / 0.3 / 0.2 by cache), per sample (`iter(ds)`) and in batches of 256
(`iter_batches`), in-process and with 2 reader workers (started before timing). The last column
is draws / contender: the target is >= 0.9x of draws' rate, i.e. <= 1.11 there. The
orders take turns within each repeat; a second table gives the parent's CPU time per sample.

Usage: python -m benchmarks.sampling [--quick | --smoke] [--repeats R] [--rows N] [--no-reads]
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import datasetrt as drt
from benchmarks.caches import PayloadSource, datasetrt_pass, write_cache
from benchmarks.common import Measurement, machine_facts, ratio_table, repeat, save_json, timed
from datasetrt.sampling import (
    Curriculum,
    CurriculumPlan,
    EpochPermutation,
    Mixture,
    MixturePlan,
    Stage,
    Stream,
    StreamRows,
)
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
    curriculum = Curriculum(
        [
            Stage(Mixture({"small": 0.2, "medium": 0.3, "large": 0.5}, streams), batches=1000),
            Stage(mix, batches=1000),
            Stage(Mixture({"large": 1}, streams)),
        ],
        batch_size=256,
    )
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


READ_BASELINE = "shuffled (draws)"


def read_orders(paths: list[Path]) -> dict[str, Callable[[drt.DatasetRuntime | None], drt.CachedDataset]]:
    """name -> a dataset over `paths` read in that order (with the runtime's workers, or in-process)."""

    def draws(rt):
        return drt.CachedDataset(paths, reader_config=drt.ReaderConfig(seed=SEED), runtime=rt)

    def permutation(rt):
        return drt.CachedDataset(paths, reader_config=drt.ReaderConfig(seed=SEED, sampling="permutation"), runtime=rt)

    def mixture(rt):
        ds = draws(rt)
        ds.set_mixture(drt.Mixture.by_cache({str(paths[0]): 0.5, str(paths[1]): 0.3, str(paths[2]): 0.2}))
        return ds

    return {READ_BASELINE: draws, "permutation": permutation, "mixture 0.5/0.3/0.2 (3 streams)": mixture}


def read_rates(
    workdir: Path, counts: tuple[int, int, int], payload_bytes: int, repeats: int
) -> tuple[list[Measurement], list[Measurement]]:
    """Samples/s of one window per repeat for each order, read path and process layout, and the
    parent's CPU time per sample (`time.process_time`: what the orders cost the consumer's process,
    much less sensitive than wall time to other jobs on a shared machine). The orders take turns
    within each repeat (reversed every other repeat), so load drifting during a run spreads over
    all of them instead of biasing the ones measured last."""
    with drt.DatasetRuntime(num_workers=1) as writer:
        paths = [
            write_cache(drt, writer, workdir, PayloadSource(f"s{k}", n, payload_bytes, drt.CacheInput), "none")
            for k, n in enumerate(counts)
        ]
    orders = read_orders(paths)
    ms: list[Measurement] = []
    cpu: list[Measurement] = []
    with drt.DatasetRuntime(num_workers=2) as rt:
        rt.start_workers()
        for where, runtime in (("in-process", None), ("2 reader workers", rt)):
            for batches in (False, True):
                workload = (
                    f"read {sum(counts):,} x {payload_bytes} B, {'batches of 256' if batches else 'samples'}, {where}"
                )
                datasets = {name: make(runtime) for name, make in orders.items()}
                rates = {name: Measurement(workload, name, "samples/s") for name in orders}
                costs = {
                    name: Measurement(f"parent CPU, {workload}", name, "us/sample", higher_is_better=False)
                    for name in orders
                }
                for ds in datasets.values():
                    next(ds.iter_batches(256))  # warm up (shard descriptors, plan tables); its window is not timed
                for r in range(repeats):
                    for name in list(orders) if r % 2 == 0 else list(orders)[::-1]:
                        gc.collect()
                        wall, cpu_s = time.perf_counter(), time.process_time()
                        n = datasetrt_pass(datasets[name], batches, 256)[0]
                        rates[name].values.append(n / (time.perf_counter() - wall))
                        costs[name].values.append((time.process_time() - cpu_s) / n * 1e6)
                ms.extend(rates.values())
                cpu.extend(costs.values())
    return ms, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one repeat: checks the run, measures nothing")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--rows", type=int, default=None, help="population rows of the planning rows (default 10^7)")
    parser.add_argument("--no-reads", action="store_true", help="planning only")
    parser.add_argument("--out", type=Path, default=Path("bench-out/sampling.json"))
    args = parser.parse_args()
    repeats = args.repeats or (1 if args.smoke else 5 if args.quick else 7)
    rows = args.rows or (10**5 if args.smoke else 10**7)
    positions = 1 << (12 if args.smoke else 17 if args.quick else 20)
    counts = (2_000, 200, 20) if args.smoke else (20_000, 2_000, 200) if args.quick else (100_000, 10_000, 1_000)
    plans = contenders(rows)
    ms: list[Measurement] = []
    for block in (256, 4096):
        workload = f"{rows:,} rows, blocks of {block}"
        for name, rows_of in plans.items():
            rows_of(10**9, block)  # warm up
            ms.append(
                Measurement(
                    workload,
                    name,
                    "positions/s",
                    repeat(lambda: plan_rate(rows_of, positions, block), repeats),  # noqa: B023 (called within this iteration)
                )
            )
    print(f"machine: {machine_facts()}")
    print(
        f"planning {positions:,} positions per repeat, {repeats} repeats; last column: baseline / contender "
        f"(baseline: {BASELINE}; < 1 means the contender is faster)"
    )
    print(ratio_table(ms, BASELINE))
    reads: list[Measurement] = []
    if not args.no_reads:
        with tempfile.TemporaryDirectory(prefix="datasetrt-bench-sampling-") as work:
            reads, cpu = read_rates(Path(work), counts, 1024, repeats)
        print(
            f"\nreads: one window per repeat, {repeats} repeats, orders taking turns; last column: draws / "
            f"contender (target: permutation and mixture >= 0.9x of draws, i.e. <= 1.11)"
        )
        print(ratio_table(reads, READ_BASELINE))
        print("\nparent CPU time per sample (same windows; last column: contender / draws, > 1 costs more)")
        print(ratio_table(cpu, READ_BASELINE))
        reads += cpu
    save_json(
        args.out,
        ms + reads,
        {
            "benchmark": "sampling",
            "repeats": repeats,
            "rows": rows,
            "positions": positions,
            "read_counts": list(counts),
        },
    )


if __name__ == "__main__":
    main()
