"""Content-based pieces of the retention benchmark (see bench/retention.py for the figures' definitions).

Pure functions over OpenAI chat messages, independent of the proxy's own rules: the task statement, the
needles of a conversation, whether a token occurs in a text, what the model sees (forwarded text, handles,
queries it could send to recall), and the two baselines (naive pair-safe truncation, observation masking).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable
from typing import Any

from bench.critical import critical_tokens

DEMONSTRATION = "Here is a demonstration"
MASK_KEEP_TURNS = 10
_HANDLE = re.compile(r"(?:call_id|handle)\s*[=:]\s*[\"']?([A-Za-z0-9_.:\-]{1,128}(?:#[0-9]{1,6})?)")
_BULLET = re.compile(r"^\s*(?:[-*•]|\d+\.)\s*")
_PAREN_HEAD = re.compile(r"^\((?:[^()]*\b(?:tokens?|\d{1,2}:\d{2})\b[^()]*)\)\s*")
_SIZE = re.compile(r"~?\d+(?:\.\d+)?k? tokens")
_WORD = re.compile(r"\w")


def text_of(message: dict[str, Any]) -> str:
    """Everything a message says: its text (or text parts) and its tool calls' names and arguments."""
    content = message.get("content")
    parts: list[str] = []
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        parts.extend(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    for call in message.get("tool_calls") or ():
        function = (call.get("function") or {}) if isinstance(call, dict) else {}
        parts.append(f"{function.get('name') or ''} {function.get('arguments') or ''}")
    return "\n".join(parts)


def joined(messages: list[dict[str, Any]]) -> str:
    return "\n".join(text_of(m) for m in messages)


def occurs(token: str, text: str) -> bool:
    """`token` in `text` as a whole token: no word character right before or after it (and no decimal
    continuation after it), so `100` is not found in `2100` or `100.5`."""
    start = text.find(token)
    end_of_text = len(text)
    while start >= 0:
        end = start + len(token)
        before_ok = start == 0 or not _WORD.match(text[start - 1])
        after_ok = end == end_of_text or not (_WORD.match(text[end]) or (
            text[end] == "." and end + 1 < end_of_text and text[end + 1].isdigit()))
        if before_ok and after_ok:
            return True
        start = text.find(token, start + 1)
    return False


def _leading_system(messages: list[dict[str, Any]]) -> int:
    index = 0
    while index < len(messages) and messages[index].get("role") in ("system", "developer"):
        index += 1
    return index


def task_index(messages: list[dict[str, Any]]) -> int | None:
    """Index of the task statement: the first user message after the system prompt, past leading assistant
    greetings (assistant text without tool calls) and a demonstration (SWE-agent: a user message that
    starts with "Here is a demonstration"). None when a tool call comes first (pure tool loops)."""
    for index in range(_leading_system(messages), len(messages)):
        message = messages[index]
        role = message.get("role")
        if role == "assistant" and not message.get("tool_calls"):
            continue
        if role == "user":
            text = text_of(message)
            if text.lstrip().startswith(DEMONSTRATION):
                continue
            return index if text.strip() else None
        return None
    return None


def last_call(messages: list[dict[str, Any]]) -> int | None:
    """Index of the last assistant message (the answer of the conversation's last model call)."""
    for index in range(len(messages) - 1, 0, -1):
        if messages[index].get("role") == "assistant":
            return index
    return None


def needles(messages: list[dict[str, Any]], tools: list[Any] | None) -> set[str]:
    """Ids, paths and numbers of a non-system, non-assistant message before the last model call that an
    assistant message after it (up to the one the last call produced) uses again, minus tokens the system
    prompt or the tools already show."""
    last = last_call(messages)
    if last is None:
        return set()
    head = _leading_system(messages)
    fixed = joined(messages[:head]) + "\n" + repr(tools or "")
    first_seen: dict[str, int] = {}  # token -> first non-assistant message that has it
    pieces, starts, owners = [], [], []  # assistant texts, concatenated once
    size = 0
    for index in range(head, last + 1):
        message = messages[index]
        if message.get("role") == "assistant":
            text = text_of(message)
            pieces.append(text)
            starts.append(size)
            owners.append(index)
            size += len(text) + 1
        elif message.get("role") not in ("system", "developer") and index < last:
            critical = critical_tokens(text_of(message))
            for token in critical.ids | critical.paths | critical.numbers:
                first_seen.setdefault(token, index)
    said = "\n".join(pieces)
    found = set()
    for token, index in first_seen.items():
        at = _last_occurrence(token, said)
        if at >= 0 and owners[bisect.bisect_right(starts, at) - 1] > index and not occurs(token, fixed):
            found.add(token)
    return found


def _last_occurrence(token: str, text: str) -> int:
    at = text.rfind(token)
    while at >= 0:
        if occurs(token, text[max(0, at - 1):at + len(token) + 2]):
            return at
        at = text.rfind(token, 0, at + len(token) - 1)
    return -1


def present(tokens: set[str], text: str) -> set[str]:
    return {t for t in tokens if occurs(t, text)}


def visible_handles(text: str) -> list[str]:
    """Handle-like strings the prompt shows (`call_id=…`, `call_id: …`, `handle=…`), in order, distinct;
    with a trailing `:` or `.` both as written and stripped (prose punctuation)."""
    seen: dict[str, None] = {}
    for match in _HANDLE.finditer(text):
        handle = match.group(1)
        seen.setdefault(handle, None)
        stripped = handle.rstrip(":.")
        if stripped and stripped != handle:
            seen.setdefault(stripped, None)
    return list(seen)


def summary_queries(block: str) -> list[str]:
    """Recall queries a model could form from an auto-summary block: each headline line with its bullet,
    time and size stripped (frame lines and age headers skipped)."""
    queries = []
    for line in block.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith(("[", "#")) or not _BULLET.match(stripped):
            continue
        query = _PAREN_HEAD.sub("", _BULLET.sub("", stripped, count=1), count=1)
        query = _SIZE.sub("", query).strip(" -·→")
        if query and not re.fullmatch(r"\(?\d+ older exchanges? not listed\)?", query):
            queries.append(query)
    return queries


def tool_call_queries(messages: list[dict[str, Any]]) -> list[str]:
    """`name arguments` of every tool call the forwarded prompt shows."""
    queries = []
    for message in messages:
        for call in message.get("tool_calls") or ():
            function = (call.get("function") or {}) if isinstance(call, dict) else {}
            query = f"{function.get('name') or ''} {function.get('arguments') or ''}".strip()
            if query:
                queries.append(query)
    return queries


# ------------------------------------------------------------------------------------------ baselines

def truncate(prefix: list[dict[str, Any]], budget: int,
             count: Callable[[list[dict[str, Any]]], int]) -> list[dict[str, Any]]:
    """Naive truncation: drop the oldest messages after the system prompt until the request (messages and
    tools, as `count` measures it) fits `budget`; never start on a tool message, so no tool call loses its
    results. The last message always stays (over budget if it alone does not fit)."""
    head = _leading_system(prefix)
    if count(prefix) <= budget:
        return prefix
    cuts = [i for i in range(head + 1, len(prefix)) if prefix[i].get("role") != "tool"]
    if not cuts:
        return prefix
    # Fewest messages dropped that fits: binary search over the cut points (tokens fall as the cut moves).
    low, high = 0, len(cuts) - 1
    while low < high:
        middle = (low + high) // 2
        if count([*prefix[:head], *prefix[cuts[middle]:]]) <= budget:
            high = middle
        else:
            low = middle + 1
    return [*prefix[:head], *prefix[cuts[low]:]]


def observations(messages: list[dict[str, Any]], user_observations: bool) -> list[int]:
    """Indexes of tool outputs: tool messages, and in text-protocol traces the user messages after the
    task statement (the environment's answers to commands written in assistant text)."""
    task = task_index(messages)
    found = []
    for index, message in enumerate(messages):
        role = message.get("role")
        if role == "tool" or (user_observations and role == "user" and task is not None and index > task
                              and index > 0 and messages[index - 1].get("role") == "assistant"):
            found.append(index)
    return found


def placeholder(message: dict[str, Any]) -> str:
    return f"[old output omitted to save context: {len(text_of(message))} characters]"


def mask(prefix: list[dict[str, Any]], keep_turns: int,
         user_observations: bool) -> tuple[list[dict[str, Any]], list[tuple[int, str]]]:
    """Observation masking: outputs that answer an assistant turn older than the last `keep_turns` turns
    become a one-line placeholder; nothing else changes. Returns the messages and (index, placeholder) of
    every masked output."""
    turns = [i for i, m in enumerate(prefix) if m.get("role") == "assistant"]
    if len(turns) <= keep_turns:
        return prefix, []
    oldest_kept_turn = turns[-keep_turns] if keep_turns else len(prefix)
    out = list(prefix)
    masked = []
    for index in observations(prefix, user_observations):
        if index >= oldest_kept_turn:
            break
        text = placeholder(prefix[index])
        if len(text) < len(text_of(prefix[index])):  # a placeholder longer than the output saves nothing
            out[index] = {**prefix[index], "content": text}
            masked.append((index, text))
    return out, masked
