"""Mutation score of the core modules with cosmic-ray: killed / survived / timeout per module.

Usage (from the repository root; scripts/mutation.sh wraps it):
    .venv/bin/python scripts/mutation.py [--list] [--survivors] [--workdir DIR] [MODULE ...]

MODULE is a key of MODULES below (e.g. `sampling/planner`); none given: all of them, in order.
Each module runs in a private copy of the tree (tracked and new files plus the in-place built
`datasetrt/_native/*.so`), so the worktree is never edited and the copy imports its own
kernels: cosmic-ray writes one mutant at a time into the copy, runs the module's test
selection there (a fresh interpreter per mutant: Polars cannot run in a forked child, which
rules out fork-based runners), and restores the file.

The operator set is cosmic-ray's core set cut to the mutations a reviewer would call distinct
bugs (OPERATORS): every comparison flipped at its boundary or negated, each arithmetic/bit
operator swapped for its nearest neighbours (not all ten), every number +-1, boolean and
logical flips, `not` added/removed, exception types, loop bodies skipped, decorators removed.
`Module.functions` limits a module to the functions the score is about (None: the whole
module; None inside the set means module-level statements, e.g. constants). Mutants inside
annotations are not counted: with `from __future__ import annotations` they are never evaluated.

Score = (killed + timeout) / (killed + timeout + survived), where `survived` excludes the
mutants listed in EQUIVALENT (no test can tell them from the original; each has its reason,
docs/testing.md lists them). A timeout is a kill (the mutant hangs or slows the selection past
`timeout`). `--retest-survivors` re-copies the tree and runs only the survivors again (after
tests were added: a kill stays a kill when tests are only added). Exit status 0 when every module reaches
`--min-score` (default 0.9), else 1. Too slow for CI (docs/testing.md has the figures).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Kept operators (regexes over cosmic-ray operator names). Everything else is marked SKIPPED.
_NEIGHBOURS = {
    "Add": ("Sub", "Mul"),
    "Sub": ("Add",),
    "Mul": ("Add", "Div"),
    "Div": ("Mul", "FloorDiv"),
    "FloorDiv": ("Div", "Mul"),
    "Mod": ("FloorDiv",),
    "Pow": ("Mul",),
    "LShift": ("RShift",),
    "RShift": ("LShift",),
    "BitAnd": ("BitOr",),
    "BitOr": ("BitAnd",),
    "BitXor": ("BitOr",),
}
_COMPARISONS = (
    "Eq_NotEq",
    "NotEq_Eq",
    "Lt_LtE",
    "LtE_Lt",
    "Gt_GtE",
    "GtE_Gt",
    "Lt_Gt",
    "Gt_Lt",
    "LtE_GtE",
    "GtE_LtE",
    "Is_IsNot",
    "IsNot_Is",
    "In_NotIn",
    "NotIn_In",
)
OPERATORS = (
    [f"core/ReplaceBinaryOperator_{a}_{b}$" for a, bs in _NEIGHBOURS.items() for b in bs]
    + [f"core/ReplaceComparisonOperator_{c}$" for c in _COMPARISONS]
    + [
        "core/ReplaceUnaryOperator_Delete_",
        "core/NumberReplacer$",
        "core/AddNot$",
        "core/ReplaceTrueWithFalse$",
        "core/ReplaceFalseWithTrue$",
        "core/ReplaceAndWithOr$",
        "core/ReplaceOrWithAnd$",
        "core/ReplaceBreakWithContinue$",
        "core/ReplaceContinueWithBreak$",
        "core/ExceptionReplacer$",
        "core/ZeroIterationForLoop$",
        "core/RemoveDecorator$",
    ]
)


@dataclass(frozen=True)
class Module:
    path: str  # source file, relative to the repository root
    tests: tuple[str, ...]  # pytest node ids / files: the module's unit tests + the few integration tests on it
    functions: frozenset | None = None  # definition names in scope (None: all)
    timeout_s: float = 120.0


MODULES: dict[str, Module] = {
    "sampling/planner": Module(
        "datasetrt/sampling/planner.py", ("tests/unit/sampling/test_planner.py", "tests/unit/sampling/test_docs.py")
    ),
    "sampling/permutation": Module(
        "datasetrt/sampling/permutation.py",
        ("tests/unit/sampling/test_permutation.py", "tests/unit/sampling/test_plans.py"),
    ),
    "sampling/mixture": Module(
        "datasetrt/sampling/mixture.py",
        (
            "tests/unit/sampling/test_mixture.py",
            "tests/unit/sampling/test_plans.py",
            "tests/unit/sampling/test_curriculum.py",
        ),
    ),
    "sampling/plans": Module(
        "datasetrt/sampling/plans.py",
        (
            "tests/unit/sampling/test_plans.py",
            "tests/unit/sampling/test_curriculum.py",
            "tests/unit/sampling/test_mixture.py",
        ),
    ),
    "format/manifest": Module(
        "datasetrt/format/manifest.py",
        (
            "tests/unit/format/test_manifest.py",
            "tests/unit/format/test_dictionary.py",
            "tests/integrity/test_hostile_manifest.py",
            "tests/integrity/test_manifest_corruption.py",
        ),
    ),
    "format/reader": Module(
        "datasetrt/format/reader.py",
        ("tests/unit/format/test_reader.py", "tests/integrity/test_file_corruption.py"),
        frozenset({"open", "index_map", "checksum_map", "read_metadata", "validate_deep", "_stat", "_stat_size"}),
    ),
    "runtime/memory": Module(
        "datasetrt/runtime/memory.py", ("tests/unit/runtime/test_memory_bound.py", "tests/runtime/test_memory.py")
    ),
    "runtime/run": Module(
        "datasetrt/runtime/run.py",
        (
            "tests/unit/runtime/test_memory_bound.py",
            "tests/runtime/test_memory.py",
            "tests/runtime/test_faults.py::test_corrupted_record_raises_integrity_error_with_worker_traceback",
            "tests/runtime/test_faults.py::test_corrupt_first_batch_of_a_fresh_runtime_raises_integrity_error",
            "tests/runtime/test_parity.py",
        ),
        frozenset(
            {
                None,
                "RunShape",
                "plan",
                "rows_per_task",
                "slot_bytes",
                "planned_record_bytes",
                "__init__",
                "_on_message",
                "_wait_for",
                "_submit",
                "__iter__",
                "_inline_chunk",
            }
        ),
        timeout_s=240.0,
    ),
    "table/metadata": Module("datasetrt/table/metadata.py", ("tests/unit/table/test_metadata.py",)),
}


@dataclass(frozen=True)
class Equivalent:
    """A surviving mutant no test can kill: `mutated` is a substring of the mutated line (the
    `+` line of the diff), `operator` the cosmic-ray operator name's last part."""

    function: str | None
    operator: str
    mutated: str
    reason: str


_ZERO_IS_IN_RANGE = (
    "differs only for value 0, which reaches this line only when 0 > `maximum`, and every "
    "caller's maximum is positive (U63_MAX by default, U64_MAX, U32_MAX, MAX_SAMPLE_COUNT, "
    "DICT_MAX_BYTES)"
)
_CONCAT_OF_ONE = "`pa.concat_tables` of one table is that table's rows and schema unchanged"
_LARGEST_START = (
    "differs only when no cache holds a sample (a stored record is at least 8 bytes), and every "
    "user takes max(..., 1) (RunShape.plan, BatchShape.buffer_bytes) or max(4 MiB, ...) "
    "(batch_ring's scratch)"
)
EQUIVALENT: dict[str, tuple[Equivalent, ...]] = {
    "sampling/planner": (
        Equivalent(
            "__init__",
            "NumberReplacer",
            "scale: float = ",
            "`_scale` is read only when `cum` was given, and the callers that give `cum` "
            "(`from_columns`, `with_order`) always give `scale` too: the default is never read",
        ),
        Equivalent(
            "from_columns",
            "NumberReplacer",
            'max(len(columns["cum"]) - 1, -1)',
            "differs only for an empty `cum` column, and any slice of an empty array is empty",
        ),
    ),
    "runtime/memory": (
        Equivalent(
            "cgroup_limit_bytes",
            "ReplaceAndWithOr",
            'if hierarchy == "0" or controllers == ""',
            "the kernel writes an empty controller list only on the v2 line, and hierarchy id 0 only "
            "there (cgroups(7)): no /proc/self/cgroup line has one without the other",
        ),
        Equivalent(
            "cgroup_limit_bytes",
            "ReplaceOrWithAnd",
            "if node == base and base not in node.parents",
            "`node` starts as `base` joined with a relative path and walks up its own parents, so it reaches "
            "`base` before it could leave it: `base not in node.parents` is true only when node == base",
        ),
    ),
    "table/metadata": (
        Equivalent("physical_table", "NumberReplacer", "if len(tables) > 0 else tables[0]", _CONCAT_OF_ONE),
        Equivalent(
            "physical_table", "ReplaceComparisonOperator_Gt_GtE", "if len(tables) >= 1 else tables[0]", _CONCAT_OF_ONE
        ),
        Equivalent(
            "physical_table",
            "NumberReplacer",
            "if len(tables) > 1 else tables[ -1]",
            "the else branch runs only for a catalog of exactly one cache, whose one table is both "
            "tables[0] and tables[-1]",
        ),
        Equivalent(
            "validate_update",
            "ReplaceFalseWithTrue",
            "astype(np.uint64, copy=True)",
            "copying only costs memory: the identity arrays are read, never written, and the returned "
            "`sample_id` is copied anyway",
        ),
        Equivalent(
            "_first_bad_row",
            "NumberReplacer",
            "(series.min() or 1) < 0",
            "the `or` operand is used only when min() is 0 or None (all null), and 0 < 0 and 1 < 0 are both false",
        ),
        Equivalent(
            "_first_bad_row",
            "ReplaceComparisonOperator_Lt_LtE",
            "bad_null is not None and bad_null <= bad_neg",
            "`bad_neg` is computed only when the column holds a negative, and then is the row of one (nulls "
            "count as not negative): a null row and a negative row are never the same row",
        ),
        Equivalent(
            "validate_update",
            "NumberReplacer",
            "(row, order) < first[: ",
            "columns are visited in increasing `order`, so (row, order) never equals first[:2] and "
            "a later column replaces `first` only for an earlier row: comparing with first[:1] or first[:3] "
            "decides the same",
        ),
        Equivalent(
            "validate_update",
            "ReplaceComparisonOperator_Lt_LtE",
            "(row, order) <= first[:2]",
            "columns are visited in increasing `order`, so (row, order) never equals first[:2]",
        ),
    ),
    "runtime/run": (
        Equivalent(
            "__init__",
            "NumberReplacer",
            "self._task_ids = -1",
            "task ids are opaque keys: the first becomes 0 instead of 1, and the pool counts any id >= 0 "
            "as a task (negative ids are failures outside a task)",
        ),
        Equivalent(
            "__init__",
            "NumberReplacer",
            "self._task_ids = 1",
            "task ids are opaque keys (see `self._task_ids = -1`): the first becomes 2 instead of 1",
        ),
        Equivalent(
            "_submit",
            "NumberReplacer",
            "self._task_ids += 2",
            "task ids are opaque keys (see `self._task_ids = -1`): 2, 4, 6... are as distinct as 1, 2, 3...",
        ),
        Equivalent(
            "planned_record_bytes",
            "NumberReplacer",
            "default= -1)",
            "the default is used only for a cache with no shards, where min(..., 0) and min(..., -1) are both "
            "below `largest` (which starts at 0), so the max() ignores either",
        ),
        Equivalent("planned_record_bytes", "NumberReplacer", "largest = 1", _LARGEST_START),
        Equivalent("planned_record_bytes", "NumberReplacer", "largest = -1", _LARGEST_START),
        Equivalent(
            "planned_record_bytes",
            "NumberReplacer",
            "default= 1)",
            "the default is used only for a cache with samples but no shards (a damaged manifest that "
            "opens and is refused when a record is read), where min(..., 1) makes `largest` at most 1, "
            "which every user treats as 0 (see `largest = 1`)",
        ),
        Equivalent(
            "plan",
            "NumberReplacer",
            "record = max(max_record_bytes, 2)",
            "differs only for records of 0 or 1 byte, where TASK_TARGET_BYTES // record (and 4x it) is far "
            "above the 512-row and MAX_ROWS_PER_TASK caps and rows x record (at most 4096 x 2 bytes) far "
            "below MIN_SLOT_BYTES (1 MiB): the same rows and slot size",
        ),
        Equivalent(
            "plan",
            "NumberReplacer",
            "rows = max( 0, min(rows_hint,",
            "differs only for a rows_hint below 1, and the only caller passes a batch size that "
            "iter_batches / to_torch_batches refuse below 1 (ConfigError)",
        ),
        Equivalent(
            "_inline_chunk",
            "NumberReplacer",
            "out=np.empty( 1, dtype=np.uint8)",
            "the starting size of a gather buffer that grows until the record fits (LocalReader.read_chunk): "
            "the chunk's bytes and offsets are the same",
        ),
    ),
    "format/reader": (
        Equivalent(
            "open",
            "ReplaceBinaryOperator_FloorDiv_Div",
            "if index_size / INDEX_ROW_BYTES != manifest.sample_count",
            "the line above refuses a size that is not a multiple of 24, so the float quotient is exact "
            "(up to 2^53 rows: an index of 216 PB)",
        ),
        Equivalent(
            "validate_deep",
            "ReplaceComparisonOperator_Gt_GtE",
            "out = (offsets >= shard_lens)",
            "an offset equal to its shard's length leaves 0 bytes, so `lengths > shard_lens - offsets` (any "
            "length >= 8) or `lengths < 8` already marks the row",
        ),
        Equivalent(
            "read_metadata",
            "ReplaceBinaryOperator_Mul_Div",
            "def read_metadata(self, /, validating",
            "`*` -> `/` only loosens the signature (`validating` may also be passed by position); "
            "every caller passes it by keyword",
        ),
    ),
    "format/manifest": (
        Equivalent(
            "parse_manifest",
            "NumberReplacer",
            "required=version >= 2) if version >= 3",
            "inside `if version >= 3`, `version >= 2` is as true as `version >= 3`",
        ),
        Equivalent(
            "parse_manifest",
            "ReplaceComparisonOperator_GtE_LtE",
            "required=version <= 3) if version >= 3",
            "inside `if version >= 3` the version is 3 (SUPPORTED_FORMAT_VERSIONS is (2, 3)), and 3 <= 3",
        ),
        Equivalent(
            "_jsonable",
            "ReplaceFalseWithTrue",
            "return True",
            "unreachable: `_bad` only shows values json.loads produced, which json.dumps always "
            "serialises, so `_jsonable` never takes its except branch",
        ),
        Equivalent(
            "_jsonable",
            "ExceptionReplacer",
            "except (",
            "the except branch is unreachable (see the `return True` mutant)",
        ),
        Equivalent(
            "_bad",
            "NumberReplacer",
            "else repr(value)[: ",
            "the repr branch runs only when `_jsonable` is False, which never happens (see `_jsonable`)",
        ),
        Equivalent("uint", "ReplaceComparisonOperator_Lt_LtE", "value <= 0:", _ZERO_IS_IN_RANGE),
        Equivalent("uint", "NumberReplacer", "value < 1:", _ZERO_IS_IN_RANGE),
        Equivalent(
            "_check_cache_state",
            "NumberReplacer",
            "shards[users[ -1]].algo",
            "every shard in `users` has a codec with cache state, and zstd_dict is the only one "
            "(datasetrt.values.codecs): the first and the last user name the same algo",
        ),
    ),
}


def equivalent_reason(name: str, survivor: dict) -> str | None:
    plus = [line[1:] for line in survivor["diff"].splitlines() if line.startswith("+") and not line.startswith("+++")]
    for e in EQUIVALENT.get(name, ()):
        if (
            e.function == survivor["function"]
            and e.operator == survivor["operator"]
            and any(e.mutated in line for line in plus)
        ):
            return e.reason
    return None


def copy_tree(dest: Path) -> None:
    """Tracked and untracked-not-ignored files, plus the built kernels (so the copy imports them)."""
    files = (
        subprocess.run(
            ["git", "ls-files", "-z", "-c", "-o", "--exclude-standard"], cwd=ROOT, check=True, capture_output=True
        )
        .stdout.decode()
        .split("\0")
    )
    files += [str(p.relative_to(ROOT)) for p in (ROOT / "datasetrt" / "_native").glob("*.so")]
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def test_command(module: Module) -> str:
    """The selection in its listed order (fastest-failing first), stopping at the first failure; the
    watchdog plugin (scripts/mutation_watchdog.py) ends a run whose one test hangs."""
    return (
        f"{sys.executable} -m pytest -x -q -p no:cacheprovider -p no:randomly -p mutation_watchdog --no-header "
        + " ".join(module.tests)
    )


def annotation_spans(source: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(start, end) (line, col) of every annotation. With `from __future__ import annotations`
    (every datasetrt module) annotations are never evaluated: mutants inside them are equivalent
    by construction and are not counted."""
    import ast

    spans = []
    for node in ast.walk(ast.parse(source)):
        notes = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            notes.append(node.returns)
            a = node.args
            notes += [x.annotation for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if x]
        elif isinstance(node, ast.AnnAssign):
            notes.append(node.annotation)
        spans += [((n.lineno, n.col_offset), (n.end_lineno, n.end_col_offset)) for n in notes if n is not None]
    return spans


def filter_session(session: Path, module: Module, source: str) -> tuple[int, int]:
    """Mark out-of-scope work items SKIPPED (other operators, other functions, annotations);
    returns (kept, skipped)."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    keep = re.compile("|".join(f"(?:{o})" for o in OPERATORS))
    notes = annotation_spans(source) if "from __future__ import annotations" in source else []
    kept = skipped = 0
    with use_db(str(session), WorkDB.Mode.open) as db:
        drop = []
        for item in db.pending_work_items:
            m = item.mutations[0]
            in_scope = module.functions is None or m.definition_name in module.functions
            in_scope &= not any(a <= tuple(m.start_pos) < b for a, b in notes)
            if keep.match(m.operator_name) and in_scope:
                kept += 1
            else:
                drop.append(item.job_id)
        if drop:
            db.set_multiple_results(drop, WorkResult(output="out of scope", worker_outcome=WorkerOutcome.SKIPPED))
        skipped = len(drop)
    return kept, skipped


def tally(session: Path) -> dict:
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome

    out = {"killed": 0, "survived": 0, "timeout": 0, "incompetent": 0, "pending": 0, "in_scope": 0, "survivors": []}
    with use_db(str(session), WorkDB.Mode.open) as db:
        results = dict(db.results)
        for item in db.work_items:
            result = results.get(item.job_id)
            out["in_scope"] += result is None or result.worker_outcome != WorkerOutcome.SKIPPED
            if result is None:
                out["pending"] += 1
                continue
            if result.worker_outcome == WorkerOutcome.SKIPPED:
                out["in_scope"] += result.output == "not sampled"
                continue
            if result.test_outcome == TestOutcome.SURVIVED:
                out["survived"] += 1
                m = item.mutations[0]
                out["survivors"].append(
                    {
                        "job_id": item.job_id,
                        "line": m.start_pos[0],
                        "function": m.definition_name,
                        "operator": m.operator_name.split("/")[-1],
                        "diff": result.diff or "",
                    }
                )
            elif result.test_outcome == TestOutcome.KILLED:
                out["timeout" if result.output == "timeout" else "killed"] += 1
            else:
                out["incompetent"] += 1
    return out


def sample_session(session: Path, size: int, seed: int) -> int:
    """Keep a seeded random sample of `size` mutants (those already decided count towards it);
    mark the other pending ones SKIPPED "not sampled". Returns how many were left out."""
    import random

    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    with use_db(str(session), WorkDB.Mode.open) as db:
        results = dict(db.results)
        decided = [
            i.job_id
            for i in db.work_items
            if i.job_id in results and results[i.job_id].worker_outcome != WorkerOutcome.SKIPPED
        ]
        pending = sorted(i.job_id for i in db.pending_work_items)
        keep = random.Random(seed).sample(pending, max(0, min(len(pending), size - len(decided))))
        drop = sorted(set(pending) - set(keep))
        if drop:
            db.set_multiple_results(drop, WorkResult(output="not sampled", worker_outcome=WorkerOutcome.SKIPPED))
    return len(drop)


def run_module(
    name: str,
    module: Module,
    workdir: Path,
    show_survivors: bool,
    retest: bool = False,
    sample: int | None = None,
    seed: int = 0,
) -> dict:
    tree = workdir / name.replace("/", "-")
    session = tree.with_suffix(".sqlite")
    fresh = not session.exists()
    if tree.exists():  # always a fresh copy: an interrupted run may have left a mutant in the old one
        shutil.rmtree(tree)
    tree.mkdir(parents=True)
    copy_tree(tree)
    if retest and not fresh:
        import sqlite3

        again = [s["job_id"] for s in tally(session)["survivors"] if equivalent_reason(name, s) is None]
        with sqlite3.connect(session) as db:
            db.executemany("DELETE FROM work_results WHERE job_id = ?", [(j,) for j in again])
        print(f"{name}: retesting {len(again)} survivors (listed equivalents are not rerun)", flush=True)
    config = tree.with_suffix(".toml")
    config.write_text(
        "[cosmic-ray]\n"
        f'module-path = "{module.path}"\n'
        f"timeout = {module.timeout_s}\n"
        "excluded-modules = []\n"
        f'test-command = "{test_command(module)}"\n'
        '[cosmic-ray.distributor]\nname = "local"\n'
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join((str(tree), str(tree / "scripts"))),
        "DATASETRT_HYPOTHESIS_PROFILE": "ci",
    }
    cr = [sys.executable, "-m", "cosmic_ray.cli"]
    started = time.monotonic()
    baseline = subprocess.run(test_command(module).split(), cwd=tree, env=env, capture_output=True, text=True)
    if baseline.returncode != 0:
        raise SystemExit(f"{name}: the unmutated test selection fails; fix it first:\n{baseline.stdout[-3000:]}")
    baseline_s = time.monotonic() - started
    if fresh:
        subprocess.run([*cr, "init", str(config), str(session)], cwd=tree, env=env, check=True, capture_output=True)
        kept, skipped = filter_session(session, module, (tree / module.path).read_text())
        print(
            f"{name}: {kept} mutants in scope ({skipped} skipped by operator/function), baseline {baseline_s:.0f} s",
            flush=True,
        )
    if sample is not None:
        print(f"{name}: {sample_session(session, sample, seed)} pending mutants left out of the sample", flush=True)
    subprocess.run([*cr, "exec", str(config), str(session)], cwd=tree, env=env, check=True)
    counts = tally(session)
    counts["seconds"] = time.monotonic() - started
    counts["equivalent"] = 0
    for s in counts["survivors"]:
        s["equivalent"] = equivalent_reason(name, s)
        counts["equivalent"] += s["equivalent"] is not None
    counts["survived"] -= counts["equivalent"]
    if show_survivors:
        for s in counts["survivors"]:
            kind = "equivalent" if s["equivalent"] else "survived"
            print(f"  {kind} {module.path}:{s['line']} {s['function']} {s['operator']}")
            print(
                "    "
                + "\n    ".join(
                    line for line in s["diff"].splitlines() if line[:1] in "+-" and not line.startswith(("+++", "---"))
                )
            )
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help=f"any of: {', '.join(MODULES)}")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "datasetrt-mutation",
        help="tree copies and sessions; an existing session resumes (delete it to start over)",
    )
    parser.add_argument("--survivors", action="store_true", help="print every surviving mutant")
    parser.add_argument("--list", action="store_true", help="list the modules and their test selections")
    parser.add_argument(
        "--retest-survivors",
        action="store_true",
        help="re-copy the tree and run the surviving mutants of an existing session again",
    )
    parser.add_argument(
        "--sample",
        type=int,
        metavar="N",
        help="run a seeded random sample of N mutants per module (the rest are marked not sampled)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of --sample")
    parser.add_argument("--min-score", type=float, default=0.9)
    parser.add_argument("--json", type=Path, help="write the table as JSON")
    args = parser.parse_args(argv)
    if args.list:
        for name, module in MODULES.items():
            print(f"{name:<22} {module.path}\n{'':<22} {' '.join(module.tests)}")
        return 0
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        parser.error(f"unknown module(s) {unknown}; known: {', '.join(MODULES)}")
    rows = {}
    for name in args.modules or list(MODULES):
        rows[name] = run_module(
            name, MODULES[name], args.workdir, args.survivors, args.retest_survivors, args.sample, args.seed
        )
    print(
        f"\n{'module':<22} {'mutants':>7} {'killed':>6} {'survived':>8} {'equiv':>5} {'timeout':>7} {'score':>6} "
        f"{'time':>7}"
    )
    ok = True
    for name, c in rows.items():
        decided = c["killed"] + c["timeout"] + c["survived"]
        score = (c["killed"] + c["timeout"]) / decided if decided else 1.0
        ok &= score >= args.min_score and not c["pending"]
        sampled = decided + c["equivalent"] + c["pending"] < c["in_scope"]
        print(
            f"{name:<22} {decided + c['equivalent']:>7} {c['killed']:>6} {c['survived']:>8} {c['equivalent']:>5} "
            f"{c['timeout']:>7} {score:>6.1%} {c['seconds'] / 60:>5.1f} m"
            + (f"  (sample of {c['in_scope']} in scope)" if sampled else "")
            + (f"  ({c['pending']} pending)" if c["pending"] else "")
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
