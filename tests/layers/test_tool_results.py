"""The results walk a session carries from request to request (issue 14): a resent history is walked only
where it differs from the previous request, and finds exactly what a whole walk finds."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.layers.observations import Observations
from proxy.layers.tool_results import found_in, results, shared_prefix

OBSERVATIONS = Observations(size_tokens=50)


def message(kind: int, n: int) -> dict[str, Any]:
    """A message of one of the shapes the walk tells apart (a fresh object every time)."""
    if kind == 0:
        return {"role": "user", "content": f"please fix bug {n}"}
    if kind == 1:
        return {"role": "assistant", "content": f"running step {n}",
                "tool_calls": [{"id": f"c{n % 3}", "type": "function",
                                "function": {"name": "sh", "arguments": "{}"}}]}
    if kind == 2:
        return {"role": "tool", "tool_call_id": f"c{n % 3}", "content": f"output {n % 4}"}
    if kind == 3:
        return {"role": "user", "content": f"<returncode>0</returncode><output>{n % 4}</output>"}
    if kind == 4:
        return {"role": "user", "content": "x " * 300}  # an observation by its size alone
    return {"role": "system", "content": "you are an agent"}


kinds = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 9)), max_size=12)
# Each request keeps some of the previous one's messages (the same objects) and adds new ones.
requests = st.lists(st.tuples(st.integers(0, 14), kinds), min_size=1, max_size=8)


@settings(max_examples=300, deadline=None)
@given(requests, st.booleans())
def test_a_carried_walk_finds_what_a_whole_walk_finds(steps: list[tuple[int, list[tuple[int, int]]]],
                                                      text_protocol: bool) -> None:
    observations = OBSERVATIONS if text_protocol else None
    carried: dict[str, Any] = {}
    history: list[dict[str, Any]] = [message(5, 0), message(0, 0)]
    for keep, added in steps:
        history = history[:keep] + [message(kind, n) for kind, n in added]
        assert found_in(history, observations, carried) == list(results(history, observations))
        assert found_in(history, observations, carried) is carried["results"][3]  # the same list again


def test_the_walk_starts_where_the_history_differs() -> None:
    first = [message(5, 0), message(0, 0), message(1, 1), message(2, 1)]
    carried: dict[str, Any] = {}
    found_in(first, OBSERVATIONS, carried)
    walked: list[int] = []

    class Spy(list):  # type: ignore[type-arg]
        def __getitem__(self, index: Any) -> Any:
            if isinstance(index, int):
                walked.append(index)
            return super().__getitem__(index)

    second = Spy([*first, message(1, 2), message(2, 2)])
    assert found_in(second, OBSERVATIONS, carried) == [(3, ("c1", "output 1")), (5, ("c2", "output 2"))]
    # (the task statement's end is found again: the opening messages are read, nothing after them)
    assert 3 not in walked and {4, 5} <= set(walked)


def test_shared_prefix_compares_objects_not_values() -> None:
    a, b = message(0, 1), message(0, 1)
    assert shared_prefix([a, b], [a, b, a]) == 2
    assert shared_prefix([a, b], [a, dict(b)]) == 1
    assert shared_prefix([], [a]) == 0
