"""Reading an archived Anthropic Messages answer (a message object, or its event stream) into what the
archive keeps for every format: the assistant message in neutral form, usage mapped to the chat
columns (cache reads and writes apart), the id and the stop reason."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from proxy.archive_parse import NOT_JSON, ParsedResponse, integer, response_json
from proxy.sse import EventSplitter
from proxy.wire.messages import block_text, neutral_call
from proxy.wire.messages_stream import MessagesRound

if TYPE_CHECKING:
    from proxy.archive import ExchangeRecord


def neutral_usage(usage: dict[str, Any]) -> dict[str, Any]:
    """Anthropic's usage as the chat columns read it: prompt tokens are all input, cached or not."""
    fresh = integer(usage.get("input_tokens"), 0) or 0
    read = integer(usage.get("cache_read_input_tokens"), 0) or 0
    written = integer(usage.get("cache_creation_input_tokens"), 0) or 0
    return {"prompt_tokens": fresh + read + written, "completion_tokens": integer(usage.get("output_tokens")),
            "prompt_tokens_details": {"cached_tokens": read, "cache_write_tokens": written}}


def assistant(blocks: list[Any]) -> dict[str, Any]:
    content = [b for b in blocks if isinstance(b, dict)]
    message: dict[str, Any] = {"role": "assistant",
                               "content": block_text([b for b in content if b.get("type") == "text"]) or None}
    calls = [neutral_call(b) for b in content if b.get("type") == "tool_use"]
    if calls:
        message["tool_calls"] = calls
    return message


def parse_messages_response(record: ExchangeRecord) -> ParsedResponse:
    parsed = ParsedResponse()
    if record.stream:
        round_ = MessagesRound(0, 0, lambda name: False)
        splitter = EventSplitter()
        for chunk in record.response_chunks:
            for event in splitter.feed(chunk):
                round_.feed(event)
        if round_.malformed:
            parsed.problems.append(f"a stream event could not be read: {round_.malformed}")
        if round_.message_start is None:
            parsed.problems.append("the stream carried no message_start")
            return parsed
        message = round_.message_start.get("message") or {}
        parsed.response_id = message.get("id") if isinstance(message.get("id"), str) else None
        parsed.message, parsed.finish_reason = assistant(round_.blocks), round_.stop_reason
        usage = round_.usage
    else:
        body = response_json(record, parsed)
        if body is NOT_JSON:
            return parsed
        if not isinstance(body, dict) or not isinstance(body.get("content"), list):
            parsed.problems.append("the response is not a message object with a content list")
            return parsed
        parsed.response_id = body.get("id") if isinstance(body.get("id"), str) else None
        parsed.finish_reason = body.get("stop_reason") if isinstance(body.get("stop_reason"), str) else None
        parsed.message = assistant(body["content"])
        usage = body.get("usage") if isinstance(body.get("usage"), dict) else None
    if usage:
        parsed.usage, parsed.raw_usage = neutral_usage(usage), usage
    return parsed
