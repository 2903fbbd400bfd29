"""Writer progress: the stderr bar of a cache write (`WriterConfig.show_progress`).

Boundary: counts the writer reports (`advance`, `source_done`); no file formats, no records. tqdm
is imported when a bar is made, never by a plain read.
"""

from __future__ import annotations

import sys
import time


class WriteProgress:
    """Write progress to stderr (tqdm): samples, samples/s, payload MB/s, sources done, and an ETA
    when every source has a __len__ (sources are iterated once, never counted ahead)."""

    def __init__(self, sources: list) -> None:
        from tqdm import tqdm

        self.total_sources = len(sources)
        self.sources_done = 0
        self.bytes = 0
        self.start = time.perf_counter()
        total = None
        try:
            if all(hasattr(type(s), "__len__") for s in sources):
                total = sum(len(s) for s in sources)
        except Exception:
            total = None
        self.bar = tqdm(
            total=total,
            unit=" samples",
            file=sys.stderr,
            dynamic_ncols=True,
            mininterval=0.5,
            desc=f"datasetrt write 0/{self.total_sources} sources",
        )

    def advance(self, samples: int, nbytes: int) -> None:
        """`samples` more records written, `nbytes` of payload before compression."""
        self.bytes += nbytes
        self.bar.update(samples)
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        self.bar.set_postfix_str(f"{self.bytes / elapsed / 1e6:.1f} MB/s", refresh=False)

    def source_done(self) -> None:
        self.sources_done += 1
        self.bar.set_description(f"datasetrt write {self.sources_done}/{self.total_sources} sources", refresh=False)

    def close(self) -> None:
        self.bar.close()
