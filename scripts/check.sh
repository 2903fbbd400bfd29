#!/usr/bin/env bash
# The static checks of the test command: ruff (lint, then format) over the whole tree and mypy over
# the package, with the configuration in pyproject.toml. Exits non-zero on the first that fails.
# Usage: scripts/check.sh [PYTHON]   (default: the venv's python, set up by scripts/bootstrap.sh)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${1:-$root/.venv/bin/python}"
cd "$root"
echo "check: ruff check" >&2
"$py" -m ruff check --no-cache --quiet .
echo "check: ruff format --check" >&2
"$py" -m ruff format --no-cache --check --quiet .
echo "check: mypy" >&2
"$py" -m mypy --no-incremental --cache-dir=/dev/null
