"""OpenAI Responses request validation: the shapes the codec reads, each mistake a 400 naming the field
(OpenAI's error shape). Unknown item types and fields pass untouched: the provider judges them."""

from __future__ import annotations

from typing import Any, NoReturn

from proxy.errors import BadRequest
from proxy.validate import MAX_DEPTH, loads
from proxy.wire.resent import parsed, remember_checked
from proxy.wire.splice import Spans

_NAMES = {dict: "an object", list: "an array", str: "a string", int: "an integer", float: "a number",
          bool: "a boolean", type(None): "null"}


def _fail(param: str, message: str) -> NoReturn:
    raise BadRequest(message, param=param, code="invalid_value")


def _expect(param: str, value: Any, kind: type | tuple[type, ...], name: str) -> None:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        _fail(param, f"Invalid type for '{param}': expected {name}, but got "
                     f"{_NAMES.get(type(value), type(value).__name__)} instead.")


def validate_responses_request(raw: bytes) -> tuple[dict[str, Any], Spans | None]:
    """The body, checked, and where its input items lie in `raw` when that is known (wire/splice.py)."""
    body, known, resent = parsed(raw, "input", loads)  # (items up to `known`: checked before)
    if type(body) is not dict:
        raise BadRequest("request body must be a JSON object", code="invalid_json")
    for key, kind, name in (("model", str, "a string"), ("stream", bool, "a boolean"),
                            ("instructions", str, "a string"), ("metadata", dict, "an object"),
                            ("tools", list, "an array"), ("previous_response_id", str, "a string")):
        if body.get(key) is not None:
            _expect(key, body[key], kind, name)
    source = body.get("input")
    if source is None and not body.get("previous_response_id") and not body.get("conversation"):
        raise BadRequest("Missing required parameter: 'input'.", param="input",
                         code="missing_required_parameter")
    if source is not None and not isinstance(source, str):
        _expect("input", source, list, "a string or an array of input items")
        for index in range(known, len(source)):
            _check_item(source[index], f"input[{index}]")
    for index, tool in enumerate(body.get("tools") or []):
        _expect(f"tools[{index}]", tool, dict, "an object")
    _check_depth({**body, "input": source[known:]} if known and isinstance(source, list) else body)
    return body, remember_checked(raw, "input", body, resent)


def _check_item(item: Any, at: str) -> None:
    _expect(at, item, dict, "an object")
    kind = item.get("type", "message")
    _expect(f"{at}.type", kind, str, "a string")
    if kind == "message":
        _expect(f"{at}.role", item.get("role"), str, "a string")
        content = item.get("content")
        if not isinstance(content, str):
            _expect(f"{at}.content", content, list, "a string or an array of content parts")
            for number, part in enumerate(content):
                _expect(f"{at}.content[{number}]", part, dict, "an object")
                if "text" in part:
                    _expect(f"{at}.content[{number}].text", part["text"], str, "a string")
    elif kind in ("function_call", "custom_tool_call"):
        _expect(f"{at}.call_id", item.get("call_id"), str, "a string")
        _expect(f"{at}.name", item.get("name"), str, "a string")
        if kind == "function_call":
            _expect(f"{at}.arguments", item.get("arguments"), str, "a string")
    elif kind.endswith("_output") and kind != "message":
        _expect(f"{at}.call_id", item.get("call_id"), str, "a string")


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
