"""proxy/wire/messages_check.py on a resent Claude Code body: its system prompt and tools come after the
messages, and are walked again only when their bytes changed."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.errors import BadRequest
from proxy.validate import MAX_DEPTH
from proxy.wire import messages_check, resent
from proxy.wire.messages_check import validate_messages_request


def _raw(history: list[dict[str, Any]], tools: list[dict[str, Any]]) -> bytes:
    # Claude Code's own key order: the messages, then the system prompt and the tools
    return orjson.dumps({"model": "claude-sonnet-4-5", "messages": history,
                         "system": [{"type": "text", "text": "You are Claude Code."}], "tools": tools,
                         "max_tokens": 1024})


def test_unchanged_system_and_tools_are_not_walked_again_and_changed_ones_are(monkeypatch):
    resent.BODIES.clear()  # (process-wide)
    history = [{"role": "user", "content": f"step {n} " + "x" * 200} for n in range(40)]  # (over 8 KB)
    tools = [{"name": "Bash", "input_schema": {"type": "object"}}]
    first, _ = validate_messages_request(_raw(history, tools))
    walked: list[dict[str, Any]] = []
    real = messages_check._check_depth
    monkeypatch.setattr(messages_check, "_check_depth", lambda body: walked.append(body) or real(body))
    history.append({"role": "assistant", "content": "done"})
    again, _ = validate_messages_request(_raw(history, tools))
    assert again["tools"] is first["tools"] and again["system"] is first["system"]
    assert walked and all("tools" not in body and "system" not in body for body in walked)
    deep: Any = {"type": "object"}
    for _ in range(MAX_DEPTH):
        deep = {"properties": deep}
    with pytest.raises(BadRequest) as raised:
        validate_messages_request(_raw(history, [{"name": "Bash", "input_schema": deep}]))
    assert raised.value.code == "nesting_too_deep"


def test_a_body_checked_on_the_chat_route_is_checked_again_on_this_one():
    """The same bytes sent to both routes: the chat route's checks let a tool message through, and the
    Messages route took the messages they checked as its own (a TypeError, a 500, before)."""
    from proxy.validate import parse_chat_body

    resent.BODIES.clear()  # (process-wide)
    call = {"id": "c1", "type": "function", "function": {"name": "run", "arguments": "{}"}}
    history = [{"role": "user", "content": "x" * 9000}, {"role": "assistant", "content": None,
                                                         "tool_calls": [call]}]
    raw = orjson.dumps({"model": "claude-sonnet-4-5", "messages": history, "max_tokens": 10})
    parse_chat_body(raw)
    history.append({"role": "user", "content": "go on"})
    with pytest.raises(BadRequest) as raised:
        validate_messages_request(orjson.dumps({"model": "claude-sonnet-4-5", "messages": history,
                                                "max_tokens": 10}))
    assert raised.value.param == "messages.1.content"
