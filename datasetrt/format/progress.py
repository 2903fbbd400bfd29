"""Writer progress: the stderr bar of a cache write (`WriterConfig.show_progress`).

Boundary: counts the writer reports (`advance`, `source_done`); no file formats, no records. tqdm
is imported when a bar is made, never by a plain read.
"""

from __future__ import annotations

import sys
import time


class WriteProgress:
    """Write progress to stderr (tqdm): samples written, samples/s, payload MB/s, sources done, and
    an ETA when every source has a __len__ (sources are iterated once, never counted ahead).

    Invariant: the count is of samples of the sources written (or being written): a source that
    fails, or is kept from an earlier write, takes its samples back out of the count and its
    length out of the total when `source_done(written=False)` reports it. The description is
    "datasetrt write K/N sources" followed by tqdm's one ": ".
    """

    def __init__(self, sources: list) -> None:
        from tqdm import tqdm

        self.total_sources = len(sources)
        self.sources_done = 0
        self.source_samples = 0  # advanced since the current source started
        self.bytes = 0
        self.source_bytes = 0
        self.start = time.perf_counter()
        self.lengths: list[int] | None = None
        try:
            if all(hasattr(type(s), "__len__") for s in sources):
                self.lengths = [len(s) for s in sources]
        except Exception:
            self.lengths = None
        self.bar = tqdm(
            total=None if self.lengths is None else sum(self.lengths),
            unit=" samples",
            file=sys.stderr,
            dynamic_ncols=True,
            mininterval=0.5,
            desc=self._description(),
        )

    def _description(self) -> str:
        return f"datasetrt write {self.sources_done}/{self.total_sources} sources"

    def advance(self, samples: int, nbytes: int) -> None:
        """`samples` more records written, `nbytes` of payload before compression."""
        self.bytes += nbytes
        self.source_bytes += nbytes
        self.source_samples += samples
        self.bar.update(samples)
        self._rate()

    def _rate(self) -> None:
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        self.bar.set_postfix_str(f"{self.bytes / elapsed / 1e6:.1f} MB/s", refresh=False)

    def source_done(self, written: bool = True) -> None:
        """The current source is finished: `written` False when it failed or was not written
        (its samples leave the count, its length the total)."""
        if not written:
            self.bar.n -= self.source_samples
            self.bytes -= self.source_bytes
            if self.lengths is not None and self.bar.total is not None:
                self.bar.total -= self.lengths[self.sources_done]
            self._rate()
        self.sources_done += 1
        self.source_samples = self.source_bytes = 0
        self.bar.set_description_str(self._description(), refresh=False)  # drawn once, by the next update or close

    def close(self) -> None:
        self.bar.close()
