"""Layer 1: large tool results become labelled summaries; older ones can be pruned to placeholders.

Every decision is recorded in the session state with the verbatim original, and re-applied identically
on every later request, so the forwarded prefix stays byte-stable for prompt caching.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from proxy import heavy
from proxy.state import SessionState, StateStore
from proxy.summarize import gist, summarize

SUMMARY = "summary"
PLACEHOLDER = "placeholder"


def tool_names_by_call(messages: list[dict[str, Any]]) -> dict[str, str]:
    names: dict[str, str] = {}
    for message in messages:
        for call in message.get("tool_calls") or ():
            if isinstance(call, dict) and isinstance(call.get("id"), str):
                function = call.get("function") or {}
                names[call["id"]] = str(function.get("name") or "")
    return names


def summary_text(handle: str, tool: str | None, content: str, original_tokens: int,
                 body: str | None = None, arguments: str | None = None) -> str:
    """The labelled replacement. `body` is a model-written summary when one was prepared; `arguments`
    (the call's JSON arguments) let the summary keep the lines the call pointed at."""
    lines = content.count("\n") + 1
    label = f" from {tool}" if tool else ""
    return (f"[ctxproxy summary of tool result call_id={handle}{label}: original {original_tokens} tokens, "
            f"{lines} lines. This is a summary, not the output. Get the exact original with "
            f'read_tool_result(call_id="{handle}"), or a range with start_line/end_line.]\n'
            f"{body if body is not None else heavy.call(summarize, content, tool_name=tool, arguments=arguments)}")


def replacement(handle: str, tool: str | None, content: str, count_text: Callable[[str], int],
                arguments: str | None = None) -> str | None:
    """The labelled summary layer 1 applies to `content`, or None when it would not be clearly smaller
    (at most half the original's tokens): then the original stays."""
    original_tokens = count_text(content)
    text = summary_text(handle, tool, content, original_tokens, arguments=arguments)
    return text if count_text(text) * 2 <= original_tokens else None


def placeholder_text(handle: str, content: str, original_tokens: int) -> str:
    return f"[summarized: call_id={handle}] {gist(content)}; {original_tokens} tokens via read_tool_result"


def summarize_large(messages: list[dict[str, Any]], state: SessionState, store: StateStore,
                    count: Callable[[dict[str, Any]], int], threshold_tokens: int,
                    enabled: bool, tools_tokens: int = 0,
                    prepared: dict[tuple[str, str], str] | None = None) -> list[dict[str, Any]]:
    """Re-apply every earlier decision, and summarize new tool results over the threshold.

    `tools_tokens` (the client's tools schema) is part of the cached prefix a first summary invalidates.
    """
    names: dict[str, str] | None = None
    out = messages
    for index, message in enumerate(messages):
        if message.get("role") != "tool" or not isinstance(message.get("content"), str):
            continue
        call_id = str(message.get("tool_call_id") or "")
        content = message["content"]
        stored = state.lookup(call_id, content)
        if stored is None:
            if not enabled or (call_id, content) in state.kept or count(message) <= threshold_tokens:
                continue
            if names is None:
                names = tool_names_by_call(messages)
            tool = names.get(call_id)
            handle = state.new_handle(call_id)
            body = (prepared or {}).get((call_id, content))
            summary = summary_text(handle, tool, content, count(message), body)
            saved = count(message) - count({**message, "content": summary})
            if saved * 2 < count(message) or not _worth_first_summary(state, messages, index, saved, count,
                                                                      tools_tokens):
                state.kept.add((call_id, content))  # not worth a replacement; decided once, sticky
                continue
            stored = store.record(state, call_id, content, tool, summary, SUMMARY)
        if out is messages:
            out = list(messages)
        out[index] = {**message, "content": stored.replacement}
    return out


# The first summary of a session adds read_tool_result to the tools list, which leads the prompt: every
# cached token before it is billed again once. Assume the saving also counts on a few later turns.
FIRST_SUMMARY_LATER_TURNS = 2
CACHED_SHARE_LOST = 0.9


def _worth_first_summary(state: SessionState, messages: list[dict[str, Any]], index: int, saved: int,
                         count: Callable[[dict[str, Any]], int], tools_tokens: int) -> bool:
    if state.by_handle:
        return True  # the tool is already offered: nothing more to invalidate
    prefix = tools_tokens + sum(count(m) for m in messages[:index])
    return saved * (1 + 0.1 * FIRST_SUMMARY_LATER_TURNS) >= CACHED_SHARE_LOST * prefix


Pending = list[tuple[str, str, str | None]]  # (call_id, content, tool name)


def pending_summaries(messages: list[dict[str, Any]], state: SessionState,
                      count: Callable[[dict[str, Any]], int], threshold_tokens: int) -> Pending:
    """Tool results that would be summarized now and have no decision yet: (call_id, content, tool)."""
    found, names = [], None
    for message in messages:
        if message.get("role") != "tool" or not isinstance(message.get("content"), str):
            continue
        key = (str(message.get("tool_call_id") or ""), message["content"])
        if state.lookup(*key) or key in state.kept or count(message) <= threshold_tokens:
            continue
        names = names if names is not None else tool_names_by_call(messages)
        found.append((key[0], key[1], names.get(key[0])))
    return found


def prune(original: list[dict[str, Any]], forwarded: list[dict[str, Any]], state: SessionState,
          store: StateStore, count: Callable[[dict[str, Any]], int], total: int, target: int,
          keep_recent: int, protected: frozenset[str] = frozenset()) -> tuple[list[dict[str, Any]], int]:
    """Turn older tool results into placeholders, oldest first, in one batch down to `target` tokens.

    `original` and `forwarded` are index-aligned (this layer never adds or removes messages).
    The `keep_recent` newest tool results stay as they are, and so do `protected` call ids (text the
    model just retrieved with read_tool_result is never summarized again).
    """
    tool_indexes = [i for i, m in enumerate(forwarded)
                    if m.get("role") == "tool" and isinstance(original[i].get("content"), str)
                    and m.get("tool_call_id") not in protected]
    candidates = tool_indexes[:-keep_recent] if keep_recent else tool_indexes
    out = forwarded
    names = tool_names_by_call(original)
    for index in candidates:
        if total <= target:
            break
        message = original[index]
        call_id, content = str(message.get("tool_call_id") or ""), message["content"]
        stored = state.lookup(call_id, content)
        if stored is not None and stored.kind == PLACEHOLDER:
            continue
        handle = stored.handle if stored else state.new_handle(call_id)
        placeholder = placeholder_text(handle, content, count(message))
        if stored is None and len(placeholder) * 2 > len(content):
            continue  # too small to be worth a placeholder (and a cache break)
        stored = store.record(state, call_id, content, names.get(call_id), placeholder, PLACEHOLDER)
        new_message = {**forwarded[index], "content": stored.replacement}
        total += count(new_message) - count(forwarded[index])
        if out is forwarded:
            out = list(forwarded)
        out[index] = new_message
    return out, total
