"""What the Messages API rejects, checked on every body the codec rewrote: a rewrite that broke one of
these rules is a proxy bug, and the client's own request goes upstream instead (see Encoder.encode)."""

from __future__ import annotations

from typing import Any

MAX_BREAKPOINTS = 4


def problems(body: dict[str, Any]) -> list[str]:
    """Each broken rule, named with where: tool_use answered by the next user turn and only there,
    tool_result blocks first in their turn, at most 4 cache_control breakpoints. (Two turns of one role in
    a row are allowed: the API joins them.)"""
    found: list[str] = []
    messages = body.get("messages") or []
    waiting: list[str] = []  # tool_use ids of the previous assistant turn
    breakpoints = _marked(body.get("system")) + _marked(body.get("tools"))
    for k, message in enumerate(messages):
        role, content = message.get("role"), message.get("content")
        blocks = content if isinstance(content, list) else []
        breakpoints += _marked(blocks)
        results = [b.get("tool_use_id") for b in blocks
                   if isinstance(b, dict) and b.get("type") == "tool_result"]
        if role == "user":
            if sorted(map(str, results)) != sorted(waiting):
                found.append(f"messages.{k}: tool results {results} answer calls {waiting}")
            kinds = [b.get("type") == "tool_result" for b in blocks if isinstance(b, dict)]
            if kinds and kinds != sorted(kinds, reverse=True):
                found.append(f"messages.{k}: a tool_result block after other content")
            waiting = []
        else:
            if waiting:
                found.append(f"messages.{k}: calls {waiting} of the previous turn have no results")
            waiting = [str(b.get("id")) for b in blocks
                       if isinstance(b, dict) and b.get("type") == "tool_use"]
    if breakpoints > MAX_BREAKPOINTS:
        found.append(f"{breakpoints} cache_control breakpoints (at most {MAX_BREAKPOINTS})")
    return found


def _marked(blocks: Any) -> int:
    if not isinstance(blocks, list):
        return 0
    return sum(1 for b in blocks if isinstance(b, dict) and b.get("cache_control"))
