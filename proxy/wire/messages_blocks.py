"""Anthropic Messages content blocks in neutral (chat-shaped) terms and back: the pieces the codec
(wire/messages.py) builds its neutral messages and native bodies from."""

from __future__ import annotations

from typing import Any

import orjson

UNCACHEABLE = frozenset({"thinking", "redacted_thinking"})


def block_text(blocks: list[Any]) -> str:
    return "\n".join(b["text"] for b in blocks if isinstance(b, dict) and isinstance(b.get("text"), str))


def neutral_part(block: dict[str, Any]) -> dict[str, Any]:
    """A stand-in the token counter and the layers can read (images by a fixed estimate)."""
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "text": block.get("text", "")}
    if kind in ("image", "document"):
        return {"type": "image"}
    if kind in UNCACHEABLE:  # thinking: its words count, its signature and data barely
        return {"type": kind, "thinking": block.get("thinking") or block.get("data", "")[:64]}
    return {"type": "text", "text": orjson.dumps({k: v for k, v in block.items() if k != "cache_control"})
            .decode()}


def tool_content(content: Any) -> Any:
    """A tool result's neutral content: a string when it is all text (layer 1 may summarize it)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if all(isinstance(b, dict) and b.get("type") == "text" for b in content):
        return block_text(content)
    return [neutral_part(b) for b in content if isinstance(b, dict)]


def neutral_call(block: dict[str, Any]) -> dict[str, Any]:
    arguments = orjson.dumps(block.get("input", {})).decode()
    return {"id": block.get("id"), "type": "function", "function": {"name": block.get("name"),
                                                                    "arguments": arguments}}


def native_call(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function") or {}
    try:
        arguments = orjson.loads(function.get("arguments") or "{}")
    except orjson.JSONDecodeError:
        arguments = {}
    return {"type": "tool_use", "id": call.get("id"), "name": function.get("name"),
            "input": arguments if isinstance(arguments, dict) else {}}


def native_tool(spec: dict[str, Any]) -> dict[str, Any]:
    """One of the proxy's tools (chat-shaped) in Anthropic form."""
    function = spec.get("function") or {}
    return {"name": function.get("name"), "description": function.get("description", ""),
            "input_schema": function.get("parameters") or {"type": "object"}}


def reminder(text: str) -> dict[str, Any]:
    return {"type": "text", "text": f"<system-reminder>\n{text}\n</system-reminder>"}


def compaction_at(messages: list[dict[str, Any]], lowest: int) -> int:
    """The index (from `lowest` on) of the last message holding a provider `compaction` block, -1 without
    one: the provider reads nothing before that block, so the layers leave it alone and it goes upstream
    as sent."""
    for k in range(len(messages) - 1, lowest - 1, -1):
        content = messages[k].get("content")
        if isinstance(content, list) and any(isinstance(b, dict) and b.get("type") == "compaction"
                                             for b in content):
            return k
    return -1


def count_breakpoints(body: dict[str, Any], messages: list[dict[str, Any]]) -> int:
    def blocks(value: Any) -> list[Any]:
        return value if isinstance(value, list) else []

    total = sum(1 for b in blocks(body.get("system")) if isinstance(b, dict) and b.get("cache_control"))
    total += sum(1 for t in blocks(body.get("tools")) if isinstance(t, dict) and t.get("cache_control"))
    for message in messages:
        total += sum(1 for b in blocks(message.get("content"))
                     if isinstance(b, dict) and b.get("cache_control"))
    return total
