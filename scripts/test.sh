#!/usr/bin/env bash
# Run the whole test suite from a fresh clone: sets itself up, then pytest. Extra args go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$("$root/scripts/bootstrap.sh" | tail -n 1)"
cd "$root"
"$root/scripts/check.sh" "$py"  # ruff and mypy: the test command fails on any finding
export DATASETRT_HYPOTHESIS_PROFILE="${DATASETRT_HYPOTHESIS_PROFILE:-ci}"  # derandomized properties (tests/conftest.py)
if [ "${1:-}" = "--slow" ]; then shift; set -- -m slow "$@"; fi  # the slow cases only (docs/testing.md): the long soak, the whole benchmark smoke
exec "$py" -m pytest -q -p no:cacheprovider "$@"
