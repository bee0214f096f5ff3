"""A streamed chat answer's tool calls, held by the relay's rounds (proxy/round_stream.py) and folded by the
archive (proxy/sse.py), come out as their deltas joined, read at any point."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.round_stream import ChatFramer, _event
from proxy.sse import assemble

call_deltas = st.lists(st.tuples(st.integers(0, 2), st.sampled_from(["", "call_a", "call_b"]),
                                 st.sampled_from(["", "wri", "te_file"]),
                                 st.sampled_from(["", "{", "\"path\": \"a.py\"", "}", "\\n\\u00e9"])),
                       min_size=1, max_size=40)


def joined_eagerly(deltas: list[tuple[int, str, str, str]]) -> list[dict[str, Any]]:
    """Each delta onto its call as it comes (the plain reading)."""
    calls: dict[int, dict[str, Any]] = {}
    for index, call_id, name, arguments in deltas:
        call = calls.setdefault(index, {"id": None, "type": "function",
                                        "function": {"name": "", "arguments": ""}})
        call["id"] = call_id or call["id"]
        call["function"]["name"] += name
        call["function"]["arguments"] += arguments
    return [calls[i] for i in sorted(calls)]


def chunk(index: int, call_id: str, name: str, arguments: str) -> bytes:
    call: dict[str, Any] = {"index": index, "function": {"name": name, "arguments": arguments}}
    if call_id:
        call["id"] = call_id
    return b"data: " + orjson.dumps({"id": "c1", "choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})


@settings(max_examples=300, deadline=None)
@given(call_deltas, st.sets(st.integers(1, 40), max_size=4))
def test_held_calls_are_their_deltas_joined_whenever_read(deltas: list[tuple[int, str, str, str]],
                                                          reads: set[int]) -> None:
    framer = ChatFramer()
    for n, delta in enumerate(deltas, 1):
        assert _event(chunk(*delta), framer.state, 0, None) is None  # (held back from the client)
        if n in reads:
            assert framer.calls() == joined_eagerly(deltas[:n])
    assert framer.calls() == joined_eagerly(deltas)
    folded = assemble([b"".join(chunk(*delta) + b"\n\n" for delta in deltas)])
    assert folded.message()["tool_calls"] == joined_eagerly(deltas) == folded.message()["tool_calls"]
