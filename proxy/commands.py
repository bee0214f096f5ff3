"""Slash commands in the last user message, answered by the proxy without calling the model."""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

import orjson

RECALL = re.compile(r"^\s*/recall\s+(\S.*)$", re.DOTALL)


def parse(body: dict[str, Any]) -> tuple[str, str] | None:
    """("recall", query) when the last message is a user message starting with /recall."""
    last = body["messages"][-1]
    if last.get("role") != "user":
        return None
    content = last.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if not isinstance(content, str):
        return None
    match = RECALL.match(content)
    return ("recall", match.group(1).strip()) if match else None


def completion(text: str, model: str) -> bytes:
    """An OpenAI chat.completion carrying `text` as the assistant's answer."""
    return orjson.dumps({
        "id": f"chatcmpl-ctxproxy-{uuid.uuid4().hex[:24]}", "object": "chat.completion",
        "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    })


def completion_chunks(text: str, model: str) -> list[bytes]:
    """The same answer as a stream: role, content, finish, [DONE]."""
    base = {"id": f"chatcmpl-ctxproxy-{uuid.uuid4().hex[:24]}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": model}
    deltas = [({"role": "assistant", "content": ""}, None), ({"content": text}, None), ({}, "stop")]
    chunks = [b"data: " + orjson.dumps(base | {"choices": [{"index": 0, "delta": d, "finish_reason": f}]})
              + b"\n\n" for d, f in deltas]
    return [*chunks, b"data: [DONE]\n\n"]
