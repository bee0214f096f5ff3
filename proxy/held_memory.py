"""The memory a parsed JSON value holds, for caches whose budget is memory (the resent bodies, the
session states that carry a history from request to request)."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

SHARED_KEY = 64  # orjson makes one object for a dict key up to this long, shared by every parse


def held_bytes(value: Any) -> int:
    """What `value`'s objects hold (its short keys, orjson's shared ones, aside). A cost per object, not
    per byte (a string's size is known): ~1.5 ms for a 2 MB agent history of 1,200 messages."""
    size, pending = 0, [value]
    pop, push, getsizeof = pending.pop, pending.extend, sys.getsizeof
    while pending:  # (no recursion: however deeply the JSON nests)
        item = pop()
        size += getsizeof(item)
        if type(item) is dict:
            push(item.values())
            for key in item:
                if len(key) > SHARED_KEY:
                    size += getsizeof(key)
        elif type(item) is list:
            push(item)
    return size


def reachable_ids(values: Iterable[Any]) -> set[int]:
    """The ids of every object `values` hold (through dicts, lists and tuples)."""
    seen: set[int] = set()
    pending = list(values)
    pop, push, add = pending.pop, pending.extend, seen.add
    while pending:
        item = pop()
        add(id(item))
        kind = type(item)
        if kind is dict:
            push(item.values())
        elif kind is list or kind is tuple:
            push(item)
    return seen


def held_beyond(values: Iterable[Any], shared: set[int]) -> list[int]:
    """What each of `values` holds besides the objects in `shared` (`reachable_ids` of others they were
    made from: a decoded message holds its native message's texts and blocks, mostly, and new containers
    around them)."""
    sizes = []
    getsizeof = sys.getsizeof
    for value in values:
        size, pending = 0, [value]
        pop, push = pending.pop, pending.extend
        while pending:
            item = pop()
            if id(item) in shared:
                continue
            size += getsizeof(item)
            kind = type(item)
            if kind is dict:
                push(item.values())
                for key in item:
                    if len(key) > SHARED_KEY:
                        size += getsizeof(key)
            elif kind is list or kind is tuple:
                push(item)
        sizes.append(size)
    return sizes


def held_total(values: Iterable[Any]) -> int:
    return sum(map(held_bytes, values))
