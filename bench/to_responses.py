"""An OpenAI-chat conversation as the OpenAI Responses request a stateless client sends (Codex with
`store: false`: the whole history in `input`), and the rules such a request must follow (so the benchmarks
and tests can check what the codec encodes).

`to_responses(messages, tools)` is deterministic (same input, same body):

- leading system (and developer) messages -> `instructions` (one string, joined by a blank line); a later
  one becomes a developer message item;
- user messages -> `{"type": "message", "role": "user", "content": [input_text parts]}` (images ->
  `input_image` by URL; other parts as JSON text);
- assistant text -> an assistant message item with one `output_text` part (none when the text is empty);
  `tool_calls` -> `function_call` items (`call_id`, `name`, `arguments` as a string: a non-string is written
  as JSON); an assistant message with neither is left out;
- tool messages -> `function_call_output` items (`call_id`, `output` text);
- call ids as in bench/to_messages.py: an id used again later in the conversation becomes `<id>_2`,
  `<id>_3`... (a result answers the latest call of its id); other characters are kept;
- pairing the API enforces: a tool message that answers no open call (of the assistant message before it)
  becomes a user message `[tool result <id>] ...`; a call left without a result gets the output
  "(no result recorded)", before the next user or assistant message (or at the end);
- tools -> `{"type": "function", "name", "description", "parameters"}`; a conversation without tools that
  makes tool calls gets one definition per called name (first-use order). Pass the whole conversation as
  `called_in` when converting its prefixes, so every prefix gets the same tools list;
- a conversation with no item before its first assistant message (a greeting, or a request made on the
  system prompt alone) gets a first user message "(start)", as bench/to_messages.py does: the input is
  never empty, and every prefix starts alike (a client's history only grows);
- `store: false`, and `model` as given (the chat run's model).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from bench.to_messages import NO_RESULT, START, called_names, fresh_id, text_of

MODEL = "gpt-5"
Item = dict[str, Any]
USER_SIDE = ("user", "system", "developer")
OUTPUT_PARTS = ("output_text", "refusal")
INPUT_PARTS = ("input_text", "input_image", "input_file", "input_audio")


# ------------------------------------------------------------------------------------------ converting

def input_parts(content: Any) -> list[Item]:
    """A chat user content as input parts (images by URL; other parts as JSON text)."""
    if not isinstance(content, list):
        return [{"type": "input_text", "text": text_of(content)}]
    parts: list[Item] = []
    for part in content:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind == "text":
            parts.append({"type": "input_text", "text": str(part.get("text") or "")})
        elif kind == "image_url":
            url = str((part.get("image_url") or {}).get("url") or "")
            parts.append({"type": "input_image", "image_url": url, "detail": "auto"})
        else:
            parts.append({"type": "input_text", "text": orjson.dumps(part).decode()})
    return parts or [{"type": "input_text", "text": ""}]


def message(role: str, parts: list[Item]) -> Item:
    return {"type": "message", "role": role, "content": parts}


def arguments_text(arguments: Any) -> str:
    if isinstance(arguments, str):
        return arguments
    return "{}" if arguments is None else orjson.dumps(arguments).decode()


def native_tools(tools: list[Any] | None, called_in: Iterable[dict[str, Any]] = ()) -> list[Item] | None:
    """Chat tools in Responses form; without tools, one bare definition per tool name called."""
    if tools:
        out = []
        for spec in tools:
            function = spec.get("function") if isinstance(spec, dict) else None
            if isinstance(function, dict) and function.get("name"):
                out.append({"type": "function", "name": function["name"],
                            "description": function.get("description") or "",
                            "parameters": function.get("parameters") or {"type": "object"}})
        return out or None
    return [{"type": "function", "name": n, "description": "", "parameters": {"type": "object"}}
            for n in called_names(called_in)] or None


class _Items:
    """Input items being built, with the calls still waiting for their output."""

    def __init__(self) -> None:
        self.items: list[Item] = []
        self.used: set[str] = set()  # call ids given out
        self.latest: dict[str, str] = {}  # chat id -> the native id of its latest call
        self.open: list[str] = []  # native ids of the last assistant message still waiting for an output

    def close(self) -> None:
        self.items += [{"type": "function_call_output", "call_id": i, "output": NO_RESULT} for i in self.open]
        self.open = []

    def assistant(self, chat: dict[str, Any]) -> None:
        text = text_of(chat.get("content"))
        calls = [c for c in chat.get("tool_calls") or () if isinstance(c, dict)]
        if not text and not calls:
            return
        self.close()
        if text:
            self.items.append(message("assistant", [{"type": "output_text", "text": text}]))
        for call in calls:
            function = call.get("function") or {}
            native = fresh_id(str(call.get("id") or "call"), self.used)
            self.latest[str(call.get("id"))] = native
            self.items.append({"type": "function_call", "call_id": native,
                               "name": str(function.get("name") or "tool"),
                               "arguments": arguments_text(function.get("arguments"))})
            self.open.append(native)

    def tool(self, chat: dict[str, Any]) -> None:
        chat_id = str(chat.get("tool_call_id"))
        native = self.latest.get(chat_id)
        content = text_of(chat.get("content"))
        if native is None or native not in self.open:  # answers no open call: plain text
            self.user("user", [{"type": "input_text", "text": f"[tool result {chat_id}] {content}"}])
            return
        self.open.remove(native)
        self.items.append({"type": "function_call_output", "call_id": native, "output": content})

    def user(self, role: str, parts: list[Item]) -> None:
        self.close()
        self.items.append(message(role, parts))


def to_responses(messages: list[dict[str, Any]], tools: list[Any] | None = None, *, model: str = MODEL,
                 called_in: Iterable[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The Responses request body for a chat conversation (see the module's docstring)."""
    start = 0
    system: list[str] = []
    while start < len(messages) and messages[start].get("role") in ("system", "developer"):
        system.append(text_of(messages[start].get("content")))
        start += 1
    items = _Items()
    for chat in messages[start:]:
        role = chat.get("role")
        if role == "assistant":
            items.assistant(chat)
        elif role == "tool":
            items.tool(chat)
        elif role in ("system", "developer"):
            items.user("developer", [{"type": "input_text", "text": text_of(chat.get("content"))}])
        else:
            items.user("user", input_parts(chat.get("content")))
    items.close()
    if not items.items or is_model_item(items.items[0]):  # as a client keeps it: an append-only history
        items.items.insert(0, message("user", [{"type": "input_text", "text": START}]))
    body: dict[str, Any] = {"model": model}
    if any(system):
        body["instructions"] = "\n\n".join(s for s in system if s)
    body["input"] = items.items
    defined = native_tools(tools, messages if called_in is None else called_in)
    if defined:
        body["tools"] = defined
    body["store"] = False
    return body


# ------------------------------------------------------------------------------------------ checking

def is_call(item: Item) -> bool:
    """A call the client must answer (function, custom and local shell calls; not server-side tools)."""
    kind = str(item.get("type"))
    return kind.endswith("_call") and "call_id" in item


def is_model_item(item: Any) -> bool:
    if not isinstance(item, dict):
        return False
    kind = item.get("type") or "message"
    if kind == "message":
        return item.get("role") == "assistant"
    return kind == "reasoning" or (kind.endswith("_call") and not kind.endswith("_output"))


def _message_violations(at: str, item: Item) -> list[str]:
    role, content = item.get("role"), item.get("content")
    if role not in ("assistant", *USER_SIDE):
        return [f"{at}: role {role!r}"]
    if isinstance(content, str):
        return []
    if not isinstance(content, list):
        return [f"{at}: content is neither a string nor a list of parts"]
    allowed = OUTPUT_PARTS if role == "assistant" else INPUT_PARTS
    found = []
    for number, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in allowed:
            found.append(f"{at}.content.{number}: part type {kind!r} in a {role} message")
        elif kind in ("input_text", "output_text") and not isinstance(part.get("text"), str):
            found.append(f"{at}.content.{number}: text is not a string")
    return found


def violations(body: dict[str, Any]) -> list[str]:
    """What the Responses API would reject in a stateless request `body`, one line each (empty: valid):
    every call (`function_call`, `custom_tool_call`, ...) has exactly one output of its kind after it and
    every output its call before it; call ids are unique, and so are item ids and tool names; a reasoning
    item is followed (past any further reasoning items) by the item it led to (an assistant message or a
    call); message roles and part types
    are the API's (input parts on the user side, output parts on the assistant's); `instructions` is a
    string."""
    found: list[str] = []
    if body.get("instructions") is not None and not isinstance(body["instructions"], str):
        found.append("instructions: not a string")
    source = body.get("input")
    if isinstance(source, str):
        return found
    if not isinstance(source, list) or not source:
        return [*found, "input: missing or empty"]
    calls: dict[str, str] = {}  # call id -> the output type that answers it
    answered: dict[str, int] = {}
    item_ids: set[str] = set()
    for index, item in enumerate(source):
        at = f"input.{index}"
        if not isinstance(item, dict):
            found.append(f"{at}: not an object")
            continue
        kind = item.get("type") or "message"
        if isinstance(item.get("id"), str):
            if item["id"] in item_ids:
                found.append(f"{at}: item id {item['id']} used twice")
            item_ids.add(item["id"])
        if kind == "message":
            found += _message_violations(at, item)
        elif kind == "reasoning":  # what follows it (past more reasoning) is the item it led to
            following = next((i for i in source[index + 1:]
                              if not (isinstance(i, dict) and i.get("type") == "reasoning")), None)
            if not is_model_item(following):
                found.append(f"{at}: reasoning item {item.get('id')} without the item it led to after it")
        elif is_call(item):
            call_id = str(item["call_id"])
            if call_id in calls:
                found.append(f"{at}: call_id {call_id} used twice")
            calls[call_id] = f"{kind}_output"
            if not isinstance(item.get("name"), str) and kind != "local_shell_call":
                found.append(f"{at}: {kind} without a name")
            if kind == "function_call" and not isinstance(item.get("arguments"), str):
                found.append(f"{at}: arguments is not a string")
        elif kind.endswith("_call_output"):
            call_id = str(item.get("call_id"))
            if calls.get(call_id) != kind:
                found.append(f"{at}: {kind} for {call_id}, which no earlier call of its kind made")
            elif answered.get(call_id):
                found.append(f"{at}: call {call_id} answered twice")
            answered[call_id] = answered.get(call_id, 0) + 1
            if not isinstance(item.get("output"), str | list):
                found.append(f"{at}: output is neither a string nor a list")
    missing = [c for c in calls if not answered.get(c)]
    if missing:
        found.append(f"calls {missing} have no output")
    names = [t.get("name") for t in body.get("tools") or () if isinstance(t, dict) and "name" in t]
    twice = sorted({str(n) for n in names if names.count(n) > 1})
    if twice:
        found.append(f"tools: names {twice} defined twice")
    for number, tool in enumerate(body.get("tools") or ()):
        if isinstance(tool, dict) and tool.get("type") == "function" \
                and not isinstance(tool.get("name"), str):
            found.append(f"tools.{number}: a function tool without a name")
    return found
