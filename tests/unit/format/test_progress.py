"""The writer's progress bar (datasetrt/format/progress.py) as a real write draws it on stderr:
the sources' label appears once with its colon, with and without a known total, and a source that
fails after several committed blocks leaves neither its samples in the count nor its length in
the total."""

from __future__ import annotations

import datasetrt as drt
from tests.conftest import ListSource


class _Unsized:
    def __init__(self, name, items):
        self.name, self.items = name, items

    def __iter__(self):
        return iter(self.items)


def _good(n):
    return [(b"p" * 100, {"a": i}) for i in range(n)]


def _final_line(err: str) -> str:
    return err.replace("\r", "\n").strip().splitlines()[-1]


def test_a_failed_source_leaves_the_count_and_the_total(runtime, tmp_path, capsys):
    late = _good(3000) + [(b"x", {"a": 1.0})]  # several blocks committed before the failure
    results = runtime.write_cache(
        [ListSource("ok", _good(2000)), ListSource("late", late)],
        tmp_path / "base",
        writer_config=drt.WriterConfig(show_progress=True),
    )
    assert [type(r).__name__ for r in results] == ["CacheWriteSuccess", "CacheWriteError"]
    err = capsys.readouterr().err
    line = _final_line(err)
    assert line.startswith("datasetrt write 2/2 sources: 100%") and " 2000/2000 " in line, line
    assert err.count("2/2 sources") == 1  # the final state is drawn once


def test_without_lengths_the_bar_counts_samples_after_one_colon(runtime, tmp_path, capsys):
    runtime.write_cache(
        [_Unsized("u", _good(2000))], tmp_path / "base", writer_config=drt.WriterConfig(show_progress=True)
    )
    err = capsys.readouterr().err
    assert "sources: :" not in err
    assert _final_line(err).startswith("datasetrt write 1/1 sources: 2000 samples ")
