"""A rewritten body put together from the client's own bytes: what the proxy left as it was is copied, only
what it changed or added is serialized.

A resent history's forwarded array is mostly the client's messages, unchanged and in runs (a summary or an
injected block here and there). Serializing the whole body again costs about a millisecond a megabyte on
every request; copying the runs' bytes costs a memcpy. Where each element of the array lies in the client's
body is known from parsing it (wire/resent.py keeps those offsets for every large body); an element is
copied only when it is the very object that was parsed there, which nothing edits in place
(tests/test_invariants.py), so its bytes are its JSON. The copied parts keep the client's own formatting
(whitespace, escapes, integers past 64 bits), as an unchanged request goes upstream byte for byte.
"""

from __future__ import annotations

import itertools
import operator
import re
from dataclasses import dataclass
from typing import Any

import orjson

# Stands in for the array while the rest of the body is serialized (a NUL no client string is likely to
# hold; if the serialized rest holds it anywhere but in the array's place, the body is serialized whole).
_STAND_IN = "\x00ctxproxy:spliced-array\x00"
_STAND_IN_JSON = orjson.dumps(_STAND_IN)
_SEPARATORS = re.compile(rb"[ \t\r\n,]*+")


@dataclass(frozen=True)
class Spans:
    """Where the elements of one top-level array lie in `raw`: `opening` is the offset just past its `[`,
    `ends[i]` the offset just past element i's last byte."""

    raw: bytes
    opening: int
    ends: list[int]


def spliced_body(body: dict[str, Any], key: str, array: list[Any], spans: Spans | None,
                 parsed: list[Any]) -> bytes:
    """`orjson.dumps(body)` with `array` under `key` (`key` already in `body`, so its place is kept), the
    elements of `parsed` (located by `spans`) that `array` holds copied from the client's bytes."""
    pieces = _array_pieces(array, spans, parsed) if spans is not None else None
    if pieces is None:
        return orjson.dumps({**body, key: array})
    rest = orjson.dumps({**body, key: _STAND_IN})
    at = rest.find(_STAND_IN_JSON)
    if at < 0 or rest.find(_STAND_IN_JSON, at + 1) >= 0:
        return orjson.dumps({**body, key: array})
    return b"".join((rest[:at], *pieces, rest[at + len(_STAND_IN_JSON):]))


def _array_pieces(array: list[Any], spans: Spans, parsed: list[Any]) -> list[bytes | memoryview] | None:
    """The JSON of `array` as pieces to join: runs of `parsed`'s objects as the client's bytes (views, not
    copies), anything else serialized. None when `spans` does not describe `parsed`."""
    ends = spans.ends
    if len(ends) != len(parsed):
        return None
    raw = spans.raw
    view = memoryview(raw)
    pieces: list[bytes | memoryview] = [b"["]
    index_of: dict[int, int] | None = None
    at, follows = 0, 0  # where in `array`; the parsed element the previous run ended before
    while at < len(array):
        item = array[at]
        if follows < len(parsed) and parsed[follows] is item:
            start = follows
        else:  # elsewhere in the parsed array (after what was evicted or replaced), or not from it at all
            if index_of is None:
                index_of = dict(zip(map(id, parsed), itertools.count()))
            start = index_of.get(id(item), -1)
            if start < 0 or parsed[start] is not item:
                if len(pieces) > 1:
                    pieces.append(b",")
                pieces.append(orjson.dumps(item))
                at += 1
                continue
        run = _same_run(parsed, start, array, at)
        first = _element_start(raw, spans.opening if start == 0 else ends[start - 1])
        if len(pieces) > 1:
            pieces.append(b",")
        pieces.append(view[first:ends[start + run - 1]])
        at, follows = at + run, start + run
    pieces.append(b"]")
    return pieces


def _element_start(raw: bytes, after: int) -> int:
    """Where the element after offset `after` (its `[` or the previous element's end) begins."""
    separators = _SEPARATORS.match(raw, after)
    return separators.end() if separators is not None else after


def _same_run(parsed: list[Any], start: int, array: list[Any], at: int) -> int:
    """How many elements from parsed[start] and array[at] on are the same objects (at least one; in C)."""
    differing = map(operator.is_not, itertools.islice(parsed, start, None), itertools.islice(array, at, None))
    return next(itertools.compress(itertools.count(), differing), min(len(parsed) - start, len(array) - at))
