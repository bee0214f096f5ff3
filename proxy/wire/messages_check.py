"""Anthropic Messages request validation: every shape the codec reads, checked once, each mistake a 400
naming the field (rendered in Anthropic's error shape by the routes). Unknown fields and block types pass
untouched: the provider judges them."""

from __future__ import annotations

from typing import Any, NoReturn

from proxy.errors import BadRequest
from proxy.validate import MAX_DEPTH, loads
from proxy.wire.resent import checked_keys, parsed, remember_checked
from proxy.wire.splice import Spans

_NAMES = {dict: "an object", list: "an array", str: "a string", int: "an integer", float: "a number",
          bool: "a boolean", type(None): "null"}
ROLES = ("user", "assistant")
SCOPE = "anthropic"  # resent bodies checked here (wire/resent.py), apart from chat's, whose key is the same


def _fail(param: str, message: str) -> NoReturn:
    raise BadRequest(f"{param}: {message}", param=param, code="invalid_request")


def _expect(param: str, value: Any, kind: type, name: str) -> None:
    if type(value) is not kind:
        _fail(param, f"expected {name}, got {_NAMES.get(type(value), type(value).__name__)}")


def validate_messages_request(raw: bytes) -> tuple[dict[str, Any], Spans | None]:
    """The body, checked, and where its messages lie in `raw` when that is known (wire/splice.py)."""
    # (items up to `known`: checked before, by these checks: chat's bodies are another scope)
    body, known, resent = parsed(raw, "messages", loads, SCOPE)
    if type(body) is not dict:
        raise BadRequest("request body must be a JSON object", code="invalid_json")
    if "model" in body:
        _expect("model", body["model"], str, "a string")
    if body.get("stream") is not None:
        _expect("stream", body["stream"], bool, "a boolean")
    if body.get("metadata") is not None:
        _expect("metadata", body["metadata"], dict, "an object")
    system = body.get("system")
    if system is not None and type(system) is not str:
        _expect("system", system, list, "a string or an array of text blocks")
        for index, block in enumerate(system):
            _expect(f"system.{index}", block, dict, "a text block")
            _expect(f"system.{index}.text", block.get("text"), str, "a string")
    tools = body.get("tools")
    if tools is not None:
        _expect("tools", tools, list, "an array")
        for index, tool in enumerate(tools):
            _expect(f"tools.{index}", tool, dict, "an object")
    messages = body.get("messages")
    if type(messages) is not list or not messages:
        raise BadRequest("messages: field required (a non-empty array)", param="messages",
                         code="missing_messages")
    for index in range(known, len(messages)):
        _check_message(messages[index], f"messages.{index}")
    same = checked_keys(resent)  # (Claude Code's system prompt and tools, resent every turn: checked then)
    _check_depth({**{k: v for k, v in body.items() if k not in same}, "messages": messages[known:]}
                 if known else body)
    return body, remember_checked(raw, "messages", body, resent, SCOPE)


def _check_message(message: Any, at: str) -> None:
    _expect(at, message, dict, "an object")
    if message.get("role") not in ROLES:
        _fail(f"{at}.role", f"must be one of {', '.join(ROLES)}")
    content = message.get("content")
    if type(content) is str:
        return
    _expect(f"{at}.content", content, list, "a string or an array of content blocks")
    for number, block in enumerate(content):
        where = f"{at}.content.{number}"
        _expect(where, block, dict, "a content block")
        _expect(f"{where}.type", block.get("type"), str, "a string")
        kind = block["type"]
        if kind == "text":
            _expect(f"{where}.text", block.get("text"), str, "a string")
        elif kind == "tool_use":
            _expect(f"{where}.id", block.get("id"), str, "a string")
            _expect(f"{where}.name", block.get("name"), str, "a string")
        elif kind == "tool_result":
            _expect(f"{where}.tool_use_id", block.get("tool_use_id"), str, "a string")
            inner = block.get("content")
            if inner is not None and type(inner) is not str:
                _expect(f"{where}.content", inner, list, "a string or an array of content blocks")
                for part_number, part in enumerate(inner):
                    _expect(f"{where}.content.{part_number}", part, dict, "a content block")
                    if part.get("type") == "text":
                        _expect(f"{where}.content.{part_number}.text", part.get("text"), str, "a string")


def _check_depth(body: dict[str, Any]) -> None:
    stack: list[tuple[Any, int]] = [(body, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise BadRequest(f"request body is nested more than {MAX_DEPTH} levels deep",
                             code="nesting_too_deep")
        for item in node.values() if type(node) is dict else node:
            if type(item) in (dict, list):
                stack.append((item, depth + 1))
