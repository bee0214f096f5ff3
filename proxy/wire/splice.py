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
import re
from collections.abc import Callable
from typing import Any

import orjson

# Stands in for the array while the rest of the body is serialized (a NUL no client string is likely to
# hold; if the serialized rest holds it anywhere but in the array's place, the body is serialized whole).
_STAND_IN = "\x00ctxproxy:spliced-array\x00"
_STAND_IN_JSON = orjson.dumps(_STAND_IN)
_SEPARATORS = re.compile(rb"[ \t\r\n,]*+")


class Spans:
    """Where the elements of one top-level array lie in `raw`: `opening` is the offset just past its `[`,
    `ends[i]` the offset just past element i's last byte. `base`: the spans of an earlier body whose first
    `shared` elements are this one's very objects in the same places (a resent history), so finding an
    element's place extends that body's index instead of building one (~0.2 ms per 1,000 messages).
    `derived`: what a codec made of these elements (wire/decoded_prefix.py), for a later body sharing them."""

    __slots__ = ("_base", "_earlier", "_index", "charge", "derived", "ends", "opening", "raw")

    def __init__(self, raw: bytes, opening: int, ends: list[int], base: Spans | None = None,
                 shared: int = 0) -> None:
        self.raw, self.opening, self.ends = raw, opening, ends
        self._index: dict[int, int] | None = None
        self.derived: Any = None
        # told what a derivation holds (the resent bodies' budget counts it with the body these spans are of)
        self.charge: Callable[[Spans, int], None] | None = None
        # (only an index or a derivation already made is kept: no chain of earlier bodies is held)
        self._base = (base._index, shared) if base is not None and base._index is not None else None
        self._earlier = (base.derived, shared) if base is not None and base.derived is not None else None

    def derived_before(self) -> tuple[Any, int] | None:
        """What a codec made of the earlier body these spans extend, and how many of its leading elements
        are this body's very objects (None: no earlier body, or nothing made of it)."""
        return self._earlier

    def derive(self, made: Any, held: int = 0) -> None:
        """Keep what a codec made of these elements (and let go of the earlier body's); `held`: the memory
        it holds beyond these elements' own objects."""
        self.derived, self._earlier = made, None
        if self.charge is not None:
            self.charge(self, held)

    def index_of(self, parsed: list[Any]) -> dict[int, int]:
        """id(element) -> its place, for `parsed` (the array these spans locate). Stale entries (an earlier
        body's elements past what is shared) may remain: check `parsed[place] is element`."""
        if self._index is None:
            if self._base is not None:
                index, shared = self._base[0].copy(), self._base[1]
                index.update(zip(map(id, parsed[shared:]), itertools.count(shared)))
            else:
                index = dict(zip(map(id, parsed), itertools.count()))
            self._index, self._base = index, None
        return self._index


def spliced_body(body: dict[str, Any], key: str, array: list[Any], spans: Spans | None,
                 parsed: list[Any]) -> bytes:
    """What `orjson.dumps({**body, key: array})` says (`key` already in `body`: its place is kept), with
    the elements of `parsed` (located by `spans`) that `array` holds copied from the client's bytes: the
    same JSON, and the same bytes where the client writes compact JSON as orjson does."""
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
    copies), anything else serialized. None when `spans` does not describe `parsed`. One step an element
    (the forwarded array is what the window kept; a run is found where the previous one ended)."""
    ends = spans.ends
    if len(ends) != len(parsed):
        return None
    raw, opening, size = spans.raw, spans.opening, len(parsed)
    view = memoryview(raw)
    pieces: list[bytes | memoryview] = []
    index_of: dict[int, int] | None = None
    run_start = follows = 0  # the run of parsed elements being copied: parsed[run_start:follows]
    for item in array:
        if follows < size and parsed[follows] is item:
            follows += 1
            continue
        if follows > run_start:  # the run so far
            pieces.append(view[_element_start(raw, opening if run_start == 0 else ends[run_start - 1]):
                               ends[follows - 1]])
        if index_of is None:  # elsewhere in the parsed array (after what was evicted or replaced)?
            index_of = spans.index_of(parsed)
        at = index_of.get(id(item), -1)
        if 0 <= at < size and parsed[at] is item:
            run_start, follows = at, at + 1
        else:  # made by the proxy (a summary, a block): serialized; most likely in place of parsed[follows]
            pieces.append(orjson.dumps(item))
            run_start = follows = follows + 1
    if follows > run_start:
        pieces.append(view[_element_start(raw, opening if run_start == 0 else ends[run_start - 1]):
                           ends[follows - 1]])
    return [b"[", *_separated(pieces), b"]"]


def _separated(pieces: list[bytes | memoryview]) -> list[bytes | memoryview]:
    out: list[bytes | memoryview] = [b","] * (2 * len(pieces) - 1) if pieces else []
    out[::2] = pieces
    return out


def _element_start(raw: bytes, after: int) -> int:
    """Where the element after offset `after` (just past the array's `[`, or the previous element's end)
    begins: past any whitespace and the comma."""
    if raw[after] == 0x2C and raw[after + 1] == 0x7B:  # (compact JSON: the comma, then the object)
        return after + 1
    separators = _SEPARATORS.match(raw, after)
    return separators.end() if separators is not None else after
