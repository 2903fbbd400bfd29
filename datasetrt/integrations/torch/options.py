"""`to_torch_dataloader`'s options: dataset-rt 0.4.8's argument checks (wording and checking
order), the "auto" values (workers, threads, persistence, prefetch, start method), the check that
spawned workers can re-import the user's script, and the `event=loader_ready` log line.

Boundary: plain values and Python's multiprocessing only; no torch, no dataset, no plan (the
loader, loader.py, calls `check_arguments` first and `worker_settings` once it knows the
topology). A new torch option is checked here and wired in loader.py.
"""

from __future__ import annotations

import ast
import logging
import math
import os
import pickle
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from multiprocessing import get_all_start_methods, get_context
from multiprocessing.context import BaseContext
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

from datasetrt.errors import ArgumentTypeError, ConfigError

LOGGER_NAME = "datasetrt.loader"
MAX_SAMPLE_BUDGET = min(sys.maxsize, 1 << 53)  # torch computes len(loader) through float division

_RESERVED = frozenset(
    {
        "dataset",
        "sampler",
        "batch_sampler",
        "shuffle",
        "seed",
        "samples_per_epoch",
        "worker_partition",
        "work_dir",
        "batch_size",
        "num_workers",
        "sample_transform_fn",
        "collate_fn",
        "drop_last",
        "pin_memory",
        "timeout",
        "native_num_workers",
        "multiprocessing_context",
        "worker_init_fn",
        "prefetch_factor",
        "persistent_workers",
        "verbose",
        "dataloader_kwargs",
    }
)


def is_auto(value: Any) -> bool:
    return isinstance(value, str) and value == "auto"


def _check_count(value: Any, name: str, minimum: int, maximum: int) -> None:
    if is_auto(value) or (type(value) is int and minimum <= value <= maximum):
        return
    raise ConfigError(f"{name} must be 'auto' or an integer between {minimum} and {maximum}")


def check_arguments(
    *,
    shuffle: Any,
    seed: Any,
    samples_per_epoch: Any,
    worker_partition: Any,
    batch_size: Any,
    num_workers: Any,
    drop_last: Any,
    pin_memory: Any,
    timeout: Any,
    native_num_workers: Any,
    multiprocessing_context: Any,
    prefetch_factor: Any,
    persistent_workers: Any,
    verbose: Any,
    dataloader_kwargs: Mapping | None,
) -> dict:
    """The checks that need no topology, in dataset-rt's order (its messages, `ConfigError`);
    returns the extra DataLoader keyword arguments."""
    extra = dict(dataloader_kwargs) if dataloader_kwargs is not None else {}
    conflicts = _RESERVED.intersection(extra)
    if conflicts:
        raise ConfigError(f"dataloader_kwargs contains reserved arguments: {', '.join(sorted(conflicts))}")
    _check_count(num_workers, "num_workers", 0, (1 << 32) - 1)
    _check_count(native_num_workers, "native_num_workers", 1, sys.maxsize)
    flags = (("shuffle", shuffle), ("drop_last", drop_last), ("pin_memory", pin_memory), ("verbose", verbose))
    for name, value in flags:
        if type(value) is not bool:
            raise ConfigError(f"{name} must be a boolean")
    if type(batch_size) is not int or not 1 <= batch_size <= sys.maxsize:
        raise ConfigError("batch_size must be a positive integer fitting sys.maxsize")
    if samples_per_epoch is not None and (
        type(samples_per_epoch) is not int or not 1 <= samples_per_epoch <= MAX_SAMPLE_BUDGET
    ):
        raise ConfigError(f"samples_per_epoch must be a positive integer <= {MAX_SAMPLE_BUDGET} or None")
    if not math.isfinite(timeout) or timeout < 0:
        raise ConfigError("timeout must be finite and nonnegative")
    _check_count(prefetch_factor, "prefetch_factor", 1, sys.maxsize)
    if not (persistent_workers is True or persistent_workers is False or is_auto(persistent_workers)):
        raise ConfigError("persistent_workers must be a boolean or 'auto'")
    if not (isinstance(seed, str) and seed == "random"):
        if type(seed) is not int:
            raise ConfigError("seed must be 'random' or an unsigned 64-bit integer")
        if not shuffle:
            raise ConfigError("seed requires shuffle=True; use 'random' for sequential reading")
        if not 0 <= seed < 1 << 64:
            raise ConfigError("seed must be 'random' or an unsigned 64-bit integer")
    ctx_ok = isinstance(multiprocessing_context, BaseContext) or (
        isinstance(multiprocessing_context, str)
        and (multiprocessing_context == "inherit" or multiprocessing_context in get_all_start_methods())
    )
    if not ctx_ok:
        raise ConfigError("multiprocessing_context must be 'inherit', an available start method, or BaseContext")
    if worker_partition is not None and worker_partition not in ("split", "replicate"):
        raise ConfigError("worker_partition must be 'split', 'replicate', or None")
    return extra


def available_cpus() -> int:
    """CPUs this process may use: min(cpu_count, affinity, cgroup v2 cpu.max quota), at least 1."""
    n = os.cpu_count() or 1
    try:
        n = min(n, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        pass
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            n = min(n, int(quota) // int(period))
    except (OSError, ValueError):
        pass
    return max(1, n)


@dataclass(frozen=True)
class WorkerSettings:
    """The loader's process settings after "auto": DataLoader workers (`processes`), native
    threads per consumer (logged only), persistence, prefetch factor (None without workers) and
    the multiprocessing context (None without workers)."""

    processes: int
    threads: int
    persistent: bool
    prefetch: int | None
    context: BaseContext | None


class _PickleSink:
    def write(self, data: bytes) -> int:
        return len(data)


def worker_settings(
    *,
    num_workers: Any,
    native_num_workers: Any,
    timeout: float,
    persistent_workers: Any,
    prefetch_factor: Any,
    multiprocessing_context: Any,
    sample_transform_fn: Callable | None,
    local_world_size: int,
    transform_name: str = "sample_transform_fn",
) -> WorkerSettings:
    """Resolve "auto" for `local_world_size` processes sharing this machine's CPUs, then the
    checks that depend on the worker count (dataset-rt's order and messages; `transform_name`
    names the transform argument in them)."""
    local = local_world_size
    cpus = available_cpus() if is_auto(num_workers) or is_auto(native_num_workers) else 1
    processes = min(4, max(0, cpus // local - 1)) if is_auto(num_workers) else num_workers
    threads = max(1, min(4, cpus // (max(1, processes) * local))) if is_auto(native_num_workers) else native_num_workers
    if processes == 0 and timeout != 0:
        raise ConfigError("timeout must be zero with num_workers=0")
    if is_auto(persistent_workers):
        persistent = processes > 0
    elif persistent_workers and processes == 0:
        raise ConfigError("persistent_workers=True requires num_workers > 0")
    else:
        persistent = persistent_workers
    if is_auto(prefetch_factor):
        prefetch = 2 if processes > 0 else None
    elif processes == 0:
        raise ConfigError("prefetch_factor requires num_workers > 0")
    else:
        prefetch = prefetch_factor
    if processes == 0:
        context = None
    elif isinstance(multiprocessing_context, BaseContext):
        context = multiprocessing_context
    else:
        context = get_context(None if multiprocessing_context == "inherit" else multiprocessing_context)
    if sample_transform_fn is not None and processes > 0:
        try:
            ForkingPickler(_PickleSink(), pickle.HIGHEST_PROTOCOL).dump(sample_transform_fn)
        except Exception as error:
            raise ArgumentTypeError(f"{transform_name} must be picklable for multiprocess loading") from error
    return WorkerSettings(processes, threads, persistent, prefetch, context)


def check_collate_picklable(collate_fn: Callable | None, context: BaseContext | None) -> None:
    """ArgumentTypeError when a non-fork context would have to pickle `collate_fn` into each torch
    worker and cannot: raised when the loader is built, not as torch's PicklingError at next()."""
    if collate_fn is None or context is None or context.get_start_method() == "fork":
        return
    try:
        ForkingPickler(_PickleSink(), pickle.HIGHEST_PROTOCOL).dump(collate_fn)
    except Exception as error:
        raise ArgumentTypeError(
            f"collate_fn must be picklable with multiprocessing_context={context.get_start_method()!r} "
            f"({error}); use a module-level function or multiprocessing_context='fork'"
        ) from error


def check_main_guard(context: BaseContext | None, what: str) -> None:
    """LoaderStateError (one line saying what to do) when `context` starts workers that re-run the
    main script (spawn, forkserver: `python script.py` or `python -m pkg.module`) and the script's
    top-level statement now running — the one building `what` — is not under
    `if __name__ == "__main__":`: each worker would build it again while bootstrapping and die, so
    the pass would fail at its first batch with torch's "DataLoader worker exited unexpectedly".
    Silent when it cannot tell (no script file, built off the main thread, source unreadable)."""
    if context is None or context.get_start_method() == "fork":
        return
    found = _unguarded_main_line()
    if found is None:
        return
    path, line = found
    from datasetrt.errors import LoaderStateError

    method = context.get_start_method()
    raise LoaderStateError(
        f"multiprocessing_context={method!r} starts DataLoader workers that re-run {path}, and its line {line}, "
        f'which is running {what}, is not under `if __name__ == "__main__":`; put the code that builds and '
        "iterates the loader under that guard, or pass multiprocessing_context='fork' (or num_workers=0)"
    )


def _unguarded_main_line() -> tuple[str, int] | None:
    """(script path, line) of the main module's running top-level statement when spawned workers
    re-run that module (as multiprocessing.spawn decides) and the statement is outside an
    `if __name__ == "__main__":` body; else None."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    spec_name = getattr(getattr(main, "__spec__", None), "name", None)
    if main is None or path is None or (spec_name is not None and spec_name.split(".")[-1] == "__main__"):
        return None  # interactive, -c, notebooks, `python -m pkg`: workers do not re-run it
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_globals is main.__dict__ and frame.f_code.co_name == "<module>"):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return None  # not built while the main script runs its top level (another thread, say)
    line = frame.f_lineno
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    return None if _guarded(tree.body, line) else (path, line)


def _guarded(body: list[ast.stmt], line: int) -> bool:
    """Whether `line` lies in the body of an `if __name__ == "__main__":` among the statements
    `body` (at any depth of compound statements)."""
    for stmt in body:
        if not stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno):
            continue
        if isinstance(stmt, ast.If) and _is_main_test(stmt.test):
            return any(s.lineno <= line <= (s.end_lineno or s.lineno) for s in stmt.body)
        blocks = [getattr(stmt, key, []) for key in ("body", "orelse", "finalbody")]
        blocks += [handler.body for handler in getattr(stmt, "handlers", [])]
        return any(_guarded(block, line) for block in blocks)
    return False


def _is_main_test(test: ast.expr) -> bool:
    """`__name__ == "__main__"` (either side)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    texts = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(texts) == 1


def _loader_event(message: str) -> None:
    """INFO on logger `datasetrt.loader` (dataset-rt's `dataset_rt.loader`): shown only where
    logging is configured to show it, e.g. `logging.basicConfig(level=logging.INFO)`."""
    logging.getLogger(LOGGER_NAME).info(message)
