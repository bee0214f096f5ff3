"""Anthropic Messages and OpenAI Responses: a resent history decodes to the same neutral objects
(wire/neutral_cache.py), and what the codec does with them — the neutral conversation, a rewrite encoded
back — is exactly what a fresh decode gives."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.wire.messages_format import MESSAGES
from proxy.wire.neutral_cache import NEUTRAL
from proxy.wire.resent import BODIES
from proxy.wire.responses_format import RESPONSES


def session(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the bug. " + "context " * 9000}]
    for n in range(turns):
        messages.append({"role": "assistant", "content": [
            {"type": "text", "text": f"step {n}"},
            {"type": "tool_use", "id": f"toolu_{n}", "name": "bash", "input": {"cmd": f"run {n}"}}]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_{n}", "content": f"output {n} " * 300},
            {"type": "text", "text": f"note {n}"}]})
    return messages


def messages_body(turns: int) -> bytes:
    return orjson.dumps({"model": "claude-sonnet-4-5", "max_tokens": 100, "system": "Be careful.",
                         "messages": session(turns)})


def replaced(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A rewrite as layer 1 makes one: the first tool result summarized."""
    at = next(i for i, m in enumerate(messages) if m.get("role") == "tool")
    return [*messages[:at], {**messages[at], "content": "[summarized: call_id=toolu_0] output"},
            *messages[at + 1:]]


def responses_body(turns: int) -> bytes:
    items: list[dict[str, Any]] = [{"type": "message", "role": "user",
                                    "content": [{"type": "input_text", "text": "Fix it. " + "ctx " * 18000}]}]
    for n in range(turns):
        items += [{"type": "reasoning", "id": f"rs_{n}",
                   "summary": [{"type": "summary_text", "text": "hmm"}]},
                  {"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n}", "name": "shell",
                   "arguments": orjson.dumps({"cmd": f"run {n}"}).decode()},
                  {"type": "function_call_output", "call_id": f"call_{n}", "output": f"output {n} " * 300}]
    return orjson.dumps({"model": "gpt-5", "instructions": "You are Codex.", "input": items, "store": False})


@pytest.mark.parametrize(("codec", "make"), [(MESSAGES, messages_body), (RESPONSES, responses_body)],
                         ids=["messages", "responses"])
def test_a_resent_history_decodes_to_the_same_objects_and_encodes_the_same_bytes(codec, make):
    BODIES.clear()
    NEUTRAL.clear()
    first = codec.decode(make(3))
    later = codec.decode(make(5))  # the same session two turns on: built on the first
    shared = len(first.messages)
    assert all(a is b for a, b in zip(first.messages, later.messages[:shared], strict=True))
    BODIES.clear()
    NEUTRAL.clear()
    alone = codec.decode(make(5))  # the same body decoded from nothing
    assert later.messages == alone.messages
    for decoded in (later, alone):
        assert decoded.encode(decoded.messages, decoded.messages, decoded.tools) == make(5)
    rewritten = [d.encode(replaced(d.messages), d.messages, d.tools) for d in (later, alone)]
    assert rewritten[0] == rewritten[1] != make(5)
    assert b"[summarized: call_id=toolu_0]" in rewritten[0]
