"""Whether a client's tools already name one of ours (proxy/internal_tools.py): then we offer none."""

from __future__ import annotations

from typing import Any

from proxy import internal_tools
from proxy.internal_tools import client_defines_internal_name, with_internal_tools


def chat_tool(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


def test_a_same_named_tool_in_any_shape_means_ours_are_not_offered() -> None:
    assert not client_defines_internal_name(None) and not client_defines_internal_name([])
    assert not client_defines_internal_name([chat_tool("bash"), {"name": "Read"}])
    assert client_defines_internal_name([chat_tool("bash"), chat_tool("recall")])
    assert client_defines_internal_name([{"name": "read_tool_result", "input_schema": {}}])
    mine = [chat_tool("recall")]
    assert with_internal_tools(mine, read=True, recall=True) is mine


def test_the_same_tools_list_asked_again_is_not_walked_again(monkeypatch) -> None:
    """A resent body's tools are the very list of its earlier parse: asked two or three times a request,
    it is walked once; an equal list that is another object, or the list grown, is walked anew."""
    walked: list[Any] = []
    real = internal_tools.tool_name
    monkeypatch.setattr(internal_tools, "tool_name", lambda spec: walked.append(spec) or real(spec))
    tools = [chat_tool(f"tool{n}") for n in range(20)]
    for _ in range(3):
        assert not client_defines_internal_name(tools)
    assert len(walked) == 20
    assert not client_defines_internal_name([*tools])
    assert len(walked) == 40
    tools.append(chat_tool("recall"))  # (nothing edits a parsed list; if something did, its length tells)
    assert client_defines_internal_name(tools)


def test_what_is_remembered_stays_bounded() -> None:
    lists = [[chat_tool(f"t{n}")] for n in range(3 * internal_tools._DEFINES_KEPT)]
    for tools in lists:
        client_defines_internal_name(tools)
    assert len(internal_tools._DEFINES) <= internal_tools._DEFINES_KEPT
