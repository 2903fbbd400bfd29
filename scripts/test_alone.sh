#!/usr/bin/env bash
# Run every test file alone (one fresh pytest per file, its tests shuffled by pytest-randomly with one
# printed seed) and print a per-file pass/fail table: a test that needs state another file's tests
# left behind fails here. Usage (docs/testing.md):
#   scripts/test_alone.sh [--seed N] [FILE_OR_DIR ...]     (default: every tests/**/test_*.py)
# Exit status 1 when any file fails; each failing file's output is kept (its path is printed).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$("$root/scripts/bootstrap.sh" | tail -n 1)" || exit 2
cd "$root"
export DATASETRT_HYPOTHESIS_PROFILE="${DATASETRT_HYPOTHESIS_PROFILE:-ci}"  # as scripts/test.sh
seed=$(( (RANDOM << 15) | RANDOM ))
if [ "${1:-}" = "--seed" ]; then seed="$2"; shift 2; fi
logs="$(mktemp -d "${TMPDIR:-/tmp}/datasetrt-alone.XXXXXX")"
mapfile -t files < <(find "${@:-tests}" -name 'test_*.py' | sort)
echo "pytest-randomly seed $seed; ${#files[@]} files; logs in $logs"
failed=0
started=$(date +%s)
for f in "${files[@]}"; do
  log="$logs/$(echo "$f" | tr / _).log"
  t0=$(date +%s)
  "$py" -m pytest -q -p no:cacheprovider -p randomly "--randomly-seed=$seed" "$f" >"$log" 2>&1
  rc=$?
  # 5: nothing collected (a file whose tests are all slow); 0: passed; anything else fails
  case $rc in 0) status=pass ;; 5) status=none ;; *) status=FAIL; failed=$((failed + 1)) ;; esac
  summary="$(grep -E '^(=+ )?[0-9]+ (passed|failed|error|skipped|deselected)|no tests ran' "$log" | tail -n 1)"
  printf '%-4s %5ss  %-62s %s\n' "$status" "$(( $(date +%s) - t0 ))" "$f" "${summary//=/}"
  [ "$status" = FAIL ] || rm -f "$log"
done
echo "$(( ${#files[@]} - failed )) of ${#files[@]} files pass alone (seed $seed) in $(( ($(date +%s) - started) / 60 )) min"
[ "$failed" -eq 0 ]
