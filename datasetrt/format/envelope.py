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
VALUE_KINDS = "metadata values must be bool, int, float, or str"  # dataset-rt's wording (reference §2.5)
EMPTY_METADATA = "Arrow error: Invalid argument error: must either specify a row count or at least one column"
_SHOWN_CHARS = 80  # a value quoted in a message is cut to this many characters of its repr


def where(sample: int | None, column: str | None = None) -> str:
    """ "sample 5, column 'label'" (the parts that are known) for messages; "" when neither is."""
    parts = [] if sample is None else [f"sample {sample}"]
    if column is not None:
        parts.append(f"column {column!r}")
    return ", ".join(parts)


def shown(value: Any) -> str:
    """A value as a message quotes it: its type and repr, the repr cut to _SHOWN_CHARS."""
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__} object>"
    if len(text) > _SHOWN_CHARS:
        text = text[: _SHOWN_CHARS - 3] + "..."
    return f"{type(value).__name__} {text}"


def _reject(reference: str, sample: int | None, column: str | None = None, detail: str | None = None) -> SourceError:
    """SourceError "<reference>: <sample k, column 'c'>: <detail>" (the parts that are known):
    the wording of dataset-rt (or of datasetrt's own check) first, as users match on it, then
    where and what."""
    return SourceError(": ".join(part for part in (reference, where(sample, column), detail) if part))


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


def normalize_value(key: str, value: Any, sample: int | None = None) -> tuple[str, Any]:
    """Return (kind, plain Python value) for one metadata value, or raise SourceError naming the
    column, the value and (when given) the sample's position in its source."""
    t = type(value)
    if t is bool or t is np.bool_:
        return "bool", bool(value)
    if t is int or isinstance(value, np.integer):
        iv = int(value)
        if not INT64_MIN <= iv <= INT64_MAX:
            raise _reject(f"metadata field '{key}' value {iv} is outside the int64 range", sample)
        return "int", iv
    if t is float or isinstance(value, np.floating):
        fv = float(value)
        if not math.isfinite(fv):
            raise _reject(f"metadata field '{key}' must be a finite float, got {fv!r}", sample)
        return "float", fv
    if t is str:
        return "string", value
    # Subclasses (IntEnum, StrEnum, ...): take the stored value without calling overridable
    # __int__/__float__/__str__, as dataset-rt's native extraction does.
    if isinstance(value, int):
        return normalize_value(key, int.__int__(value), sample)
    if isinstance(value, float):
        return normalize_value(key, float.__float__(value), sample)
    if isinstance(value, str):
        return "string", str.__str__(value)
    raise _reject(VALUE_KINDS, sample, key, f"got {shown(value)}")


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

    def __init__(self, first: Mapping[str, Any], sample: int | None = None) -> None:
        checked = check_metadata_mapping(first, sample)
        if not checked:
            # dataset-rt's wording (arrow-rs refuses a zero-column batch), then what it means here.
            raise _reject(
                EMPTY_METADATA,
                sample,
                None,
                "the metadata is an empty dict {}; a source's samples need at least one metadata column",
            )
        names = sorted(str(n) for n in checked)
        problems: list[SourceError] = []
        kinds: list[str] = []
        for name in names:  # every refused column is named in one error (the first one's wording leads)
            if name in RESERVED_COLUMNS:
                problems.append(
                    _reject(
                        f"metadata field '{name}' is reserved: cache_id, sample_id and weight are table columns", sample
                    )
                )
                continue
            try:
                kinds.append(normalize_value(name, checked[name], sample)[0])
            except SourceError as exc:
                problems.append(exc)
        if problems:
            raise problems[0] if len(problems) == 1 else SourceError("; ".join(map(str, problems)))
        self.names: tuple[str, ...] = tuple(names)
        self.kinds: tuple[str, ...] = tuple(kinds)
        self._prefixes = tuple(("{" if i == 0 else ",") + encode_basestring(n) + ":" for i, n in enumerate(names))
        self._name_set = frozenset(names)

    @property
    def items(self) -> list[tuple[str, str]]:
        return list(zip(self.names, self.kinds))

    def encode(self, metadata: Any, sample: int | None = None) -> tuple[bytes, tuple[Any, ...]]:
        """Validate one sample's metadata; return (JSON bytes, values in `names` order).

        `sample` (its position in the source) is only used in messages."""
        md = check_metadata_mapping(metadata, sample)
        if len(md) != len(self.names):
            raise _reject("metadata keys must be identical for every sample", sample, None, self._keys_detail(md))
        parts: list[str] = []
        values: list[Any] = []
        for name, kind, prefix in zip(self.names, self.kinds, self._prefixes):
            try:
                raw = md[name]
            except KeyError:
                raise _reject(f"metadata field '{name}' is missing", sample, None, self._keys_detail(md)) from None
            got_kind, value = normalize_value(name, raw, sample)
            if got_kind != kind:
                raise _reject(
                    f"metadata field '{name}' expected {kind}, got {got_kind}",
                    sample,
                    None,
                    f"value {raw!r}"[: _SHOWN_CHARS + 6],
                )
            parts.append(prefix)
            parts.append(_encode_value(kind, value))
            values.append(value)
        parts.append("}")
        try:
            encoded = "".join(parts).encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate in a string value (or key): not storable UTF-8
            raise self._unencodable(md, sample) from None
        return encoded, tuple(values)

    def _keys_detail(self, md: dict) -> str:
        got, want = repr(sorted(map(str, md))), repr(list(self.names))
        cut = 4 * _SHOWN_CHARS
        return f"keys {got if len(got) <= cut else got[:cut] + '...'}, expected {want if len(want) <= cut else want[:cut] + '...'}"

    def _unencodable(self, md: dict, sample: int | None) -> SourceError:
        """The error for a key or str value that UTF-8 cannot encode (a lone surrogate such as
        "\\udcff", e.g. from os.fsdecode of a non-UTF-8 file name). Error path only."""
        for name in self.names:
            for text, what in ((name, "the column name"), (md[name], "the value")):
                if isinstance(text, str):
                    try:
                        text.encode("utf-8")
                    except UnicodeEncodeError as exc:
                        return _reject(
                            VALUE_KINDS,
                            sample,
                            name,
                            f"{what} {text[:_SHOWN_CHARS]!r} is a str that UTF-8 cannot encode "
                            f"({exc.reason}: {text[exc.start : exc.end]!r} at index {exc.start})",
                        )
        return _reject(VALUE_KINDS, sample, None, "a str that UTF-8 cannot encode")


def check_metadata_mapping(metadata: Any, sample: int | None = None) -> dict:
    """The metadata must be a plain dict with str keys (dataset-rt refuses other mappings)."""
    if not isinstance(metadata, dict):
        raise _reject(
            "metadata must be a dict", sample, None, None if sample is None else f"got {type(metadata).__name__}"
        )
    for key in metadata:
        if not isinstance(key, str):  # str subclasses (np.str_, StrEnum) are accepted, as in dataset-rt
            raise _reject(
                "metadata keys must be strings", sample, None, None if sample is None else f"key {shown(key)}"
            )
    return metadata


def as_payload(data: Any, sample: int | None = None) -> bytes:
    """The payload as immutable bytes: `bytes` as is, any other buffer copied (C order).

    The copy is required: records are committed in blocks after the source has moved on, and
    sources commonly reuse one bytearray/numpy buffer per sample (a view would see later
    contents, and would make resizing the buffer fail with BufferError). Non-contiguous and
    0-d buffers are accepted, as dataset-rt does.
    """
    if type(data) is bytes:
        return data
    if isinstance(data, str) or data is None:
        raise _not_bytes(data, sample)
    try:
        view = memoryview(data)
    except (TypeError, ValueError, BufferError):  # e.g. numpy object/datetime arrays refuse a buffer
        raise _not_bytes(data, sample) from None
    with view:
        return view.tobytes()


def _not_bytes(data: Any, sample: int | None) -> SourceError:
    return _reject("data must be bytes-like", sample, None, None if sample is None else f"got {type(data).__name__}")


def unpack_input(item: Any, sample: int | None = None) -> tuple[Any, Any]:
    """Split a yielded item into (data, metadata) with dataset-rt's messages (plus the sample's
    position in its source, when given)."""
    if not isinstance(item, tuple):
        raise _reject(
            "CacheSource must yield CacheInput tuples",
            sample,
            None,
            None if sample is None else f"got {type(item).__name__}",
        )
    if len(item) != 2:
        raise _reject(
            "CacheInput must contain data and metadata",
            sample,
            None,
            None if sample is None else f"got a tuple of {len(item)} items",
        )
    return item[0], item[1]
