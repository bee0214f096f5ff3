"""Whether and where two lists hold the very same objects: a resent history's messages are those of the
earlier parse (wire/resent.py), so what was worked out for them is found by identity (compared in C)."""

from __future__ import annotations

import itertools
import operator
from typing import Any


def same_objects(earlier: list[Any], later: list[Any], start: int = 0) -> int:
    """Where, from `start` on, the two lists first hold different objects (compared by identity in C,
    stopping at the first difference): a resent history's messages are the very objects parsed before."""
    islice = itertools.islice
    differing = map(operator.is_not, islice(earlier, start, None), islice(later, start, None))
    return next(itertools.compress(itertools.count(start), differing), min(len(earlier), len(later)))


def starts_with(later: list[Any], earlier: list[Any]) -> bool:
    """Whether `later` holds all of `earlier`'s very objects first: the common case of a resent history,
    told in about half the time `same_objects` takes to say where two lists part (no position kept)."""
    length = len(earlier)
    return length <= len(later) and not any(map(operator.is_not, earlier, later[:length]))
