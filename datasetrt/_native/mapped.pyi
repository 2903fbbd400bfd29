"""Stub of datasetrt._native.mapped (_ext/mapped.pyx): whole files mapped read-only."""

import os

class MappedFile:
    """A whole file mapped read-only and shared, holding no descriptor; a read-only byte buffer."""

    def __init__(self, path: str | os.PathLike[str]) -> None: ...
    @property
    def size(self) -> int: ...
    @property
    def path(self) -> str: ...
    @property
    def address(self) -> int:
        """Base address of the mapping (0 for an empty file)."""
    def close(self) -> None:
        """Unmap now; BufferError while a buffer export is alive."""
    def __buffer__(self, flags: int, /) -> memoryview: ...
