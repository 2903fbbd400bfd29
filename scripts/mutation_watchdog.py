"""pytest plugin of the mutation runs (scripts/mutation.py loads it with `-p mutation_watchdog`):
a test still running after DATASETRT_MUTATION_TEST_TIMEOUT_S seconds (default 60) ends the whole
pytest process with its threads' tracebacks on stderr and exit status 1, so a mutant that hangs
one test is killed in about that long instead of after the module's whole-selection timeout.

Boundary: a mutation-run helper only; never loaded by the test suite itself (no test depends on
it). A test of the unmutated selection that needs longer fails the script's baseline check.
"""

from __future__ import annotations

import faulthandler
import os

import pytest

TEST_TIMEOUT_S = float(os.environ.get("DATASETRT_MUTATION_TEST_TIMEOUT_S", "60"))
# The real stderr, taken when `-p` imports the plugin (before pytest captures fd 2 per test).
_STDERR = os.fdopen(os.dup(2), "w")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Arm the watchdog for one test's setup, call and teardown; disarm it after."""
    faulthandler.dump_traceback_later(TEST_TIMEOUT_S, exit=True, file=_STDERR)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
