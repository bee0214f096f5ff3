"""Structural mutations of valid chat requests, for fuzzing the proxy (tests/test_fuzz.py, bench/faults.py).

A case is a valid request (agent histories with tool calls, content parts, slash commands, big tool
results...) with one to four mutations: a value at any path swapped for another type, removed, nulled,
emptied, deeply nested or given odd text (lone surrogates, unicode, JSON-looking strings); messages
dropped, duplicated or reordered; unknown fields added; or the bytes themselves broken. Plain `random`,
no pytest: `mutated_requests(seed, n)` works anywhere, and `request_bytes(rng)` takes hypothesis's
`st.randoms()` so the fuzz test shrinks.
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any

# ------------------------------------------------------------------------------------------ the seeds

LOG = "\n".join(f"2026-01-0{i % 9 + 1} INFO step {i} path=src/app/mod_{i}.py status=ok id=ord_{i}"
                for i in range(120))
PAGES = json.dumps({"pages": [{"id": f"page-{i}", "title": f"Page {i}", "body": "lorem " * 20}
                              for i in range(25)]})
TOOLS = [{"type": "function", "function": {"name": "run", "description": "run a shell command",
                                           "parameters": {"type": "object",
                                                          "properties": {"cmd": {"type": "string"}}}}},
         {"type": "function", "function": {"name": "get_pages", "parameters": {"type": "object"}}}]


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _agent_history(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent. Be brief."},
                                      {"role": "user", "content": "Fix the failing build in src/app."}]
    for turn in range(turns):
        run = _call(f"call_{turn}_a", "run", json.dumps({"cmd": f"make test -k t{turn}"}))
        pages = _call(f"call_{turn}_b", "get_pages", '{"limit": 25}')
        messages += [
            {"role": "assistant", "content": f"I decided to use make because it is faster (turn {turn}).",
             "tool_calls": [run, pages]},
            {"role": "tool", "tool_call_id": run["id"], "content": LOG if turn % 2 else "ok\n" * 5},
            {"role": "tool", "tool_call_id": pages["id"], "content": PAGES},
            {"role": "assistant", "content": f"Turn {turn}: the build still fails? Retrying did not work."},
            {"role": "user", "content": f"continue with step {turn + 1}"},
        ]
    return messages


def seeds() -> list[dict[str, Any]]:
    """Valid requests, each a different shape the proxy interprets (fresh copies: mutations work in place)."""
    return copy.deepcopy(_SEEDS)


def _seeds() -> list[dict[str, Any]]:
    user = {"role": "user", "content": "hello there"}
    return [
        {"model": "gpt-4o", "messages": [user]},
        {"model": "gpt-4o", "stream": True, "messages": [{"role": "system", "content": "be brief"}, user]},
        {"model": "gpt-4o-mini", "messages": _agent_history(2), "tools": TOOLS, "temperature": 0.2},
        {"model": "gpt-4o", "messages": _agent_history(6), "tools": TOOLS, "stream": True,
         "metadata": {"session_id": "fuzz-session"}},
        {"model": "claude-3-5-sonnet", "messages": _agent_history(3), "tools": TOOLS, "user": "alice",
         "stream_options": {"include_usage": True}, "tool_choice": "auto", "parallel_tool_calls": True},
        {"model": "gpt-4o", "messages": [
            {"role": "developer", "content": [{"type": "text", "text": "Rules: be exact."}]},
            {"role": "user", "content": [
                {"type": "text", "text": "What is in this picture?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=",
                                                    "detail": "low"}},
                {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
                {"type": "text", "text": "And this file?", "cache_control": {"type": "ephemeral"}}]}]},
        {"model": "gpt-4o", "messages": [
            {"role": "user", "content": "call the legacy function"},
            {"role": "assistant", "content": None, "function_call": {"name": "run", "arguments": "{}"}},
            {"role": "function", "name": "run", "content": '{"id": "page-1", "title": "Home"}'},
            {"role": "assistant", "content": None, "refusal": None, "tool_calls": [
                _call("c1", "get_pages", "{}"),
                {"id": "c2", "type": "custom", "custom": {"name": "grep", "input": "TODO"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": PAGES}]},
            {"role": "tool", "tool_call_id": "c2", "content": "src/a.py:1: TODO"},
            {"role": "user", "content": "thanks"}]},
        {"model": "gpt-4o", "messages": [user, {"role": "assistant", "content": "hi"},
                                         {"role": "user", "content": "/recall build failure"}]},
        {"model": "gpt-4o", "stream": True,
         "messages": [{"role": "user", "content": "/pin always use make"}]},
        {"model": "gpt-4o", "messages": [{"role": "user", "content": "/pins"}]},
        {"model": "o3", "messages": [{"role": "user", "content": "json please"}],
         "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
             "type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}}}}},
         "max_completion_tokens": 100, "seed": 7, "logit_bias": {"50256": -100}, "n": 1, "stop": ["\n\n"]},
    ]


_SEEDS = _seeds()


# -------------------------------------------------------------------------------------- odd values

class Raw(str):
    """Text written into the JSON as is (numbers and nesting the json module would not write)."""


LONE_SURROGATES = ["\ud800", "\udfff", "a\udc00b", "\ud83d", "x\ude00"]
# Text that layers parse as JSON (tool arguments and results): nesting past the recursion limit, numbers
# past the digit limit, wrappers the entity extractor unwraps.
HOSTILE_JSON = [
    "[" * 5000, '{"a":' * 3000, '{"a":' * 950 + "1" + "}" * 950, "[" * 990 + "]" * 990, "{" * 100 + "}" * 100,
    "1" * 5000, "-" + "9" * 4400, "1e400", '{"id": "page-9", "title": "Nine"}', "null", "true", '"str"',
    '{"pages": [{"id": 1, "title": "x"}], "data": {"data": {"data": {}}}}', '{"id": ' + "9" * 5000 + "}",
    '{"data": [' + ",".join(f'{{"id": "p{i}", "name": "n"}}' for i in range(3000)) + "]}",
]
ODD_TEXT = [
    "", " ", "\u0000", "\u2028\u2029", "東京 🚀 café", "\u202eRTL\u202c", "e\u0301\u0301\u0301", "\ufeff",
    "\U0001f600" * 50, "<|endoftext|><|im_start|>system", "/recall", "/pin ", "/unpin pin-1", "/remember x",
    "line\n" * 2000, "\\ud800", "%2e%2e/../etc/passwd", "a" * 70_000, "Traceback (most recent call last):\n",
    *HOSTILE_JSON,
]
HUGE_NUMBERS = [Raw("1" + "0" * 30), Raw("-1" + "0" * 25), Raw("1" + "0" * 400), Raw("1e400"), Raw("-1e999"),
                Raw("1" + "0" * 5000), Raw("18446744073709551616"), Raw("-9223372036854775809"),
                Raw("1.7976931348623157e308"), Raw("5e-324"), Raw("NaN"), Raw("Infinity"), Raw("-0.0")]


def deep(depth: int, rng: random.Random) -> Raw:
    opening, closing = rng.choice([("[", "]"), ('{"a":', "}")])
    return Raw(opening * depth + "1" + closing * depth)


def odd_value(rng: random.Random) -> Any:
    kind = rng.randrange(14)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, -1, 1, 2**31, 2**63 - 1, -(2**63), 2**64 - 1])
    if kind == 3:
        return rng.choice([0.5, -1e-300, 1e308, 3.14])
    if kind == 4:
        return rng.choice(HUGE_NUMBERS)
    if kind == 5:
        return rng.choice(ODD_TEXT)
    if kind == 6:
        return rng.choice(LONE_SURROGATES)
    if kind == 7:
        return []
    if kind == 8:
        return {}
    if kind == 9:
        return [rng.choice(["x", 1, None, {}, []]) for _ in range(rng.randrange(1, 4))]
    if kind == 10:
        return {rng.choice(["text", "type", "id", "role", "content", "function", "name"]): odd_value(rng)}
    if kind == 11:
        return deep(rng.choice([50, 127, 200, 260, 900, 1100, 20_000]), rng)
    if kind == 12:
        return {"role": rng.choice(["user", "assistant", "tool", "system", "x"]), "content": "hi"}
    return rng.choice(["user", "assistant", "tool", "system", "function", "text", "image_url", "call_0_a"])


# ------------------------------------------------------------------------------------------- mutating

def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*path, index))
    return found


def _at(value: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        value = value[step]
    return value


def mutate(body: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """One structural mutation somewhere in `body` (in place; returns it)."""
    paths = _paths(body)
    # Bias towards the message fields the proxy interprets, while still reaching every path.
    interesting = [p for p in paths if len(p) >= 3 and p[0] == "messages"
                   and (p[2] in ("role", "content", "tool_calls", "tool_call_id", "name") or len(p) > 3)]
    texts = [p for p in interesting if isinstance(_at(body, p), str)]
    parsed = [p for p in texts if p[-1] in ("arguments", "content", "text")]  # what layers parse as JSON
    if parsed and rng.random() < 0.5:
        texts = parsed
    odd_text = bool(texts) and rng.random() < 0.3  # valid shape, hostile text: reaches the layers
    path = rng.choice(texts if odd_text else interesting if interesting and rng.random() < 0.7 else paths)
    if not path:
        body[rng.choice(["messages", "model", "stream", "tools", "metadata", "x_future"])] = odd_value(rng)
        return body
    parent, key = _at(body, path[:-1]), path[-1]
    action = 6 if odd_text else rng.randrange(10)
    if action <= 3:
        parent[key] = odd_value(rng)
    elif action == 4:
        del parent[key]
    elif action == 5:
        parent[key] = None
    elif action == 6 and isinstance(parent[key], str):
        # odd text inside a valid string (arguments, tool output, ids, names...): the shape stays valid
        text, odd = parent[key], rng.choice(HOSTILE_JSON if rng.random() < 0.4 else ODD_TEXT)
        cut = rng.randrange(len(text) + 1)
        inserted = text[:cut] + rng.choice([*LONE_SURROGATES, odd]) + text[cut:]
        parent[key] = odd if rng.random() < 0.5 else inserted
    elif action == 7 and isinstance(parent, list):
        # duplicate, move or drop a whole element (messages out of order, orphan tool results, ...)
        item = parent.pop(key)
        if rng.random() < 0.5:
            parent.insert(rng.randrange(len(parent) + 1), item)
        if rng.random() < 0.5:
            parent.insert(rng.randrange(len(parent) + 1), copy.deepcopy(item))
    elif action == 8 and isinstance(parent[key], dict):
        parent[key][rng.choice(["x_future", "text", "type", "id", "function", "tool_call_id", "content"])] = \
            odd_value(rng)
    else:
        parent[key] = rng.choice([[], {}, "", 0, [parent[key]], {"value": parent[key]}])
    return body


def encode(value: Any) -> str:
    """JSON text; lone surrogates become \\udXXX escapes (ensure_ascii), Raw is written as is."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, dict):
        return "{" + ",".join(json.dumps(str(k)) + ":" + encode(v) for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(encode(v) for v in value) + "]"
    return json.dumps(value)


def _break_bytes(raw: bytes, rng: random.Random) -> bytes:
    kind = rng.randrange(6)
    if kind == 0:
        return raw[: rng.randrange(len(raw))]  # truncated
    if kind == 1:
        cut = rng.randrange(len(raw))
        bad = rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b"\xf4\x90\x80\x80"])
        return raw[:cut] + bad + raw[cut:]
    if kind == 2:
        return b"\xef\xbb\xbf" + raw  # BOM
    if kind == 3:
        return rng.choice([b"", b"null", b"[]", b'"messages"', b"{}", b"1e400", b"{" * 3000])
    if kind == 4:
        return raw.replace(b'"content":', b'"content":\xed\xa0\x80', 1)
    return raw + rng.choice([b",", b"}", b" trailing", b"\n"])


def request_bytes(rng: random.Random) -> bytes:
    """One fuzz case: a seed request with 0-4 structural mutations (and now and then broken bytes)."""
    choices = seeds()
    body = rng.choice(choices[2:5] if rng.random() < 0.3 else choices)  # agent histories: the layers act
    for _ in range(rng.choice([0, 0, 1, 1, 1, 2, 2, 3, 4])):
        body = mutate(body, rng) if isinstance(body, dict) else body
    raw = encode(body).encode("utf-8", "surrogatepass")
    return _break_bytes(raw, rng) if rng.random() < 0.08 else raw


def mutated_requests(seed: int, n: int) -> list[bytes]:
    """`n` fuzz cases, the same ones for the same seed (for bench/ and reproducing a failure)."""
    rng = random.Random(seed)
    return [request_bytes(rng) for _ in range(n)]
