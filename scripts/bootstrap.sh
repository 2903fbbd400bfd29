#!/usr/bin/env bash
# Set up everything the two README commands need on a fresh machine, idempotently:
#   1. the codec headers and static archives the Cython kernels are built from (Debian: liblz4-dev,
#      libzstd-dev, libxxhash-dev; a development set-up only: the wheels of scripts/build_wheels.sh
#      carry the codecs and need none of them);
#   2. a virtualenv in .venv with the build tools, the package (editable) and its dev extra;
#   3. the compiled kernels, rebuilt in place when a .pyx/.pxd changed;
#   4. bytecode for the package, as a pip install of a wheel would leave it (this machine sets
#      PYTHONDONTWRITEBYTECODE=1, so without it every process - each spawned worker included -
#      recompiles every module it imports: ~10 ms for integrations/torch.py alone).
# Prints the venv's python path on its last line of stdout for callers.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

need_headers=()
[ -f /usr/include/lz4.h ] || need_headers+=(liblz4-dev)
[ -f /usr/include/zstd.h ] || need_headers+=(libzstd-dev)
[ -f /usr/include/xxhash.h ] || need_headers+=(libxxhash-dev)
if [ ${#need_headers[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "bootstrap: missing codec headers; run as root or install: ${need_headers[*]}" >&2
    exit 1
  fi
  echo "bootstrap: installing ${need_headers[*]}" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_headers[@]}" >&2
fi

venv="$root/.venv"
py="$venv/bin/python"
stamp="$venv/.datasetrt-installed"
install_mode="editable_mode=compat"  # a plain path entry: no import-hook finder at every start-up
deps_hash="$( (cat pyproject.toml setup.py; echo "$install_mode") | sha256sum | cut -c1-16)"
if [ ! -x "$py" ]; then
  python3 -m venv "$venv" >&2
fi
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$deps_hash" ]; then
  echo "bootstrap: installing build tools and datasetrt[dev] into .venv" >&2
  "$py" -m pip install -q --upgrade pip >&2
  # torch is not a dependency; the pins keep anything from pulling a newer one.
  "$py" -m pip install -q "setuptools>=68" wheel "Cython>=3.0" >&2
  # (setuptools calls compat mode transitional; should a release drop it, take the default mode.)
  "$py" -m pip install -q --no-build-isolation --config-settings "$install_mode" -e ".[dev]" >&2 2>/dev/null \
    || "$py" -m pip install -q --no-build-isolation -e ".[dev]" >&2
  echo "$deps_hash" > "$stamp"
fi
# Rebuild the kernels in place when sources changed (cythonize skips unchanged modules).
"$py" setup.py -q build_ext --inplace >&2 2>/dev/null || "$py" setup.py build_ext --inplace >&2
"$py" -m compileall -q -j 0 datasetrt benchmarks >&2
echo "$py"
