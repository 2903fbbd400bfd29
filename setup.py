"""Build the Cython kernels in _ext/ into the private package datasetrt._native.

One extension module per kernel. The codecs are linked INTO each module, so an installed wheel
needs no codec library on the user's machine:
  - liblz4 and libzstd from their static archives (`liblz4.a`, `libzstd.a`, which Debian's
    liblz4-dev / libzstd-dev ship). Debian builds them as PIE, not PIC: their objects reference
    their own global functions PC-relatively, which a shared object may only do for symbols it
    does not export, so the link hides every archive symbol (`-Wl,--exclude-libs,ALL`); the
    modules export only `PyInit_<name>`. The linker takes only the archive members a kernel uses.
  - xxhash compiled in from its header (`XXH_INLINE_ALL`): Debian's libxxhash.a is PIE too, and
    the inlined XXH3 is what the per-record checksum loop wants anyway.
The headers (lz4.h, zstd.h, xxhash.h) are needed at build time only; their absence stops the build
before anything compiles, with one line naming the packages to install.

Environment (all optional):
  DATASETRT_INCLUDE_DIRS  dirs (os.pathsep-separated) holding lz4.h, zstd.h, xxhash.h; replaces the
                          default search (CPATH, C_INCLUDE_PATH, /usr/local/include, /usr/include)
  DATASETRT_LIBRARY_DIRS  dirs holding liblz4.a / libzstd.a (or the shared libraries); replaces the
                          default search (LIBRARY_PATH, the system library dirs)
  DATASETRT_LINK          static | shared | auto (default auto: the static archives when both are
                          found, else the shared libraries). scripts/build_wheels.sh sets static.
"""

import os
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

KERNELS = ["draws", "codec", "gather", "batch"]
# header -> (Debian package, RPM package)
HEADERS = {
    "lz4.h": ("liblz4-dev", "lz4-devel"),
    "zstd.h": ("libzstd-dev", "libzstd-devel"),
    "xxhash.h": ("libxxhash-dev", "xxhash-devel"),
}
ARCHIVED = ["lz4", "zstd"]  # linked from lib<name>.a (or lib<name>.so); xxhash is header-only


def _env_dirs(name: str) -> list[str] | None:
    value = os.environ.get(name)
    return None if value is None else [d for d in value.split(os.pathsep) if d]


def include_dirs() -> list[str]:
    """Where the codec headers are looked for, in order."""
    explicit = _env_dirs("DATASETRT_INCLUDE_DIRS")
    if explicit is not None:
        return explicit
    dirs = (_env_dirs("CPATH") or []) + (_env_dirs("C_INCLUDE_PATH") or [])
    return dirs + ["/usr/local/include", "/usr/include"]


def library_dirs() -> list[str]:
    """Where the codec libraries are looked for, in order."""
    explicit = _env_dirs("DATASETRT_LIBRARY_DIRS")
    if explicit is not None:
        return explicit
    multiarch = sysconfig.get_config_var("MULTIARCH")
    system = [f"/usr/lib/{multiarch}"] if multiarch else []
    system += ["/usr/local/lib64", "/usr/local/lib", "/usr/lib64", "/usr/lib"]
    return (_env_dirs("LIBRARY_PATH") or []) + system


def _find(name: str, dirs: list[str]) -> str | None:
    return next((os.path.join(d, name) for d in dirs if os.path.isfile(os.path.join(d, name))), None)


def fail(message: str) -> None:
    """Stop the build with one line on stderr and exit status 1 (no traceback)."""
    print(f"datasetrt build: {message}", file=sys.stderr, flush=True)
    raise SystemExit(1)


def codec_build_args() -> dict:
    """Extension keyword arguments linking the codecs in; fails with one line if headers are missing."""
    incs = include_dirs()
    missing = [h for h in HEADERS if _find(h, incs) is None]
    if missing:
        fail(
            f"missing codec header(s) {', '.join(missing)} (searched {os.pathsep.join(incs) or 'nothing'}); "
            f"install {' '.join(HEADERS[h][0] for h in missing)} (Debian/Ubuntu) or "
            f"{' '.join(HEADERS[h][1] for h in missing)} (Fedora/RHEL), or point DATASETRT_INCLUDE_DIRS at them"
        )
    mode = os.environ.get("DATASETRT_LINK", "auto")
    if mode not in ("auto", "static", "shared"):
        fail(f"DATASETRT_LINK={mode!r}: expected static, shared or auto")
    libs = library_dirs()
    archives = [_find(f"lib{name}.a", libs) for name in ARCHIVED]
    if mode == "static" and None in archives:
        absent = [f"lib{n}.a" for n, a in zip(ARCHIVED, archives) if a is None]
        fail(f"DATASETRT_LINK=static but {', '.join(absent)} not found in {os.pathsep.join(libs)}; "
             "install liblz4-dev libzstd-dev (Debian/Ubuntu) or lz4-static libzstd-static (Fedora/RHEL), "
             "or set DATASETRT_LIBRARY_DIRS")
    # Only dirs the compiler would not search anyway (an explicit DATASETRT_INCLUDE_DIRS) go on -I.
    found = dict.fromkeys(os.path.dirname(_find(h, incs)) for h in HEADERS)
    args = {
        "include_dirs": list(found) if _env_dirs("DATASETRT_INCLUDE_DIRS") is not None else [],
        "define_macros": [("XXH_INLINE_ALL", None)],
    }
    if mode != "shared" and None not in archives:
        args["extra_objects"] = archives
        args["extra_link_args"] = ["-Wl,--exclude-libs,ALL"]
    else:
        args["library_dirs"] = [d for d in libs if os.path.isdir(d)]
        args["libraries"] = ARCHIVED
    return args


class BuildKernels(build_ext):
    """build_ext that checks the codec headers before Cython or the compiler runs, then cythonizes.

    The check lives in run(), not finalize_options(): `sdist` finalizes build_ext to list sources
    and must work on a machine without the headers.
    """

    def finalize_options(self) -> None:
        super().finalize_options()
        if not self.parallel:  # compile the kernels side by side unless told (build_ext -j N)
            self.parallel = min(len(KERNELS), os.cpu_count() or 1)

    def run(self) -> None:
        from Cython.Build import cythonize

        codec = codec_build_args()
        for ext in self.extensions:
            for key, value in codec.items():
                getattr(ext, key).extend(value)
        generated = cythonize(
            self.extensions,
            include_path=["_ext"],
            quiet=True,
            compiler_directives={
                "language_level": "3",
                "boundscheck": False,
                "wraparound": False,
                "cdivision": True,
                "initializedcheck": False,
            },
        )
        for ext, c_ext in zip(self.extensions, generated, strict=True):
            ext.sources = c_ext.sources
        super().run()


extensions = [
    Extension(f"datasetrt._native.{name}", [f"_ext/{name}.pyx"], include_dirs=["_ext"], extra_compile_args=["-O3"])
    for name in KERNELS
]

setup(ext_modules=extensions, cmdclass={"build_ext": BuildKernels})
