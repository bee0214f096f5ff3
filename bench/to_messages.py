"""An OpenAI-chat conversation as the Anthropic Messages request a Claude client would send, and the rules
a Messages request must follow (so the benchmarks and tests can check what the codec encodes).

`to_messages(messages, tools)` is deterministic (same input, same body) and always yields a valid body:

- leading system (and developer) messages -> `system` (one string, joined by a blank line); a later one
  becomes a user text block (Messages has no system turn mid-conversation);
- user and assistant turns alternate: consecutive messages of one role are merged into one turn, the tool
  messages after an assistant turn become one user turn of `tool_result` blocks (in order), and a user
  message right after them joins that turn as text after the results;
- assistant `tool_calls` -> `tool_use` blocks, input = the parsed arguments (a non-object or unparseable
  text -> `{"raw": text}`); content None or "" -> no text block; an assistant message with neither is left
  out; a conversation that starts with an assistant turn gets a first user turn "(start)";
- tool_use ids as Anthropic takes them: characters outside `[A-Za-z0-9_-]` become `_`, and an id used
  again later in the conversation becomes `<id>_2`, `<id>_3`... (the API rejects a request whose ids
  repeat; a result answers the latest call of its id);
- pairing the API enforces: a tool message that answers no call of the turn before becomes a text block
  (`[tool result <id>] ...`); a call without a result gets the result "(no result recorded)";
- tools -> `{name, description, input_schema}`; a conversation without tools that makes tool calls gets
  one definition per called name (first-use order; the API wants every used tool defined). Pass the whole
  conversation as `called_in` when converting its prefixes, so every prefix gets the same tools list.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from typing import Any

import orjson

MODEL = "claude-sonnet-4-5"
MAX_TOKENS = 4096
START = "(start)"
EMPTY = "(empty)"
NO_RESULT = "(no result recorded)"
MAX_BREAKPOINTS = 4
_ID_CHARS = re.compile(r"[^A-Za-z0-9_-]")

Block = dict[str, Any]


# ------------------------------------------------------------------------------------------ converting

def text_of(content: Any) -> str:
    """A chat content's text: the string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def user_blocks(content: Any) -> list[Block]:
    """A chat user content as Anthropic blocks (images by URL or base64; other parts as JSON text)."""
    parts = content if isinstance(content, list) else [{"type": "text", "text": text_of(content)}]
    blocks: list[Block] = []
    for part in parts:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind == "text":
            if str(part.get("text") or "").strip():
                blocks.append({"type": "text", "text": part["text"]})
        elif kind == "image_url":
            url = str((part.get("image_url") or {}).get("url") or "")
            head, _, data = url.partition(",")
            if url.startswith("data:") and head.endswith(";base64"):
                source = {"type": "base64", "media_type": head[5:-7], "data": data}
            else:
                source = {"type": "url", "url": url}
            blocks.append({"type": "image", "source": source})
        else:
            blocks.append({"type": "text", "text": orjson.dumps(part).decode()})
    return blocks


def tool_input(arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, dict):
        return arguments
    text = arguments if isinstance(arguments, str) else ""
    try:
        parsed = orjson.loads(text or "{}")
    except orjson.JSONDecodeError:
        return {"raw": text}
    return parsed if isinstance(parsed, dict) else {"raw": text}


def native_tools(tools: list[Any] | None, called_in: Iterable[dict[str, Any]] = ()) -> list[Block] | None:
    """Chat tools in Anthropic form; without tools, one bare definition per tool name called."""
    if tools:
        out = []
        for spec in tools:
            function = spec.get("function") if isinstance(spec, dict) else None
            if isinstance(function, dict) and function.get("name"):
                out.append({"name": function["name"], "description": function.get("description") or "",
                            "input_schema": function.get("parameters") or {"type": "object"}})
        return out or None
    return [{"name": n, "description": "", "input_schema": {"type": "object"}}
            for n in called_names(called_in)] or None


def called_names(messages: Iterable[dict[str, Any]]) -> list[str]:
    """The tool names a conversation calls, in first-use order."""
    names: dict[str, None] = {}
    for message in messages:
        for call in message.get("tool_calls") or ():
            name = (call.get("function") or {}).get("name") if isinstance(call, dict) else None
            if isinstance(name, str) and name:
                names.setdefault(name)
    return list(names)


def fresh_id(base: str, used: set[str]) -> str:
    """`base`, else `<base>_2`, `<base>_3`...: the first not in `used` (then added to it)."""
    native, count = base, 1
    while native in used:
        count += 1
        native = f"{base}_{count}"
    used.add(native)
    return native


class _Turns:
    """Native turns being built: (role, blocks), one role after the other."""

    def __init__(self) -> None:
        self.turns: list[tuple[str, list[Block]]] = []
        self.used: set[str] = set()  # tool_use ids given out
        self.latest: dict[str, str] = {}  # chat id -> the native id of its latest call
        self.open: list[str] = []  # native ids of the last assistant turn still waiting for a result

    def add(self, role: str, blocks: list[Block]) -> None:
        if not blocks:
            return
        if role == "assistant":
            self.close()
        if self.turns and self.turns[-1][0] == role:
            self.turns[-1][1].extend(blocks)
        else:
            self.turns.append((role, list(blocks)))

    def close(self) -> None:
        """Calls of the last assistant turn that got no result: a result that says so."""
        if self.open:
            missing = [{"type": "tool_result", "tool_use_id": i, "content": NO_RESULT} for i in self.open]
            self.open = []
            self.add_results(missing)

    def add_results(self, results: list[Block]) -> None:
        if self.turns and self.turns[-1][0] == "user":  # results lead the user turn
            blocks = self.turns[-1][1]
            at = next((i for i, b in enumerate(blocks) if b.get("type") != "tool_result"), len(blocks))
            blocks[at:at] = results
        else:
            self.turns.append(("user", list(results)))

    def call_id(self, chat_id: Any) -> str:
        native = fresh_id(_ID_CHARS.sub("_", str(chat_id or "")) or "call", self.used)
        self.latest[str(chat_id)] = native
        return native

    def assistant(self, message: dict[str, Any]) -> None:
        blocks: list[Block] = []
        text = text_of(message.get("content"))
        if text.strip():
            blocks.append({"type": "text", "text": text})
        calls = [c for c in message.get("tool_calls") or () if isinstance(c, dict)]
        uses = []
        for call in calls:
            function = call.get("function") or {}
            uses.append({"type": "tool_use", "id": self.call_id(call.get("id")),
                         "name": str(function.get("name") or "tool"),
                         "input": tool_input(function.get("arguments"))})
        if not blocks and not uses:
            return
        if not self.turns:
            self.turns.append(("user", [{"type": "text", "text": START}]))
        self.add("assistant", [*blocks, *uses])
        self.open += [u["id"] for u in uses]

    def tool(self, message: dict[str, Any]) -> None:
        chat_id = str(message.get("tool_call_id"))
        native = self.latest.get(chat_id)
        content = text_of(message.get("content"))
        if native is None or native not in self.open:  # answers no open call: plain text
            self.user([{"type": "text", "text": f"[tool result {chat_id}] {content}"}])
            return
        self.open.remove(native)
        self.add_results([{"type": "tool_result", "tool_use_id": native, "content": content}])

    def user(self, blocks: list[Block]) -> None:
        self.close()
        self.add("user", blocks or [{"type": "text", "text": EMPTY}])


def to_messages(messages: list[dict[str, Any]], tools: list[Any] | None = None, *, model: str = MODEL,
                called_in: Iterable[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The Anthropic Messages request body for a chat conversation (see the module's docstring)."""
    start = 0
    system: list[str] = []
    while start < len(messages) and messages[start].get("role") in ("system", "developer"):
        system.append(text_of(messages[start].get("content")))
        start += 1
    turns = _Turns()
    for message in messages[start:]:
        role = message.get("role")
        if role == "assistant":
            turns.assistant(message)
        elif role == "tool":
            turns.tool(message)
        elif role in ("system", "developer"):
            turns.user([{"type": "text", "text": text_of(message.get("content")) or EMPTY}])
        else:
            turns.user(user_blocks(message.get("content")))
    turns.close()
    if not turns.turns:
        turns.turns.append(("user", [{"type": "text", "text": START}]))
    body: dict[str, Any] = {"model": model, "max_tokens": MAX_TOKENS}
    if any(s for s in system):
        body["system"] = "\n\n".join(s for s in system if s)
    body["messages"] = [{"role": role, "content": blocks} for role, blocks in turns.turns]
    defined = native_tools(tools, messages if called_in is None else called_in)
    if defined:
        body["tools"] = defined
    return body


def to_messages_body(conversation: dict[str, Any], **options: Any) -> bytes:
    """A trace conversation (`{"messages", "tools", ...}`) as request bytes."""
    return orjson.dumps(to_messages(conversation.get("messages") or [], conversation.get("tools") or None,
                                    **options))


# ------------------------------------------------------------------------------------------ checking

def _blocks(content: Any) -> list[Any]:
    return content if isinstance(content, list) else []


def breakpoints(body: dict[str, Any]) -> int:
    """cache_control breakpoints anywhere the API counts them: system, tools, message blocks (and blocks
    nested in a tool_result)."""
    total = sum(1 for b in _blocks(body.get("system")) if isinstance(b, dict) and b.get("cache_control"))
    total += sum(1 for t in _blocks(body.get("tools")) if isinstance(t, dict) and t.get("cache_control"))
    for message in _blocks(body.get("messages")):
        for block in _blocks(message.get("content") if isinstance(message, dict) else None):
            if not isinstance(block, dict):
                continue
            total += bool(block.get("cache_control"))
            if block.get("type") == "tool_result":
                total += sum(1 for b in _blocks(block.get("content"))
                             if isinstance(b, dict) and b.get("cache_control"))
    return total


def merged_turns(messages: list[Any]) -> list[tuple[Any, list[Any], int]]:
    """The turns the API reads: consecutive messages of one role joined (role, blocks, first index)."""
    turns: list[tuple[Any, list[Any], int]] = []
    for index, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else _blocks(content)
        if turns and turns[-1][0] == role:
            turns[-1][1].extend(blocks)
        else:
            turns.append((role, list(blocks), index))
    return turns


def violations(body: dict[str, Any]) -> list[str]:
    """What the Messages API would reject in `body`, one line each (empty: valid). On the turns the API
    reads (consecutive messages of one role joined, as it joins them), which must alternate from a user
    turn on: every tool_use has its tool_result in the very next (user) turn and every tool_result its
    tool_use in the turn right before; tool_result blocks come first in a user turn; tool_use ids and
    tool names are unique; no empty message or blank text block; at most 4 cache_control breakpoints."""
    found: list[str] = []
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return ["messages: missing or empty"]
    for index, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else _blocks(content)
        if not blocks:
            found.append(f"messages.{index}: empty content")
        for number, block in enumerate(blocks):
            if not isinstance(block, dict):
                found.append(f"messages.{index}.content.{number}: not a block")
            elif block.get("type") == "text" and not str(block.get("text") or "").strip():
                found.append(f"messages.{index}.content.{number}: blank text block")
    seen_ids: set[str] = set()
    previous_uses: list[str] = []
    turns = merged_turns(messages)
    for number, (role, blocks, first) in enumerate(turns):
        at = f"messages.{first}"
        blocks = [b for b in blocks if isinstance(b, dict)]
        if role not in ("user", "assistant"):
            found.append(f"{at}: role {role!r}")
        elif number == 0 and role != "user":
            found.append(f"{at}: the first turn is {role}, not user")
        uses = [str(b.get("id")) for b in blocks if b.get("type") == "tool_use"]
        results = [str(b.get("tool_use_id")) for b in blocks if b.get("type") == "tool_result"]
        for use in uses:
            if use in seen_ids:
                found.append(f"{at}: tool_use id {use} used twice")
            seen_ids.add(use)
        if role == "user":
            kinds = [b.get("type") == "tool_result" for b in blocks]
            if any(after and not before for before, after in itertools.pairwise(kinds)):
                found.append(f"{at}: a tool_result block after other content")
            if uses:
                found.append(f"{at}: tool_use in a user turn")
            missing = [u for u in previous_uses if u not in results]
            extra = [r for r in results if r not in previous_uses]
            if missing:
                found.append(f"{at}: no tool_result for {missing} (called in the turn before)")
            if extra:
                found.append(f"{at}: tool_result for {extra}, not called in the turn before")
        elif role == "assistant" and results:
            found.append(f"{at}: tool_result in an assistant turn")
        previous_uses = uses if role == "assistant" else []
    if previous_uses:
        found.append(f"messages.{len(messages) - 1}: calls {previous_uses} have no tool_result")
    names = [t.get("name") for t in _blocks(body.get("tools")) if isinstance(t, dict)]
    twice = sorted({str(n) for n in names if names.count(n) > 1})
    if twice:
        found.append(f"tools: names {twice} defined twice")
    count = breakpoints(body)
    if count > MAX_BREAKPOINTS:
        found.append(f"{count} cache_control breakpoints (at most {MAX_BREAKPOINTS})")
    return found
