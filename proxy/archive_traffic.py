"""The proxy's own traffic, as the archive sees it: internal tool calls (read_tool_result, recall) and
their results, and texts the proxy wrote (summaries, placeholders, injected blocks, recall answers).

It is archived for the record but never indexed for recall nor read back as the conversation, so recall
returns what was said rather than its own earlier answers. New rows are classified when written
(messages.proxy); rows written before that are recognized here by their content.
"""

from __future__ import annotations

import re
from typing import Any

READ_TOOL_RESULT = "read_tool_result"
RECALL = "recall"
INTERNAL_NAMES = frozenset({READ_TOOL_RESULT, RECALL})
# What read_tool_result accepts: a call id, `id#n` for a reused id, `obs-<hex>` or `msg-<hex>`.
HANDLE = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}(#[0-9]{1,6})?$")
MESSAGE_HANDLE = "msg-"  # + the first 16 characters of a message's archive id
MESSAGE_HANDLE_CHARS = 16

# Openings of texts the proxy writes into prompts and answers (layers/tool_results, auto_summary, pins,
# working_memory, folded, recall answers old and new) and the /recall command that asks for one.
_PROXY_TEXT = re.compile(
    r"\A\s*(?:\[ctxproxy |\[summarized: call_id=|\[WORKING MEMORY\]|## Folded memory \(|/recall\b"
    r"|recall '[^\n]{0,2000}?': (?:no matches|\d+ match|the search stopped))")
# A call as message_text renders it, one per line: `name(arguments)`.
_INTERNAL_CALL_LINE = re.compile(r"^(?:read_tool_result|recall)\(")


def tool_name(call: Any) -> str | None:
    function = call.get("function") if isinstance(call, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) else None


def is_internal_call(call: Any) -> bool:
    return tool_name(call) in INTERNAL_NAMES


def content_text(message: dict[str, Any]) -> str:
    """A message's content as text: the string itself, or its text parts one per line."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def message_text(message: Any) -> str:
    """What is indexed for recall and what read_tool_result returns for a message handle: the content
    (a tool result byte for byte), then one line `name(arguments)` per call to a client tool."""
    if not isinstance(message, dict):
        return "" if message is None else str(message)
    parts = [content_text(message)] if message.get("content") is not None else []
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and not is_internal_call(call):
            parts.append(f"{function.get('name', '')}({function.get('arguments', '')})")
    return "\n".join(parts)


def is_proxy_text(text: str) -> bool:
    return bool(_PROXY_TEXT.match(text))


def is_proxy_message(message: Any) -> bool:
    """A turn that only called internal tools, or a text the proxy wrote. (An internal call's result is
    known by the call it answers: see `answers_internal_call`.)"""
    if not isinstance(message, dict):
        return False
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls and all(is_internal_call(c) for c in calls):
        return True
    return is_proxy_text(content_text(message))


def has_internal_call(message: Any) -> bool:
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    return isinstance(calls, list) and any(is_internal_call(c) for c in calls)


def answers_internal_call(assistant: Any, call_id: str) -> bool:
    calls = assistant.get("tool_calls") if isinstance(assistant, dict) else None
    return isinstance(calls, list) and any(
        isinstance(c, dict) and str(c.get("id")) == call_id and is_internal_call(c) for c in calls)


def is_internal_call_line(line: str) -> bool:
    return bool(_INTERNAL_CALL_LINE.match(line))
