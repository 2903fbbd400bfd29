#!/usr/bin/env bash
# Run the whole test suite from a fresh clone: sets itself up, then pytest. Extra args go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$("$root/scripts/bootstrap.sh" | tail -n 1)"
cd "$root"
exec "$py" -m pytest -q -p no:cacheprovider "$@"
