"""Hypothesis strategies for agent conversations: turns of user text, tool calls and tool results."""

from __future__ import annotations

import json
from typing import Any

import orjson
from hypothesis import strategies as st

WORDS = ["error", "build", "test", "ok", "path/to/file.py", "ord_123", "42", "warning", "done", "value",
         "Traceback", "retry", "user", "café", "東京"]

line = st.lists(st.sampled_from(WORDS), min_size=1, max_size=12).map(" ".join)
text = st.lists(line, min_size=1, max_size=6).map("\n".join)
big_text = st.lists(line, min_size=30, max_size=200).map("\n".join)
tool_output = st.one_of(text, text, big_text)

# How clients write JSON: compact as orjson, Python's default separators, indented, ASCII-escaped.
json_styles = st.sampled_from(["orjson", "python", "indent", "ascii"])


def dump_styled(value: Any, style: str) -> bytes:
    if style == "orjson":
        return orjson.dumps(value)
    if style == "python":
        return json.dumps(value, ensure_ascii=False).encode()  # ", " and ": " separators
    if style == "indent":
        return json.dumps(value, indent=2, ensure_ascii=False).encode()
    return json.dumps(value).encode()  # \\uXXXX escapes


CLIENT_TOOLS = [
    {"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}},
]


@st.composite
def turn(draw: st.DrawFn, index: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": draw(text)}]
    for step in range(draw(st.integers(0, 3))):
        calls = []
        for k in range(draw(st.integers(1, 2))):
            # Some agents reuse call ids; keep that possible.
            call_id = draw(st.sampled_from([f"call_{index}_{step}_{k}", f"call_{k}"]))
            calls.append({"id": call_id, "type": "function", "function": {
                "name": draw(st.sampled_from(["run", "read_file"])), "arguments": '{"x": 1}'}})
        messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        for call in calls:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": draw(tool_output)})
    messages.append({"role": "assistant", "content": draw(text)})
    return messages


@st.composite
def conversation(draw: st.DrawFn, max_turns: int = 6) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent. " + draw(text)}]
    for index in range(draw(st.integers(1, max_turns))):
        messages.extend(draw(turn(index)))
    messages.append({"role": "user", "content": "next: " + draw(text)})
    return messages


@st.composite
def long_conversation(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Agent turns with something to say, results small or large, compressible (a summary halves them)
    or not, some answered by the user in words: long enough for a first sight to evict most of it."""
    messages = draw(conversation(max_turns=3))[:-1]
    for n in range(draw(st.integers(5, 40))):
        if draw(st.integers(0, 5)) == 0:
            messages.append({"role": "user", "content": f"Also check item {n}, please."})
        thought = f"Step {n}: the failure points at the parser; I run it again. " * draw(st.integers(1, 6))
        messages.append({"role": "assistant", "content": thought, "tool_calls": [
            {"id": f"call_{n}", "type": "function", "function": {"name": "run", "arguments": '{"x": 1}'}}]})
        size = draw(st.sampled_from([2, 40, 150]))
        if draw(st.booleans()):  # a log a summary compresses
            content = "\n".join(f"INFO worker {k % 3} processed ok" for k in range(size)) + f"\nid ord_{n}"
        else:  # ids and paths on every line: a summary would keep nearly all of it
            content = "\n".join(f"src/mod_{n}/f_{k}.py:{k}: ValueError in ord_{n}_{k}" for k in range(size))
        messages.append({"role": "tool", "tool_call_id": f"call_{n}", "content": content})
    messages.append({"role": "user", "content": "and now?"})
    return messages


def request_prefixes(messages: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Each point where the agent called the model: every prefix that ends before an assistant message."""
    return [messages[:i] for i, m in enumerate(messages) if m["role"] == "assistant" and i > 0] + [messages]


def pairing_errors(messages: list[dict[str, Any]]) -> list[str]:
    """Every assistant tool call answered (in order, right after it) and every tool message called."""
    errors, pending = [], []
    for index, message in enumerate(messages):
        if message["role"] == "tool":
            if not pending or message.get("tool_call_id") != pending[0]:
                answered = message.get("tool_call_id")
                errors.append(f"messages[{index}] answers {answered!r}, expected {pending[:1]}")
            else:
                pending.pop(0)
            continue
        if pending:
            errors.append(f"messages[{index}] comes before calls {pending} were answered")
            pending = []
        pending = [c["id"] for c in message.get("tool_calls") or ()]
    return errors
