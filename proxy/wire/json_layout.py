"""Where a top-level array and each of its elements lie in a JSON body's bytes, told from the brackets
outside strings without parsing the elements (wire/resent.py reuses a resent body's parse by them)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.shallow_json import JSON_STRING

# A JSON string (with a following colon when it is a key), or a bracket. Everything else (numbers,
# literals, commas, whitespace) is skipped: message boundaries only need the brackets outside strings.
JSON_TOKEN = re.compile(JSON_STRING + rb"(\s*+:)?|[\[\]{}]")
_ARRAY_OPEN = re.compile(rb"\s*+\[")


@dataclass
class Layout:
    """Where the array under `key` lies in a body: the offset after each element's last byte."""

    head: dict[str, Any]  # the top-level keys before the array (parsed), in order
    ends: list[int]
    opening: int  # the offset just past the array's `[`
    held: list[int] = field(default_factory=list)  # memory its first n+1 parsed elements hold (cumulative)
    closing: int = -1  # the offset just past the array's `]` (-1: not known)


def layout_of(raw: bytes, key: str, count: int, values: Sequence[Any] | None = None) -> Layout | None:
    """Where the top-level array under `key` and each of its `count` elements end, or None when the
    body's shape is not one this can reuse (the key twice, elements that are not objects or arrays).
    `values`: the elements as parsed, when the caller has them (element_ends)."""
    depth, found, position = 0, None, 0
    scanning = True
    while scanning:
        scanning = False
        for match in JSON_TOKEN.finditer(raw, position):
            char = raw[match.start()]
            if char != 0x22:  # a bracket
                depth += 1 if char in b"[{" else -1
            elif depth == 1 and match.group(1) is not None and _is_key(match, key):
                opening = _ARRAY_OPEN.match(raw, match.end())
                if found is not None or opening is None:
                    return None
                scanned = element_ends(raw, opening.end(), values) if values is not None \
                    and len(values) == count else elements(raw, opening.end())
                if scanned is None or len(scanned[0]) != count:
                    return None
                found, position, scanning = (opening.end() - 1, scanned[0], scanned[1]), scanned[1], True
                break  # on after the array
    if found is None:
        return None
    bracket, ends, closing = found
    try:
        head = orjson.loads(raw[:bracket] + b"0}")
    except orjson.JSONDecodeError:
        return None
    if type(head) is not dict:
        return None
    head.pop(key, None)
    return Layout(head, ends, bracket + 1, closing=closing)


def _is_key(match: re.Match[bytes], key: str) -> bool:
    token = match.group(0)[:match.start(1) - match.start()]
    try:
        return bool(orjson.loads(token) == key)
    except orjson.JSONDecodeError:
        return False


def elements(raw: bytes, position: int) -> tuple[list[int], int] | None:
    """From inside an array (after its `[` or after an element): each element's end offset, and the
    offset after the array's `]`. None for string elements (only brackets are tracked)."""
    depth = 0
    ends: list[int] = []
    for match in JSON_TOKEN.finditer(raw, position):
        char = raw[match.start()]
        if char == 0x22:
            if depth == 0:
                return None
            continue
        if char in b"[{":
            depth += 1
            continue
        if depth == 0:
            return (ends, match.end()) if char == 0x5D else None
        depth -= 1
        if depth == 0:
            ends.append(match.end())
    return None


def element_ends(raw: bytes, position: int, values: Sequence[Any]) -> tuple[list[int], int] | None:
    """`elements(raw, position)` for an array whose elements from `position` on parse to `values`: where
    their bytes are their compact serialization (what Claude Code, Codex and the OpenAI SDKs send), each
    is told by one comparison of bytes instead of scanning every string in it (~6 times as quick on
    agent messages); from the first that is not (spaces, other escapes), the scan goes on.

    Exact: a JSON object or array ends where its brackets balance, so bytes that are a whole value's
    serialization, where that value begins, are all of it."""
    ends: list[int] = []
    at = position
    for value in values:
        if type(value) is not dict and type(value) is not list:
            return None  # (as the scan: only brackets are tracked)
        start = at + 1 if raw[at:at + 1] == b"," else at  # (after an element; `values` parsed from `raw`)
        try:
            dumped = orjson.dumps(value)
        except orjson.JSONEncodeError:  # nested past orjson's writing depth (its parse goes deeper)
            break
        if not raw.startswith(dumped, start):
            break
        at = start + len(dumped)
        ends.append(at)
    else:
        if raw[at:at + 1] == b"]":
            return ends, at + 1
    scanned = elements(raw, at)  # (from the last element told, or from the array's start)
    return None if scanned is None else (ends + scanned[0], scanned[1])
