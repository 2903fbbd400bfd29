"""Build the Cython kernels in _ext/ into the private package datasetrt._native.

One extension module per kernel. The codecs are linked INTO each module, so an installed wheel
needs no codec library on the user's machine: from their static archives (`liblz4.a`, `libzstd.a`,
`libxxhash.a`, which Debian's -dev packages ship). liblz4.a and libxxhash.a are PIC; Debian builds
libzstd.a as PIE, whose objects reference their own global functions PC-relatively, which a
shared object may only do for symbols it does not export, so the link hides every archive symbol
(`-Wl,--exclude-libs,ALL`); the modules export only Python's symbols. The linker takes only the
archive members a kernel uses. Where libxxhash.a is absent (RPM distros ship no static xxhash in
xxhash-devel), XXH3 is compiled in from the header instead (`XXH_INLINE_ALL`).
The headers (lz4.h, zstd.h, xxhash.h) are needed at build time only; their absence stops the build
before anything compiles, with one line naming the packages to install.

Environment (all optional):
  DATASETRT_INCLUDE_DIRS  dirs (os.pathsep-separated) holding lz4.h, zstd.h, xxhash.h; replaces the
                          default search (CPATH, C_INCLUDE_PATH, /usr/local/include, /usr/include)
  DATASETRT_LIBRARY_DIRS  dirs holding liblz4.a / libzstd.a / libxxhash.a (or the shared
                          libraries); replaces the default search (LIBRARY_PATH, system lib dirs)
  DATASETRT_LINK          static | shared | auto (default auto: the static archives when liblz4.a
                          and libzstd.a are found, else the shared libraries); static fails
                          without them. scripts/build_wheels.sh sets static.
"""

import os
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

KERNELS = ["draws", "codec", "mapped", "table", "gather", "batch", "perm"]
# header -> (Debian package, RPM package)
HEADERS = {
    "lz4.h": ("liblz4-dev", "lz4-devel"),
    "zstd.h": ("libzstd-dev", "libzstd-devel"),
    "xxhash.h": ("libxxhash-dev", "xxhash-devel"),
}
ARCHIVED = ["lz4", "zstd"]  # linked from lib<name>.a (or lib<name>.so)
# xxhash: libxxhash.a when present, else compiled in from xxhash.h (XXH_INLINE_ALL); libxxhash.so
# only with DATASETRT_LINK=shared.


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
        fail(
            f"DATASETRT_LINK=static but {', '.join(absent)} not found in {os.pathsep.join(libs)}; "
            "install liblz4-dev libzstd-dev (Debian/Ubuntu) or lz4-static libzstd-static (Fedora/RHEL), "
            "or set DATASETRT_LIBRARY_DIRS"
        )
    # Only dirs the compiler would not search anyway (an explicit DATASETRT_INCLUDE_DIRS) go on -I.
    found = dict.fromkeys(os.path.dirname(_find(h, incs)) for h in HEADERS)
    args = {"include_dirs": list(found) if _env_dirs("DATASETRT_INCLUDE_DIRS") is not None else []}
    if mode == "shared" or None in archives:
        args["library_dirs"] = [d for d in libs if os.path.isdir(d)]
        args["libraries"] = [*ARCHIVED, "xxhash"]
        return args
    xxhash = _find("libxxhash.a", libs)
    args["extra_objects"] = archives + ([xxhash] if xxhash else [])
    args["extra_link_args"] = ["-Wl,--exclude-libs,ALL"]
    args["define_macros"] = [] if xxhash else [("XXH_INLINE_ALL", None)]
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


DOCS = "docs"  # the checkout's Markdown pages, which docstrings name as docs/NAME.md
PACKAGED_DOCS = os.path.join("datasetrt", "_docs")  # where the sdist and the wheel carry them


def doc_pages() -> list[str]:
    """The checkout's pages (docs/*.md), sorted; none in an unpacked sdist (it carries them
    at datasetrt/_docs/ already, as package data)."""
    if not os.path.isdir(DOCS):
        return []
    return sorted(os.path.join(DOCS, name) for name in os.listdir(DOCS) if name.endswith(".md"))


class BuildPyWithDocs(build_py):
    """build_py that also copies the checkout's docs/*.md into the built package's _docs/, so an
    installed package opens them (`datasetrt docs TOPIC`, datasetrt/cli/docs.py)."""

    def run(self) -> None:
        super().run()
        pages = doc_pages()
        if pages:
            target = os.path.join(self.build_lib, PACKAGED_DOCS)
            self.mkpath(target)
            for page in pages:
                self.copy_file(page, target)


class SdistWithDocs(sdist):
    """sdist that carries the pages at datasetrt/_docs/ (not docs/): the wheel built from the
    sdist takes them as package data."""

    def make_release_tree(self, base_dir: str, files: list) -> None:
        super().make_release_tree(base_dir, files)
        target = os.path.join(base_dir, PACKAGED_DOCS)
        self.mkpath(target)
        for page in doc_pages():
            self.copy_file(page, target)


extensions = [
    Extension(f"datasetrt._native.{name}", [f"_ext/{name}.pyx"], include_dirs=["_ext"], extra_compile_args=["-O3"])
    for name in KERNELS
]

if __name__ == "__main__":  # as setuptools runs it; tests import the link decisions without building
    setup(
        ext_modules=extensions,
        cmdclass={"build_ext": BuildKernels, "build_py": BuildPyWithDocs, "sdist": SdistWithDocs},
    )
