"""Build the Cython kernels in _ext/ into the private package datasetrt._native.

One extension module per kernel; all link the system codec libraries (liblz4, libzstd, libxxhash),
whose headers scripts/bootstrap.sh installs from Debian's packages.
"""

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

KERNELS = ["draws", "codec", "gather", "batch", "perm"]
LIBRARIES = ["lz4", "zstd", "xxhash"]

extensions = [
    Extension(
        f"datasetrt._native.{name}",
        [f"_ext/{name}.pyx"],
        include_dirs=[numpy.get_include(), "_ext"],
        libraries=LIBRARIES,
        extra_compile_args=["-O3"],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )
    for name in KERNELS
]

setup(
    ext_modules=cythonize(
        extensions,
        include_path=["_ext"],
        compiler_directives={
            "language_level": "3",
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": False,
        },
    )
)
