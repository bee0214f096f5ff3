"""JSON and text for the archive: bytes that round-trip whatever agents send (lone surrogates, integers
past 64 bits), strings SQLite can store, and values for the columns of side-table rows."""

from __future__ import annotations

import json
import re
from typing import Any

import orjson


def _default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, set | frozenset):
        return list(value)
    return str(value)


def serialize(value: Any) -> tuple[bytes, bool]:
    """(JSON bytes, whether the stdlib wrote them). orjson, or the stdlib for what orjson refuses (lone
    surrogates, integers past 64 bits). The fallback escapes every non-ASCII character, so the bytes
    are valid UTF-8 whatever the strings held, and `loads` gives the same values back."""
    try:
        return orjson.dumps(value, default=_default), False
    except TypeError:
        return json.dumps(value, ensure_ascii=True, separators=(",", ":"), default=_default).encode(), True


def dumps(value: Any) -> bytes:
    return serialize(value)[0]


_LONG_DIGITS = re.compile(r"[0-9]{19}")
_LONG_DIGITS_BYTES = re.compile(rb"[0-9]{19}")


def loads(data: bytes | str) -> Any:
    """Inverse of `dumps`: orjson, or the stdlib for escaped lone surrogates (orjson refuses them) and
    integers past 64 bits (orjson would read them as floats)."""
    long_digits = _LONG_DIGITS.search(data) if isinstance(data, str) else _LONG_DIGITS_BYTES.search(data)
    if long_digits is None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data)  # raises ValueError (JSONDecodeError) when it is not JSON at all


def safe_text(value: Any) -> str | None:
    """A string SQLite can store: lone surrogates become `\\udXXX` text, non-strings their JSON."""
    if type(value) is str and value.isascii():  # (O(1) in CPython: a flag of the string) nothing to escape
        return value
    if value is None:
        return None
    if not isinstance(value, str):
        return dumps(value).decode()
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


def cell(value: Any) -> Any:
    """A value for a column of a side-table row."""
    kind = type(value)  # the common cells first: an exchange row has ~50 of them
    if kind is str:
        return value if value.isascii() else safe_text(value)
    if kind is int:
        return value if -(2**63) <= value < 2**63 else str(value)
    if value is None or isinstance(value, float | bytes):
        return value
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value if -(2**63) <= value < 2**63 else str(value)
    if isinstance(value, str):
        return safe_text(value)
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    return dumps(value).decode()
