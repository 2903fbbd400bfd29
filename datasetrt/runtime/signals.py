"""SIGTERM while reader workers run: a handler that turns it into SystemExit(143) in the main thread.

Boundary: the `signal` module and the process's SIGTERM disposition only; knows nothing of
pools, workers or runs (a pool holds the handler through `SigtermExit.acquire` / `release`).

While some pool holds it, a process whose SIGTERM disposition was the default raises
SystemExit(128 + SIGTERM) in the main thread, so `finally` blocks and the runtime's cleanup run
as for Ctrl-C and the exit status is still 143. A handler the program installed (or SIG_IGN) is
never replaced; the default comes back when the last holder releases it (from the main thread),
and a forked child starts with the default (`os.register_at_fork`, at import).
"""

from __future__ import annotations

import os
import signal
import threading


def raise_system_exit(signum: int, _frame) -> None:
    """The handler: SystemExit with the status a death by `signum` would give (128 + signum)."""
    raise SystemExit(128 + signum)


class SigtermExit:
    """The SIGTERM handler pools hold (module docstring): installed by the first holder, put
    back to the default by the last, never over a handler the program installed itself.

    `holders` counts the holders of this process; it is touched only from the main thread."""

    holders = 0

    @classmethod
    def acquire(cls) -> bool:
        """Hold the handler (installing it over SIG_DFL); False when this is not the main thread
        or the program has its own handler (the caller then holds nothing)."""
        if threading.current_thread() is not threading.main_thread():
            return False
        current = signal.getsignal(signal.SIGTERM)
        if current is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, raise_system_exit)
        elif current is not raise_system_exit:
            return False
        cls.holders += 1
        return True

    @classmethod
    def release(cls, _signal=signal, _threading=threading, _handler=raise_system_exit) -> None:
        """Give one hold back; the last restores SIG_DFL if the handler is still ours. (Modules
        bound as defaults: a pool may be closed during interpreter teardown.)"""
        cls.holders -= 1
        if (
            cls.holders == 0
            and _threading.current_thread() is _threading.main_thread()
            and _signal.getsignal(_signal.SIGTERM) is _handler
        ):
            _signal.signal(_signal.SIGTERM, _signal.SIG_DFL)

    @classmethod
    def after_fork_in_child(cls) -> None:
        """A forked child (a reader or DataLoader worker) has no pool: SIGTERM kills it as usual."""
        cls.holders = 0
        try:
            if signal.getsignal(signal.SIGTERM) is raise_system_exit:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
        except ValueError:  # not the main thread (cannot happen in a fresh child; be safe)
            pass


os.register_at_fork(after_in_child=SigtermExit.after_fork_in_child)
