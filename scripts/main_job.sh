#!/usr/bin/env bash
# The main job end to end on generated data: write caches, reweight with Polars, read, report.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$("$root/scripts/bootstrap.sh" | tail -n 1)"
cd "$root"
exec "$py" -m datasetrt.cli.demo "$@"
