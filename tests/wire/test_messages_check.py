"""proxy/wire/messages_check.py on resent bodies: only what these checks passed is taken as checked."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.errors import BadRequest
from proxy.wire import resent
from proxy.wire.messages_check import validate_messages_request


def _raw(history: list[dict[str, Any]], tools: list[dict[str, Any]]) -> bytes:
    # Claude Code's own key order: the messages, then the system prompt and the tools
    return orjson.dumps({"model": "claude-sonnet-4-5", "messages": history,
                         "system": [{"type": "text", "text": "You are Claude Code."}], "tools": tools,
                         "max_tokens": 1024})


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
