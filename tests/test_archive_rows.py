"""The writer reuses the message ids of the prefix a session sent last time (proxy/archive_rows.py)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from proxy.archive_rows import _shared_prefix


@given(st.lists(st.integers(0, 5), max_size=30), st.lists(st.integers(0, 5), max_size=30))
def test_the_shared_prefix_is_the_run_of_equal_messages_whether_or_not_they_are_the_same_objects(
        earlier_picks: list[int], later_picks: list[int]) -> None:
    # Values 0-2 as one shared object each (a resent history); 3-5 as a new equal object every time
    # (blocks made anew each request): the run must not stop at either, only at a different value.
    shared: list[dict[str, Any]] = [{"role": "user", "content": f"m{n}"} for n in range(3)]

    def message(pick: int) -> dict[str, Any]:
        return shared[pick] if pick < 3 else {"role": "user", "content": f"m{pick}"}

    earlier, later = [message(p) for p in earlier_picks], [message(p) for p in later_picks]
    pairs = zip(earlier_picks, later_picks, strict=False)
    expected = next((n for n, (a, b) in enumerate(pairs) if a != b), min(len(earlier), len(later)))
    assert _shared_prefix(earlier, later) == expected
