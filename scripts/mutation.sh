#!/usr/bin/env bash
# Mutation score of the core modules (cosmic-ray; docs/testing.md): killed / survived / timeout
# and the score per module. Too slow for CI. Args: [--survivors] [--workdir DIR] [MODULE ...].
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$("$root/scripts/bootstrap.sh" | tail -n 1)"
cd "$root"
exec "$py" scripts/mutation.py "$@"
