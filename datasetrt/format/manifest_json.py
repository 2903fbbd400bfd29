"""manifest.json's JSON layer: its bytes -> a document, strictly, as dataset-rt's serde reads it,
and typed field access worded as serde words its errors.

Boundary: JSON text and values only; knows which fields a manifest has, its files or its codecs
not at all (format/manifest.py asks for each field by name and range).

Strict: UTF-8 only, a repeated key in any object is an error (serde rejects it; last-wins would
let two readers of one manifest disagree), and every failure is a ManifestJSONError "JSON error:
...: <path>" (EOF context, syntax error with line and column, nesting too deep, number out of
range). O(len(raw)); the EOF context is one more pass, on the error path only.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from datasetrt.errors import ManifestJSONError
from datasetrt.format.layout import U63_MAX

_SHA256_RE = re.compile(r"[0-9a-f]{64}")


def decode_document(raw: bytes, path: Path | str) -> Any:
    """The JSON document in `raw` (manifest.json's bytes); `path` is only used in messages."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestJSONError(f"JSON error: manifest is not UTF-8 ({exc.reason}): {path}") from None
    try:
        return _DECODER.decode(text)
    except _DuplicateField as exc:
        raise ManifestJSONError(f"JSON error: duplicate manifest field `{exc.key}`: {path}") from None
    except json.JSONDecodeError as exc:
        if exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated string"):
            what = _eof_context(text)
        else:
            what = f"syntax error: {exc.msg} at line {exc.lineno} column {exc.colno}"
        raise ManifestJSONError(f"JSON error: {what}: {path}") from None
    except RecursionError:
        raise ManifestJSONError(f"JSON error: recursion limit exceeded (nesting too deep): {path}") from None
    except ValueError as exc:  # e.g. an integer literal longer than sys.get_int_max_str_digits()
        raise ManifestJSONError(f"JSON error: number out of range ({exc}): {path}") from None


class _DuplicateField(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """object_pairs_hook: a repeated key is an error (serde rejects it; last-wins would let two
    readers of one manifest disagree)."""
    doc = dict(pairs)
    if len(doc) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateField(key)
            seen.add(key)
    return doc


_DECODER = json.JSONDecoder(object_pairs_hook=_unique_object)  # stateless: one for every manifest


def _eof_context(text: str) -> str:
    """serde-style "EOF while parsing <what> at line L column C" for input that ends too early.

    One iterative pass (hostile nesting cannot recurse); only called on the error path.
    """
    stack: list[str] = []
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            stack.append(ch)
        elif ch in "]}" and stack:
            stack.pop()
    if in_string:
        what = "a string"
    elif stack:
        what = "an object" if stack[-1] == "{" else "a list"
    else:
        what = "a value"
    body = text.rstrip()
    line = body.count("\n") + 1
    column = len(body) - (body.rfind("\n") + 1)
    return f"EOF while parsing {what} at line {line} column {column}"


class Fields:
    """Typed field access to one JSON object of a manifest (`doc`, a dict: checked here), with
    messages naming the manifest path, the field and where the object sits (`where`)."""

    def __init__(self, path: Path | str, doc: Any, where: str = "") -> None:
        if not isinstance(doc, dict):
            raise ManifestJSONError(f"JSON error: invalid type, expected a map{where}: {path}")
        self.path, self.doc, self.where = path, doc, where

    def missing(self, key: str) -> ManifestJSONError:
        return ManifestJSONError(f"JSON error: missing field `{key}`{self.where}: {self.path}")

    def bad(self, key: str, value: Any, expected: str) -> ManifestJSONError:
        shown = json.dumps(value)[:80] if _jsonable(value) else repr(value)[:80]
        return ManifestJSONError(
            f"JSON error: invalid value: `{shown}` for field `{key}`, expected {expected}{self.where}: {self.path}"
        )

    def uint(self, key: str, maximum: int = U63_MAX) -> int:
        if key not in self.doc:
            raise self.missing(key)
        value = self.doc[key]
        if type(value) is not int or value < 0 or value > maximum:
            if type(value) is int and value < 0:
                raise ManifestJSONError(
                    f"JSON error: invalid value: integer `{value}`, expected u64 for field `{key}`{self.where}: {self.path}"
                )
            raise self.bad(key, value, f"an integer in [0, {maximum}]")
        return value

    def string(self, key: str) -> str:
        if key not in self.doc:
            raise self.missing(key)
        value = self.doc[key]
        if not isinstance(value, str):
            raise self.bad(key, value, "a string")
        return value

    def sha256(self, key: str) -> str:
        value = self.string(key)
        if _SHA256_RE.fullmatch(value) is None:
            raise self.bad(key, value, "64 lowercase hex digits")
        return value

    def number(self, key: str) -> float:
        if key not in self.doc:
            raise self.missing(key)
        value = self.doc[key]
        if type(value) not in (int, float) or not (value > 0) or value == float("inf"):
            raise self.bad(key, value, "a positive finite number")
        return float(value)

    def array(self, key: str) -> list:
        if key not in self.doc:
            raise self.missing(key)
        value = self.doc[key]
        if not isinstance(value, list):
            raise self.bad(key, value, "a sequence")
        return value


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True
