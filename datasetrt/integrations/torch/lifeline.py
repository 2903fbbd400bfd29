"""The `worker_init_fn` of every DataLoader datasetrt builds: its workers die with the process that
started them, then the user's `worker_init_fn` runs.

Boundary: torch-free (os, select, threading); knows nothing of datasets, plans or torch's worker
loop beyond the `worker_init_fn(worker_id)` call. The loader sets `parent_pid` in the process
that starts the workers (`DatasetRTDataLoader.__iter__`); this module runs in the workers.

Invariant: a worker whose parent is gone exits (`os._exit(1)`) whatever it is doing: a daemon
thread waits on a pidfd of the parent, which becomes readable when the parent exits, however it
died (SIGKILL included). torch's own watchdog only looks between batches, and a worker blocked in
a transform, or in its result queue's feeder thread at exit, would outlive the parent. A pidfd
names one process (never a reused pid) and, unlike prctl's PR_SET_PDEATHSIG, does not fire when
the parent *thread* that started the worker exits (a loader iterated from a short-lived thread
keeps its persistent workers). Without pidfds (Linux < 5.3) the fallback is PR_SET_PDEATHSIG
(SIGKILL) when the worker is the parent's direct child. Either way the parent is checked right
after the watch is set up, so a parent that died earlier is caught too.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import threading
from collections.abc import Callable
from typing import Any

PR_SET_PDEATHSIG = 1


class DieWithParent:
    """Picklable `worker_init_fn(worker_id)`: watch the parent (`parent_pid`, set before the
    workers start; this process's parent if None), then call `user_fn(worker_id)` if given."""

    def __init__(self, user_fn: Callable[[int], Any] | None) -> None:
        self.user_fn = user_fn
        self.parent_pid: int | None = None

    def __call__(self, worker_id: int) -> None:
        watch_parent(self.parent_pid if self.parent_pid is not None else os.getppid())
        if self.user_fn is not None:
            self.user_fn(worker_id)


def watch_parent(parent_pid: int) -> None:
    """Exit this process (`os._exit(1)`) as soon as process `parent_pid` is gone (module docstring)."""
    try:
        pidfd = os.pidfd_open(parent_pid)
    except ProcessLookupError:
        os._exit(1)
    except (OSError, AttributeError):
        _pdeathsig(parent_pid)
        return
    if select.select([pidfd], [], [], 0)[0]:  # already gone (a zombie not reaped yet)
        os._exit(1)

    def watch() -> None:
        select.select([pidfd], [], [])
        os._exit(1)

    threading.Thread(target=watch, name="datasetrt-parent-watch", daemon=True).start()


def _pdeathsig(parent_pid: int) -> None:
    """No pidfd: SIGKILL on the parent's death through prctl, if `parent_pid` is our parent;
    checked again after the call (it may have died in between)."""
    if os.getppid() != parent_pid:  # not our parent (forkserver's workers), or gone already
        try:
            os.kill(parent_pid, 0)
        except ProcessLookupError:
            os._exit(1)
        return  # a grandparent: PR_SET_PDEATHSIG cannot watch it
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:
        os._exit(1)
