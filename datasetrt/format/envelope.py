"""Sample envelope: metadata value typing and the compact sorted-key JSON embedded in each record.

Boundary: Python values -> JSON bytes; no files. The JSON is byte-compatible with dataset-rt 0.4.8
(serde_json): compact, keys sorted, UTF-8 unescaped except `"`, `\\` and control characters, and
floats in shortest round-trip form, decimal for 1e-5 <= |x| < 1e16 and `1e-7` / `1e+16` otherwise.

Deliberate differences from dataset-rt (docs/python-api.md "Differences"): NaN/inf floats, ints
outside int64 and the reserved names cache_id/sample_id/weight are rejected at write time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from json.encoder import encode_basestring  # C-accelerated, ensure_ascii=False form
from typing import Any

import numpy as np

from datasetrt.errors import SourceError
from datasetrt.format.layout import RESERVED_COLUMNS

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
KIND_OF_TYPE: dict[type, str] = {bool: "bool", int: "int", float: "float", str: "string"}


def format_float(value: float) -> str:
    """serde_json/ryu text of a finite float (see module docstring)."""
    text = repr(value)
    if "e" not in text:
        return text
    mantissa, exp_text = text.split("e")
    exp = int(exp_text)
    if -5 <= exp < 16:  # Python switches to exponent form at 1e-4; serde at 1e-5
        negative = mantissa.startswith("-")
        digits = mantissa.lstrip("-").replace(".", "")
        return ("-" if negative else "") + "0." + "0" * (-exp - 1) + digits
    return f"{mantissa}e{'+' if exp > 0 else '-'}{abs(exp)}"


def normalize_value(key: str, value: Any) -> tuple[str, Any]:
    """Return (kind, plain Python value) for one metadata value, or raise SourceError."""
    t = type(value)
    if t is bool or t is np.bool_:
        return "bool", bool(value)
    if t is int or isinstance(value, np.integer):
        iv = int(value)
        if not INT64_MIN <= iv <= INT64_MAX:
            raise SourceError(f"metadata field '{key}' value {iv} is outside the int64 range")
        return "int", iv
    if t is float or isinstance(value, np.floating):
        fv = float(value)
        if not math.isfinite(fv):
            raise SourceError(f"metadata field '{key}' must be a finite float, got {fv!r}")
        return "float", fv
    if t is str:
        return "string", value
    # Subclasses (IntEnum, StrEnum, ...): take the stored value without calling overridable
    # __int__/__float__/__str__, as dataset-rt's native extraction does.
    if isinstance(value, int):
        return normalize_value(key, int.__int__(value))
    if isinstance(value, float):
        return normalize_value(key, float.__float__(value))
    if isinstance(value, str):
        return "string", str.__str__(value)
    raise SourceError("metadata values must be bool, int, float, or str")


def _encode_value(kind: str, value: Any) -> str:
    if kind == "bool":
        return "true" if value else "false"
    if kind == "int":
        return int.__repr__(value)
    if kind == "float":
        return format_float(value)
    return encode_basestring(value)


class MetadataSchema:
    """The fixed metadata schema of one source, taken from its first sample.

    Invariant: `names` is sorted; every later sample must have exactly these keys with the same
    kinds (bool is not int, int is not float), as dataset-rt requires.
    """

    def __init__(self, first: Mapping[str, Any]) -> None:
        checked = check_metadata_mapping(first)
        if not checked:
            # dataset-rt's wording (arrow-rs refuses a zero-column batch).
            raise SourceError(
                "Arrow error: Invalid argument error: must either specify a row count or at least one column"
            )
        names = sorted(str(n) for n in checked)
        for name in names:
            if name in RESERVED_COLUMNS:
                raise SourceError(
                    f"metadata field '{name}' is reserved: cache_id, sample_id and weight are table columns"
                )
        self.names: tuple[str, ...] = tuple(names)
        self.kinds: tuple[str, ...] = tuple(normalize_value(n, checked[n])[0] for n in names)
        self._prefixes = tuple(
            ("{" if i == 0 else ",") + encode_basestring(n) + ":" for i, n in enumerate(names)
        )
        self._name_set = frozenset(names)

    @property
    def items(self) -> list[tuple[str, str]]:
        return list(zip(self.names, self.kinds))

    def encode(self, metadata: Any) -> tuple[bytes, tuple[Any, ...]]:
        """Validate one sample's metadata; return (JSON bytes, values in `names` order)."""
        md = check_metadata_mapping(metadata)
        if len(md) != len(self.names):
            raise SourceError("metadata keys must be identical for every sample")
        parts: list[str] = []
        values: list[Any] = []
        for name, kind, prefix in zip(self.names, self.kinds, self._prefixes):
            try:
                raw = md[name]
            except KeyError:
                raise SourceError(f"metadata field '{name}' is missing") from None
            got_kind, value = normalize_value(name, raw)
            if got_kind != kind:
                raise SourceError(f"metadata field '{name}' expected {kind}, got {got_kind}")
            parts.append(prefix)
            parts.append(_encode_value(kind, value))
            values.append(value)
        parts.append("}")
        try:
            encoded = "".join(parts).encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate in a string value (or key): not storable UTF-8
            raise SourceError("metadata values must be bool, int, float, or str") from None
        return encoded, tuple(values)


def check_metadata_mapping(metadata: Any) -> dict:
    """The metadata must be a plain dict with str keys (dataset-rt refuses other mappings)."""
    if not isinstance(metadata, dict):
        raise SourceError("metadata must be a dict")
    for key in metadata:
        if not isinstance(key, str):  # str subclasses (np.str_, StrEnum) are accepted, as in dataset-rt
            raise SourceError("metadata keys must be strings")
    return metadata


def as_payload(data: Any) -> bytes:
    """The payload as immutable bytes: `bytes` as is, any other buffer copied (C order).

    The copy is required: records are committed in blocks after the source has moved on, and
    sources commonly reuse one bytearray/numpy buffer per sample (a view would see later
    contents, and would make resizing the buffer fail with BufferError). Non-contiguous and
    0-d buffers are accepted, as dataset-rt does.
    """
    if type(data) is bytes:
        return data
    if isinstance(data, str) or data is None:
        raise SourceError("data must be bytes-like")
    try:
        view = memoryview(data)
    except (TypeError, ValueError, BufferError):  # e.g. numpy object/datetime arrays refuse a buffer
        raise SourceError("data must be bytes-like") from None
    with view:
        return view.tobytes()


def unpack_input(item: Any) -> tuple[Any, Any]:
    """Split a yielded item into (data, metadata) with dataset-rt's messages."""
    if not isinstance(item, tuple):
        raise SourceError("CacheSource must yield CacheInput tuples")
    if len(item) != 2:
        raise SourceError("CacheInput must contain data and metadata")
    return item[0], item[1]
