"""proxy/wire/same_objects.py: lists compared by identity, never by value."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from proxy.wire.same_objects import same_objects, starts_with


@given(st.lists(st.integers(0, 3), max_size=12), st.lists(st.integers(0, 3), max_size=12), st.integers(0, 12))
def test_starts_with_says_whether_a_list_begins_with_another_ones_very_objects(
        earlier_picks: list[int], later_picks: list[int], start: int) -> None:
    # Four distinct objects that are equal to each other: only identity may tell them apart.
    pool: list[dict[str, Any]] = [{"role": "user", "content": "same"} for _ in range(4)]
    earlier, later = [pool[i] for i in earlier_picks], [pool[i] for i in later_picks]
    shared = same_objects(earlier, later)
    assert starts_with(later, earlier) == (len(earlier) <= len(later) and shared == len(earlier))
    assert starts_with([*earlier, *later], earlier)
    if start <= min(len(earlier), len(later)):
        assert same_objects(earlier, later, start) == (
            shared if shared >= start else start + same_objects(earlier[start:], later[start:]))
