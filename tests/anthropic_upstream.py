"""Anthropic Messages API shapes for the fake provider (`tests.servers.FakeUpstream` serves `/v1/messages`).

Builders for content blocks, a whole Message object, the SSE event sequence a streamed Message arrives in,
and the error body. Shapes follow the public API (and what the `anthropic` SDK parses):

- Message: {id, type: "message", role: "assistant", model, content: [...], stop_reason, stop_sequence,
  usage: {input_tokens, cache_creation_input_tokens, cache_read_input_tokens,
  cache_creation: {ephemeral_5m_input_tokens, ephemeral_1h_input_tokens}, output_tokens, service_tier}}.
- Stream: message_start (content [], stop_reason null) · ping · per block content_block_start (empty block) →
  content_block_delta* (text_delta | input_json_delta | thinking_delta + one signature_delta) →
  content_block_stop · message_delta {delta: {stop_reason, stop_sequence}, usage: {output_tokens}} ·
  message_stop. Every event is `event: <type>\\ndata: <json>\\n\\n`; the SDK ignores data without an event
  name, and raises on `event: error`.
- Error: {"type": "error", "error": {"type": ..., "message": ...}}.
"""

from __future__ import annotations

from typing import Any

import orjson

DEFAULT_MODEL = "claude-sonnet-4-5"

# HTTP status Anthropic uses for each error type.
ERROR_STATUS = {
    "invalid_request_error": 400, "authentication_error": 401, "permission_error": 403,
    "not_found_error": 404, "request_too_large": 413, "rate_limit_error": 429, "api_error": 500,
    "overloaded_error": 529,
}


# --- content blocks --------------------------------------------------------------------------------------

def text(s: str) -> dict[str, Any]:
    return {"type": "text", "text": s}


def tool_use(id: str, name: str, input: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": id, "name": name, "input": input}


def thinking(text: str, signature: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": signature}


def redacted_thinking(data: str) -> dict[str, Any]:
    return {"type": "redacted_thinking", "data": data}


def tool_result(tool_use_id: str, content: str | list[dict[str, Any]], *,
                is_error: bool = False) -> dict[str, Any]:
    """A user-side block answering a tool_use (for building requests)."""
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_use_id, "content": content}
    if is_error:
        block["is_error"] = True
    return block


# --- whole messages --------------------------------------------------------------------------------------

def usage_of(usage: dict[str, Any] | None = None) -> dict[str, Any]:
    """Full usage object; `usage` overrides any key (a partial `cache_creation` is merged)."""
    out: dict[str, Any] = {
        "input_tokens": 25, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
        "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
        "output_tokens": 12, "service_tier": "standard",
    }
    for key, value in (usage or {}).items():
        out[key] = out[key] | value if key == "cache_creation" and isinstance(value, dict) else value
    return out


def _stop_reason(blocks: list[dict[str, Any]], stop_reason: str | None) -> str:
    if stop_reason is not None:
        return stop_reason
    return "tool_use" if any(b.get("type") == "tool_use" for b in blocks) else "end_turn"


def message(content_blocks: list[dict[str, Any]], *, stop_reason: str | None = None,
            model: str = DEFAULT_MODEL, message_id: str = "msg_fake",
            usage: dict[str, Any] | None = None) -> dict[str, Any]:
    """A complete (non-streamed) Message object."""
    return {
        "id": message_id, "type": "message", "role": "assistant", "model": model,
        "content": [dict(b) for b in content_blocks],
        "stop_reason": _stop_reason(content_blocks, stop_reason), "stop_sequence": None,
        "usage": usage_of(usage),
    }


# --- streaming -------------------------------------------------------------------------------------------

def event(data: dict[str, Any]) -> bytes:
    """One SSE event, named after its `type` (as Anthropic sends them)."""
    return f"event: {data['type']}\ndata: {orjson.dumps(data).decode()}\n\n".encode()


PING = b'event: ping\ndata: {"type": "ping"}\n\n'


def error_event(type: str, message: str) -> bytes:
    """A mid-stream error event (HTTP status already 200); the SDK raises on it."""
    return event({"type": "error", "error": {"type": type, "message": message}})


def split(s: str, pieces: int = 2) -> list[str]:
    """`s` cut into `pieces` non-empty parts (fewer when `s` is shorter); [""] for the empty string."""
    if not s:
        return [""]
    pieces = max(1, min(pieces, len(s)))
    step = -(-len(s) // pieces)
    return [s[i:i + step] for i in range(0, len(s), step)]


def _block_events(index: int, block: dict[str, Any], pieces: int) -> list[bytes]:
    kind = block["type"]
    def delta(d: dict[str, Any]) -> bytes:
        return event({"type": "content_block_delta", "index": index, "delta": d})

    if kind == "text":
        start = {"type": "text", "text": ""}
        deltas = [delta({"type": "text_delta", "text": p}) for p in split(block["text"], pieces)]
    elif kind == "tool_use":
        start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        arguments = orjson.dumps(block["input"]).decode()
        deltas = [delta({"type": "input_json_delta", "partial_json": p})
                  for p in ["", *split(arguments, max(2, pieces))]]
    elif kind == "thinking":
        start = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [delta({"type": "thinking_delta", "thinking": p}) for p in split(block["thinking"], pieces)]
        deltas.append(delta({"type": "signature_delta", "signature": block["signature"]}))
    else:  # redacted_thinking and anything else arrive whole in the start event
        start, deltas = dict(block), []
    return [event({"type": "content_block_start", "index": index, "content_block": start}), *deltas,
            event({"type": "content_block_stop", "index": index})]


def message_stream(content_blocks: list[dict[str, Any]], *, stop_reason: str | None = None,
                   model: str = DEFAULT_MODEL, message_id: str = "msg_fake",
                   usage: dict[str, Any] | None = None, ping: bool = True,
                   pieces: int = 2) -> list[bytes]:
    """The SSE events of a streamed Message, one list element (network write) per event.

    Text and thinking are sent in `pieces` deltas, tool input JSON in an empty delta plus at least two
    pieces; `ping` puts a ping after message_start and another one after the first block.
    """
    full = usage_of(usage)
    start_usage = full | {"output_tokens": 1}
    start = {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": [],
             "stop_reason": None, "stop_sequence": None, "usage": start_usage}
    out = [event({"type": "message_start", "message": start})]
    if ping:
        out.append(PING)
    for index, block in enumerate(content_blocks):
        out.extend(_block_events(index, block, pieces))
        if ping and index == 0:
            out.append(PING)
    out.append(event({"type": "message_delta",
                      "delta": {"stop_reason": _stop_reason(content_blocks, stop_reason),
                                "stop_sequence": None},
                      "usage": {"output_tokens": full["output_tokens"]}}))
    out.append(event({"type": "message_stop"}))
    return out


def error_body(type: str, message: str) -> bytes:
    """Anthropic's error body; pair it with ERROR_STATUS[type] in a Step(kind="error", ...)."""
    return orjson.dumps({"type": "error", "error": {"type": type, "message": message}})


# --- reading what the fake upstream got ------------------------------------------------------------------

def last_user_text(body: dict[str, Any]) -> str | None:
    """The text of the last user message of a request body (string content or its last text block)."""
    for msg in reversed(body.get("messages") or []):
        if msg.get("role") != "user":
            continue
        content = msg.get("content")
        if isinstance(content, str):
            return content
        texts = [b.get("text", "") for b in content or () if isinstance(b, dict) and b.get("type") == "text"]
        return texts[-1] if texts else None
    return None
