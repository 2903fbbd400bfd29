"""Process-tree memory sampling: PSS (psutil memory_full_info) of a process and its children.

PSS splits shared pages between the processes mapping them, so summing PSS over a tree counts
each shared page once, unlike summed RSS.
"""

from __future__ import annotations

import threading

import psutil


def tree_pss_bytes(root: psutil.Process | None = None) -> int:
    """Sum of PSS over `root` (default: this process) and all its descendants, in bytes."""
    root = root or psutil.Process()
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            total += proc.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return total


class PeakPss:
    """Samples tree PSS every `interval_s` in a background thread; `peak` and `last` in bytes."""

    def __init__(self, interval_s: float = 0.05, root: psutil.Process | None = None) -> None:
        self.interval_s = interval_s
        self.root = root or psutil.Process()
        self.peak = 0
        self.last = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pss-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def sample(self) -> int:
        value = tree_pss_bytes(self.root)
        self.last = value
        self.peak = max(self.peak, value)
        return value

    def __enter__(self) -> PeakPss:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()
