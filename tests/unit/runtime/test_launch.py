"""runtime/launch.py in-process: the poller the pool waits with, what a pool waits on, and the
__main__ hiding around a worker's start. (Launching, crashing and stopping real workers, fork and
spawn, is tests/runtime/.)"""

from __future__ import annotations

import os
import sys

import multiprocess as mp

from datasetrt.runtime import launch
from datasetrt.runtime.launch import Poller, WorkerProcesses


def test_poller_returns_what_is_readable_as_given_and_keeps_its_poll_object():
    a_r, a_w = mp.Pipe(duplex=False)
    b_r, b_w = os.pipe()
    try:
        poller = Poller()
        assert poller.wait([a_r, b_r], 0) == []
        kept = poller._poll
        os.write(b_w, b"x")
        assert poller.wait([a_r, b_r], 0) == [b_r] and poller._poll is kept  # the same set: no new poll object
        assert not poller.readable(a_r)
        a_w.send_bytes(b"y")
        assert poller.readable(a_r) and set(poller.wait([a_r, b_r], 0)) == {a_r, b_r}
        assert poller.wait([a_r], 0) == [a_r] and poller._poll is not kept  # another set: registered anew
    finally:
        for conn in (a_r, a_w):
            conn.close()
        os.close(b_r)
        os.close(b_w)


def test_a_fork_pool_waits_on_results_and_known_sentinels_only():
    class Proc:
        def __init__(self, sentinel):
            self.sentinel = sentinel

    processes = WorkerProcesses(procs=[Proc(7), Proc(None)], result_conns=["r0", "r1"])
    assert processes.waitables() == ["r0", "r1", 7]


def test_main_module_is_hidden_only_while_a_worker_starts(monkeypatch):
    main = sys.modules["__main__"]
    monkeypatch.setattr(main, "__file__", "/user/script.py", raising=False)
    spec = object()
    monkeypatch.setattr(main, "__spec__", spec, raising=False)
    with launch._main_module_hidden():
        assert not hasattr(main, "__file__") and main.__spec__ is None
    assert main.__file__ == "/user/script.py" and main.__spec__ is spec
