"""runtime/signals.py: the SIGTERM handler pools hold — installed over the default only, counted,
put back by the last holder, never over a handler the program installed. (Live pools and a real
SIGTERM are in tests/runtime/test_preemption.py.)"""

from __future__ import annotations

import signal
import threading

import pytest

from datasetrt.runtime.signals import SigtermExit, raise_system_exit


@pytest.fixture
def default_sigterm(monkeypatch):
    """SIGTERM at its default and no holder, whatever pools of other tests hold; restored after."""
    saved = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(SigtermExit, "holders", 0)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGTERM, saved)


def test_the_handler_exits_with_the_status_of_a_death_by_the_signal():
    with pytest.raises(SystemExit) as info:
        raise_system_exit(signal.SIGTERM, None)
    assert info.value.code == 143


def test_held_from_the_first_acquire_to_the_last_release(default_sigterm):
    assert SigtermExit.acquire() and SigtermExit.acquire()
    assert signal.getsignal(signal.SIGTERM) is raise_system_exit and SigtermExit.holders == 2
    SigtermExit.release()
    assert signal.getsignal(signal.SIGTERM) is raise_system_exit
    SigtermExit.release()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL and SigtermExit.holders == 0


@pytest.mark.parametrize("program", [signal.SIG_IGN, lambda signum, frame: None], ids=["SIG_IGN", "own-handler"])
def test_a_disposition_the_program_chose_is_never_replaced(default_sigterm, program):
    signal.signal(signal.SIGTERM, program)
    assert not SigtermExit.acquire()
    assert signal.getsignal(signal.SIGTERM) is program and SigtermExit.holders == 0


def test_nothing_is_held_from_another_thread(default_sigterm):
    got = []
    thread = threading.Thread(target=lambda: got.append(SigtermExit.acquire()))
    thread.start()
    thread.join()
    assert got == [False] and SigtermExit.holders == 0
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_forked_child_starts_with_the_default(default_sigterm):
    assert SigtermExit.acquire()
    SigtermExit.after_fork_in_child()  # what os.register_at_fork runs in the child
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL and SigtermExit.holders == 0
