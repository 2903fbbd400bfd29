"""Types shared by the kernels' stubs (a stub only: nothing imports it at run time).

A kernel argument typed `const uint8_t[::1]` (or int64_t, uint64_t, ...) takes any 1-D
C-contiguous buffer of that item type: bytes, bytearray, memoryview, array.array, a numpy array
or a `MappedFile`. numpy's stubs declare `__buffer__` for Python 3.12 and later only, so arrays
are named beside `Buffer`.
"""

from typing import Any, TypeAlias

import numpy as np
from typing_extensions import Buffer

BufferLike: TypeAlias = Buffer | np.ndarray[Any, Any]
