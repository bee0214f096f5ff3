"""Chat request parsing and validation: every client mistake becomes an OpenAI-shaped 400 naming the field.

Only what the proxy itself interprets is checked — the shapes the layers, the token counter, the session
resolver, slash commands and the archive rely on. Unknown fields and unknown content part types pass
untouched, so new API features work through the proxy before it knows about them.

One pass over the messages, no models: this runs on every request and a resent history can be megabytes.
Nesting is bounded (MAX_DEPTH) because the proxy re-serializes requests with orjson, which refuses more
than 254 levels: a deeper request would parse, then fail half-way through (rewrite, archive).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, NoReturn

import orjson

from proxy.errors import BadRequest
from proxy.shallow_json import nested_deeper
from proxy.wire.resent import checked_keys, parsed, remember_checked
from proxy.wire.splice import Spans

MAX_DEPTH = 128  # containers, the body itself being level 1 (orjson.dumps refuses level 255)
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_TYPE_NAMES = {dict: "an object", list: "an array", str: "a string", int: "an integer", float: "a number",
               bool: "a boolean", type(None): "null"}


def parse_chat_request(raw: bytes) -> dict[str, Any]:
    """The request body as a dict whose messages/tools have the shapes the proxy relies on, or BadRequest.
    A resent history is parsed and checked only past the messages an earlier body had (resent.py)."""
    return parse_chat_body(raw)[0]


def parse_chat_body(raw: bytes) -> tuple[dict[str, Any], Spans | None]:
    """`parse_chat_request`, and where its messages lie in `raw` when that is known (a large body)."""
    body, known, resent = parsed(raw, "messages", loads)
    if type(body) is not dict:
        raise BadRequest("request body must be a JSON object", code="invalid_json")
    validate_chat_request(body, start=known, checked=checked_keys(resent))
    return body, remember_checked(raw, "messages", body, resent)


# ---------------------------------------------------------------------------------------------- parsing

class _OutOfRange(ValueError):
    pass


def _parse_int(text: str) -> int | float:
    value = int(text)  # a ValueError past 4300 digits (the interpreter's own limit)
    if -(2**63) <= value < 2**64:
        return value
    try:  # as orjson does: an integer beyond 64 bits becomes a float, so it can be serialized again
        return float(value)
    except OverflowError:
        raise _OutOfRange(f"number {text[:20]}… is out of range") from None


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _OutOfRange(f"number {text[:40]} is out of range")
    return value


def _parse_constant(name: str) -> NoReturn:
    raise _OutOfRange(f"{name} is not a JSON value")


def loads(raw: bytes) -> Any:
    """orjson, then the stdlib for what orjson refuses without saying where (lone surrogates) — so the 400
    can name the field. Deep nesting and every parse failure is a 400, never an exception."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        # Past orjson's depth limit the stdlib would recurse ~1,000 frames deep, where a finalizer the
        # garbage collector runs cannot run (an "exception ignored"): refused here.
        if str(exc).startswith("depth limit exceeded") or nested_deeper(raw, MAX_DEPTH):
            # (orjson may stop at another mistake first: a body nested past the limit is refused anyway,
            # and the stdlib is never sent down ~1,000 levels)
            raise BadRequest(f"request body is nested too deeply (more than {MAX_DEPTH} levels)",
                             code="invalid_json") from None
    try:
        # surrogatepass: UTF-8-encoded surrogates decode to lone surrogates, which the walk below names.
        text = bytes(raw).decode("utf-8", "surrogatepass")
        value = json.loads(text, parse_int=_parse_int, parse_float=_parse_float,
                           parse_constant=_parse_constant)
    except RecursionError:
        raise BadRequest(f"request body is nested too deeply (more than {MAX_DEPTH} levels)",
                         code="invalid_json") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, numbers out of range
        raise BadRequest(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    _reject_lone_surrogates(value)
    return value


def _reject_lone_surrogates(value: Any) -> None:
    """orjson never yields lone surrogates; the stdlib does (from "\\ud800" escapes). They cannot be encoded
    as UTF-8, so neither forwarded nor archived: name the first one's field."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        node, at = stack.pop()
        if type(node) is str:
            if _LONE_SURROGATE.search(node):
                _fail(at or "body", f"'{at or 'body'}' holds a lone Unicode surrogate (an unpaired \\ud800-"
                      "\\udfff escape), which is not valid text", code="invalid_unicode")
        elif type(node) is dict:
            for key, item in reversed(node.items()):
                if _LONE_SURROGATE.search(key):
                    _fail(at or "body", f"an object key in '{at or 'body'}' holds a lone Unicode surrogate",
                          code="invalid_unicode")
                stack.append((item, f"{at}.{key}" if at else key))
        elif type(node) is list:
            stack.extend((item, f"{at}[{index}]") for index, item in reversed(list(enumerate(node))))


# -------------------------------------------------------------------------------------------- validation

def _kind(value: Any) -> str:
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def _fail(param: str, message: str, code: str) -> NoReturn:
    raise BadRequest(message, param=param, code=code)


def _wrong_type(param: str, expected: str, value: Any, code: str = "invalid_type") -> NoReturn:
    _fail(param, f"Invalid type for '{param}': expected {expected}, but got {_kind(value)} instead.", code)


def _missing(param: str, code: str) -> NoReturn:
    _fail(param, f"Missing required parameter: '{param}'.", code)


def _not_a_string(param: str, value: Any) -> NoReturn:
    """A required string field of a message: missing, or of another type."""
    if value is None:
        _missing(param, _CODE)
    _wrong_type(param, "a string", value, code=_CODE)


def _optional_string(param: str, value: Any) -> None:
    """An optional string field of a message: absent (null) or a string."""
    if value is not None and type(value) is not str:
        _wrong_type(param, "a string", value, code=_CODE)


def _too_deep(value: Any, level: int) -> bool:
    """Whether `value`, a container at nesting `level`, holds containers deeper than MAX_DEPTH."""
    stack = [(value, level)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            return True
        for item in node.values() if type(node) is dict else node:
            kind = type(item)
            if kind is dict or kind is list:
                stack.append((item, depth + 1))
    return False


def _check_depth(value: Any, level: int, param: str) -> None:
    kind = type(value)
    if (kind is dict or kind is list) and _too_deep(value, level):
        _fail(param, f"'{param}' is nested more than {MAX_DEPTH} levels deep", code="nesting_too_deep")


def validate_chat_request(body: dict[str, Any], start: int = 0,
                          checked: frozenset[str] = frozenset()) -> None:
    """Raise BadRequest (param = the exact field) for the first shape the proxy cannot work with.
    Messages before `start` and the values of the keys in `checked` passed these checks in an earlier
    request (the same bytes, the very objects)."""
    messages = body.get("messages")
    if type(messages) is not list or not messages:
        raise BadRequest("'messages' is required and must be a non-empty array", param="messages",
                         code="missing_messages")
    for index in range(start, len(messages)):
        _check_message(messages[index], index)
    for key, value in body.items():
        if key == "messages" or key in checked:
            continue
        if value is not None:
            checker = _TOP_LEVEL.get(key)
            if checker is not None:
                checker(value)
        _check_depth(value, 2, key)


def _check_model(value: Any) -> None:
    if type(value) is not str:
        _wrong_type("model", "a string", value)


def _check_stream(value: Any) -> None:
    if type(value) is not bool:
        _wrong_type("stream", "a boolean", value)


def _check_metadata(value: Any) -> None:
    if type(value) is not dict:
        _wrong_type("metadata", "an object", value)


def _check_tools(value: Any) -> None:
    if type(value) is not list:
        _wrong_type("tools", "an array", value, code="invalid_tools")
    for index, tool in enumerate(value):
        if type(tool) is not dict:
            _wrong_type(f"tools[{index}]", "an object", tool, code="invalid_tools")


_TOP_LEVEL = {"model": _check_model, "stream": _check_stream, "metadata": _check_metadata,
              "tools": _check_tools}

# Message fields looked at below; the depth of every other field is checked generically.
_MESSAGE_FIELDS = frozenset({"role", "content", "tool_calls", "tool_call_id", "name"})
_CODE = "invalid_message"
_ABSENT = object()


def _check_message(message: Any, index: int) -> None:
    if type(message) is not dict:
        _wrong_type(f"messages[{index}]", "an object", message, code=_CODE)
    role = message.get("role")
    if type(role) is not str:
        _not_a_string(f"messages[{index}].role", role)
    content = message.get("content")
    if content is not None and type(content) is not str:
        if type(content) is not list:
            _wrong_type(f"messages[{index}].content", "a string, an array of content parts or null", content,
                        code=_CODE)
        for number, part in enumerate(content):
            if type(part) is not dict:
                _wrong_type(f"messages[{index}].content[{number}]", "an object", part, code=_CODE)
            _check_part(part, index, number)
    calls = message.get("tool_calls")
    if calls is not None:
        if type(calls) is not list:
            _wrong_type(f"messages[{index}].tool_calls", "an array", calls, code=_CODE)
        for number, call in enumerate(calls):
            _check_call(call, index, number)
    if role == "tool":
        call_id = message.get("tool_call_id")
        if type(call_id) is not str:
            _not_a_string(f"messages[{index}].tool_call_id", call_id)
    if (name := message.get("name")) is not None:  # (the parameter's name is made only when needed)
        _optional_string(f"messages[{index}].name", name)
    if len(message) > 2 or (len(message) == 2 and "content" not in message):
        for key, value in message.items():
            kind = type(value)
            if (kind is dict or kind is list) and key not in _MESSAGE_FIELDS:
                _check_depth(value, 4, f"messages[{index}].{key}")
        if type(call_id := message.get("tool_call_id")) in (dict, list):
            _check_depth(call_id, 4, f"messages[{index}].tool_call_id")


def _check_part(part: dict[str, Any], index: int, number: int) -> None:
    text = part.get("text", _ABSENT)
    if text is _ABSENT:
        if part.get("type") == "text":
            _missing(f"messages[{index}].content[{number}].text", _CODE)
    elif type(text) is not str:
        _wrong_type(f"messages[{index}].content[{number}].text", "a string", text, code=_CODE)
    _optional_string(f"messages[{index}].content[{number}].type", part.get("type"))
    for key, value in part.items():  # image_url, input_audio, file, cache_control, ...
        _check_depth(value, 6, f"messages[{index}].content[{number}].{key}")


def _check_call(call: Any, index: int, number: int) -> None:
    at = f"messages[{index}].tool_calls[{number}]"
    if type(call) is not dict:
        _wrong_type(at, "an object", call, code=_CODE)
    call_id = call.get("id")
    if type(call_id) is not str:
        _not_a_string(f"{at}.id", call_id)
    kind = call.get("type")
    _optional_string(f"{at}.type", kind)
    function = call.get("function")
    if function is None and kind not in (None, "function"):
        pass  # another kind of call (e.g. "custom"): the proxy only reads function calls
    elif type(function) is not dict:
        if function is None:
            _missing(f"{at}.function", _CODE)
        _wrong_type(f"{at}.function", "an object", function, code=_CODE)
    else:
        for field in ("name", "arguments"):
            value = function.get(field)
            if type(value) is not str:
                _not_a_string(f"{at}.function.{field}", value)
        if len(function) > 2:
            for key, value in function.items():
                _check_depth(value, 7, f"{at}.function.{key}")
    for key, value in call.items():
        if key != "function":
            _check_depth(value, 6, f"{at}.{key}")
