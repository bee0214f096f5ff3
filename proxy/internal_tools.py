"""Tools the proxy adds to the request and answers itself; the client never sees their calls."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.archive_traffic import HANDLE, INTERNAL_NAMES, READ_TOOL_RESULT, RECALL
from proxy.state import StateStore

READ_TOOL_RESULT_SPEC: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": READ_TOOL_RESULT,
        "description": (
            "Return the original, verbatim output of an earlier tool call: one replaced by a summary or a "
            "placeholder, or one that left this conversation to fit the context window (summaries, the "
            "auto-summary and recall name its call_id or handle). Long outputs come in pages of lines; "
            "pass start_line/end_line (1-based, inclusive) to read a specific range."),
        "parameters": {
            "type": "object",
            "properties": {
                "call_id": {"type": "string",
                            "description": "The call_id or handle named in a summary or a recall hit."},
                "start_line": {"type": "integer", "minimum": 1},
                "end_line": {"type": "integer", "minimum": 1},
            },
            "required": ["call_id"],
        },
    },
}


RECALL_SPEC: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": RECALL,
        "description": (
            "Search everything said earlier, including exchanges that left this conversation to fit the "
            "context window (see the auto-summary). Full-text search: pass distinctive words, ids or "
            "error text. Returns ranked hits, this session first, each with its matching lines (line "
            "numbers included) and the call_id to read the whole message with read_tool_result."),
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "Words to search for."}},
            "required": ["query"],
        },
    },
}


def tool_name(spec: Any) -> str | None:
    """A tool's name: chat nests it under `function`; Anthropic and Responses tools carry it on top."""
    if isinstance(spec, dict):
        function = spec.get("function")
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            return function["name"]
        if isinstance(spec.get("name"), str):
            return spec["name"]
    return None


def with_internal_tools(client_tools: list[Any] | None, *, read: bool, recall: bool) -> list[Any] | None:
    """The client's tools unchanged and in order, then ours (none if the client has a same-named tool).

    All of ours arrive together, so the tools list (which leads the prompt) changes once per session.
    """
    if client_defines_internal_name(client_tools) or not (read or recall):
        return client_tools
    tools = list(client_tools or [])
    if read:
        tools.append(READ_TOOL_RESULT_SPEC)
    if recall:
        tools.append(RECALL_SPEC)
    return tools


def client_defines_internal_name(client_tools: list[Any] | None) -> bool:
    if not client_tools:
        return False
    # Asked two or three times a request of the same list: a resent body's tools are the very list of its
    # earlier parse (wire/resent.py), and Claude Code's twenty-odd tools cost each ask a walk. Nothing
    # edits a parsed list in place; the list is held, so its id is not another's.
    known = _DEFINES.get(id(client_tools))
    if known is not None and known[0] is client_tools and known[1] == len(client_tools):
        return known[2]
    found = any(tool_name(spec) in INTERNAL_NAMES for spec in client_tools)
    if len(_DEFINES) >= _DEFINES_KEPT:
        _DEFINES.clear()
    _DEFINES[id(client_tools)] = (client_tools, len(client_tools), found)
    return found


_DEFINES: dict[int, tuple[list[Any], int, bool]] = {}  # by id: (the list, its length, the answer)
_DEFINES_KEPT = 64  # tools lists remembered (about one per active session)


def is_internal_call(call: dict[str, Any]) -> bool:
    return tool_name(call) in INTERNAL_NAMES


Search = Callable[[str, str, str, str, int], list[dict[str, Any]]]  # tenant, session, policy, query, limit


@dataclass
class ToolContext:
    store: StateStore
    tenant: str
    session_id: str
    page_chars: int  # how much original text one call may return
    search: Search | None = None  # archive full-text search (None offline)
    policy: str = "default"
    recall_results: int = 8


def execute(call: dict[str, Any], context: ToolContext) -> str:
    """Answer one internal tool call; errors come back as text the model can act on."""
    function = call.get("function") or {}
    try:
        arguments = orjson.loads(function.get("arguments") or "{}")
    except orjson.JSONDecodeError:
        return "error: arguments must be a JSON object"
    if not isinstance(arguments, dict):
        return "error: arguments must be a JSON object"
    if function.get("name") == READ_TOOL_RESULT:
        return read_tool_result(arguments, context)
    if function.get("name") == RECALL:
        return recall(arguments, context)
    return f"error: unknown internal tool {function.get('name')!r}"


def read_tool_result(arguments: dict[str, Any], context: ToolContext) -> str:
    handle = arguments.get("call_id")
    if not isinstance(handle, str) or not HANDLE.match(handle):
        return "error: call_id must be the id named in a summary (letters, digits, _ . : - and #n)"
    stored = context.store.find(context.tenant, context.session_id, handle)
    if stored is None:
        return f"error: no stored tool result with call_id {handle!r} for this API key"
    lines = stored.content.splitlines(keepends=True)
    total = len(lines)
    start = _line_arg(arguments.get("start_line"), 1)
    end = _line_arg(arguments.get("end_line"), total)
    if start is None or end is None:
        return "error: start_line and end_line must be positive integers"
    if total == 0:
        return stored.content
    start, end = min(start, total), min(max(end, start), total)
    page: list[str] = []
    size = 0
    for number in range(start, end + 1):
        line = lines[number - 1]
        if page and size + len(line) > context.page_chars:
            break
        page.append(line)
        size += len(line)
    last = start + len(page) - 1
    body = "".join(page)
    if start == 1 and last == total:
        return body  # the whole original, byte for byte, nothing added
    # Only point onwards when the page stopped short of what was asked for.
    more = (f"; call read_tool_result(call_id={handle!r}, start_line={last + 1}) for the rest"
            if last < end else "")
    return f"[lines {start}-{last} of {total} of call_id={handle}{more}]\n{body}"


def _line_arg(value: Any, default: int) -> int | None:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value


def recall(arguments: dict[str, Any], context: ToolContext) -> str:
    query = arguments.get("query")
    if not isinstance(query, str) or not query.strip():
        return "error: query must be a non-empty string"
    if context.search is None:
        return "error: recall needs the archive, which is not available here"
    hits = context.search(context.tenant, context.session_id, context.policy, query, context.recall_results)
    return format_hits(query, hits, context.session_id, context.page_chars)


def format_hits(query: str, hits: list[dict[str, Any]], session_id: str, limit_chars: int) -> str:
    """Ranked hits with where and when each was said, the handle that reads the whole message back,
    and its lines holding the query's terms; at most `limit_chars` in all (whole hits are left out
    first, then a hit's later lines). archive_traffic knows its opening, so the answer is never indexed
    as the conversation when a client sends it back (a /recall answer)."""
    stopped = getattr(hits, "truncated", False)  # the search hit its time limit
    if not hits:
        if stopped:
            return (f"recall {query!r}: the search stopped at its time limit before finding a match; "
                    "try fewer, more distinctive words.")
        return f"recall {query!r}: no matches in the archive."
    head = (f"recall {query!r}: {len(hits)} match{'es' if len(hits) != 1 else ''}, best first"
            + ("; the search stopped early at its time limit, more may match" if stopped else "")
            + ". Read a whole message with read_tool_result(call_id=...), or from a line with start_line.")
    out = [head]
    size = len(head)
    for rank, hit in enumerate(hits, 1):
        block = _hit_lines(rank, hit, session_id)
        left = len(hits) - rank
        tail = f"\n({left + 1} more match{'es' if left else ''} left out to fit; use more distinctive words)"
        room = limit_chars - size - (len(tail) if left else 0)
        kept: list[str] = []
        used = 0
        for line in block:
            if used + len(line) + 1 > room:
                break
            kept.append(line)
            used += len(line) + 1
        if not kept:
            if size + len(tail) <= limit_chars:
                out.append(tail.lstrip("\n"))
            break
        out += kept
        size += used
    return "\n".join(out)[:limit_chars]


def _hit_lines(rank: int, hit: dict[str, Any], session_id: str) -> list[str]:
    where = "this session" if hit["session_id"] == session_id else f"session {hit['session_id']}"
    handle = hit.get("handle") or _call_id(hit.get("body"))
    count = hit.get("line_count")
    header = (f"{rank}. [{where}, {str(hit['created_at'])[:16].replace('T', ' ')}, {hit['role']}"
              + (f", {count} line{'s' if count != 1 else ''}" if count else "")
              + (f', call_id="{handle}"' if handle else "") + "]")
    lines = hit.get("lines")
    if not lines:
        return [header + (f" {hit['snippet']}" if hit.get("snippet") else "")]
    return [header, *(f"   line {number}: {text}" for number, text in lines)]


def _call_id(body: str | None) -> str | None:
    if not body:
        return None
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if message.get("tool_call_id"):
        return str(message["tool_call_id"])
    calls = message.get("tool_calls") or []
    return str(calls[0].get("id")) if calls and isinstance(calls[0], dict) else None
