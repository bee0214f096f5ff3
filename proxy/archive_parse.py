"""Reading an archived exchange's upstream answer, whatever shape it came in (JSON body or SSE stream):
the message, usage, id and finish reason that can be read, plus a named problem for each part that
cannot, so the writer can keep the raw bytes next to what it understood."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from proxy.archive_codec import loads
from proxy.sse import assemble

if TYPE_CHECKING:
    from proxy.archive import ExchangeRecord


@dataclass
class ParsedResponse:
    message: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    response_id: str | None = None
    finish_reason: str | None = None
    problems: list[str] = field(default_factory=list)
    raw_usage: dict[str, Any] | None = None  # the provider's own usage object when `usage` is a mapping


def integer(value: Any, default: int | None = None) -> int | None:
    """`value` if it is an int (not a bool), else `default`."""
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def raw_response(record: ExchangeRecord) -> bytes:
    """The upstream answer's bytes as received: the stream's chunks joined, or the body."""
    if record.stream and record.response_chunks:
        return b"".join(record.response_chunks)
    return bytes(record.response_body or b"")


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


NOT_JSON = object()


def response_json(record: ExchangeRecord, parsed: ParsedResponse) -> Any:
    """A non-streamed answer's JSON, or NOT_JSON with the problem named in `parsed`."""
    raw = record.response_body or b""
    try:
        return loads(raw)
    except ValueError as exc:
        parsed.problems.append(f"the response body ({len(raw)} bytes) is not JSON: {exc}")
        return NOT_JSON


def parse_response(record: ExchangeRecord) -> ParsedResponse:
    """The answer of a 2xx exchange, whatever shape it came in: what can be read, plus what could not."""
    if record.route == "messages":
        from proxy.wire.messages_archive import parse_messages_response

        return parse_messages_response(record)
    if record.route == "responses":
        from proxy.wire.responses_archive import parse_responses_response

        return parse_responses_response(record)
    if record.stream:
        folded = assemble(record.response_chunks)
        parsed = ParsedResponse(usage=folded.usage, response_id=folded.response_id,
                                finish_reason=folded.finish_reason, problems=list(folded.problems))
        if folded.chunks:
            parsed.message = folded.message()
        elif not parsed.problems:
            parsed.problems.append("the stream carried no chat-completion chunk")
        _check_usage(parsed)
        return parsed
    parsed = ParsedResponse()
    body = response_json(record, parsed)
    if body is NOT_JSON:
        return parsed
    if not isinstance(body, dict):
        parsed.problems.append(f"the response JSON is {_kind(body)}, not an object")
        return parsed
    if isinstance(body.get("id"), str):
        parsed.response_id = body["id"]
    elif body.get("id") is not None:
        parsed.problems.append(f"id is {_kind(body['id'])}, not a string")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        parsed.problems.append("choices is missing" if choices is None else
                               "choices is empty" if choices == [] else f"choices is {_kind(choices)}")
    elif not isinstance(choices[0], dict):
        parsed.problems.append(f"choices[0] is {_kind(choices[0])}, not an object")
    else:
        first = choices[0]
        message = first.get("message")
        if isinstance(message, dict):
            parsed.message = message
        else:
            parsed.problems.append(f"choices[0].message is {_kind(message)}, not an object")
        finish = first.get("finish_reason")
        if isinstance(finish, str):
            parsed.finish_reason = finish
        elif finish is not None:
            parsed.problems.append(f"choices[0].finish_reason is {_kind(finish)}")
    usage = body.get("usage")
    if isinstance(usage, dict):
        parsed.usage = usage
    elif usage is not None:
        parsed.problems.append(f"usage is {_kind(usage)}, not an object")
    _check_usage(parsed)
    return parsed


def _check_usage(parsed: ParsedResponse) -> None:
    usage = parsed.usage
    if not usage:
        return
    if not isinstance(usage, dict):
        parsed.problems.append(f"usage is {_kind(usage)}, not an object")
        parsed.usage = None
        return
    for name in ("prompt_tokens", "completion_tokens"):
        if usage.get(name) is not None and integer(usage.get(name)) is None:
            parsed.problems.append(f"usage.{name} is {_kind(usage[name])}, not an integer")
    details = usage.get("prompt_tokens_details")
    if details is not None and not isinstance(details, dict):
        parsed.problems.append(f"usage.prompt_tokens_details is {_kind(details)}, not an object")
    elif isinstance(details, dict) and details.get("cached_tokens") is not None \
            and integer(details.get("cached_tokens")) is None:
        parsed.problems.append("usage.prompt_tokens_details.cached_tokens is "
                               f"{_kind(details['cached_tokens'])}")
