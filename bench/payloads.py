"""Request bodies for the overhead benchmark, built deterministically."""

from __future__ import annotations

import random
from typing import Any

import orjson


def _text(rng: random.Random, chars: int) -> str:
    words = ["def", "return", "self", "config", "value", "result", "import", "error", "path", "items",
             "request", "session", "token", "for", "in", "if", "else", "None", "True", "data", "=", "(", ")"]
    out: list[str] = []
    size = 0
    while size < chars:
        word = rng.choice(words) + (str(rng.randrange(100)) if rng.random() < 0.2 else "")
        out.append(word)
        size += len(word) + 1
        if rng.random() < 0.08:
            out.append("\n   ")
    return " ".join(out)


def big_history(target_bytes: int = 500_000) -> list[dict[str, Any]]:
    """An agent-like history (user, tool call, tool result, answer) of about `target_bytes` of JSON."""
    rng = random.Random(7)
    system = "You are a coding agent. " + _text(rng, 2000)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    turn = 0
    while len(orjson.dumps(messages)) < target_bytes:
        call_id = f"call_{turn:04d}"
        call = {"name": "read_file", "arguments": orjson.dumps({"path": f"src/mod_{turn}.py"}).decode()}
        messages += [
            {"role": "user", "content": _text(rng, 200)},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": call_id, "type": "function", "function": call}]},
            {"role": "tool", "tool_call_id": call_id, "content": _text(rng, 3000)},
            {"role": "assistant", "content": _text(rng, 400)},
        ]
        turn += 1
    messages.append({"role": "user", "content": "Now summarise what you changed."})
    return messages


def chat_body(messages: list[dict[str, Any]], *, stream: bool = False) -> bytes:
    body: dict[str, Any] = {"model": "gpt-4o", "messages": messages}
    if stream:
        body["stream"] = True
    return orjson.dumps(body)
