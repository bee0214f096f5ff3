"""JSON found inside text (tool results, tool-call arguments, an upstream's odd event), parsed only when it
nests no deeper than the proxy walks.

The stdlib's parser recurses once per level, on the interpreter's own recursion count: text nested ~1,000
levels (a model can write it, the fuzz cases do) takes it to the limit. Whatever Python then runs down
there, a finalizer the garbage collector calls or a hook, has no frames left and fails as "exception
ignored". Such text is not parsed at all. The rest is the stdlib's: orjson reads integers past 64 bits as
floats, and a summary keeps the digits an agent acts on.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

DEPTH_LIMIT = 128  # as deep as a request body may nest (validate.MAX_DEPTH)
JSON_STRING = rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"'  # a JSON string, escapes and all (wire/json_layout.py too)
_STRING = re.compile(JSON_STRING)
_NOT_BRACKET = re.compile(rb"[^\[\]{}]++")
_STEP = {0x5B: 1, 0x7B: 1, 0x5D: -1, 0x7D: -1}


def loads(text: str | bytes, limit: int = DEPTH_LIMIT) -> Any:
    """The JSON value `text` holds, or ValueError: not JSON, or nested more than `limit` levels."""
    if _openings(text) > limit and nested_deeper(_as_bytes(text), limit):
        raise ValueError(f"nested more than {limit} levels deep")
    return json.loads(text)


def nested_deeper(raw: bytes, limit: int) -> bool:
    """Whether brackets outside strings nest past `limit` anywhere in `raw` (errs toward deeper on text
    that is not JSON: brackets after an unterminated string count)."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    brackets = _NOT_BRACKET.sub(b"", _STRING.sub(b"", raw))
    return max(itertools.accumulate(map(_STEP.__getitem__, brackets)), default=0) > limit


def _openings(text: str | bytes) -> int:
    if isinstance(text, str):
        return text.count("[") + text.count("{")
    return text.count(b"[") + text.count(b"{")


def _as_bytes(text: str | bytes) -> bytes:
    return text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
