"""Reading an archived Anthropic Messages answer (a message object, or its event stream) into what the
archive keeps for every format: the assistant message in neutral form, usage mapped to the chat
columns (cache reads and writes apart), the id and the stop reason."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from proxy.archive_parse import NOT_JSON, ParsedResponse, integer, response_json
from proxy.sse import EventSplitter, event_data, plain_events
from proxy.wire.messages import block_text, neutral_call
from proxy.wire.messages_stream import MessagesRound, event_name

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


def events(chunks: list[bytes]) -> list[bytes]:
    """The stream's whole events, as EventSplitter splits them (what follows the last blank line is not
    one). A stream whose lines end in LF alone, as providers send them, is split in one call."""
    whole = b"".join(chunks)
    if b"\r" in whole:
        return EventSplitter().feed(whole)
    return whole.split(b"\n\n")[:-1]


def fields(event: bytes) -> tuple[str | None, bytes | None]:
    """`event_name` and `event_data` of one event; read by slicing when it is one `event:` line then one
    `data:` line (every event a provider sends), the rest line by line."""
    if event.startswith(b"event:"):
        cut = event.find(b"\n")
        if cut > 0 and event.startswith(b"data:", cut + 1) and event.find(b"\n", cut + 1) < 0 \
                and b"\r" not in event:
            return event[6:cut].strip().decode("utf-8", "replace"), event[cut + 6:].lstrip(b" ")
    return event_name(event), event_data(event)


def read_stream(chunks: list[bytes]) -> MessagesRound:
    """The stream's events, each fed to one round as the relay feeds them. A stream of plain events
    (every provider's) is split by one regular expression: ~1 µs an event where splitting each and
    reading its lines took ~2.3 (a Claude answer streams hundreds). The archive keeps the round's
    content, not what it would relay: the events' own bytes are not handed on."""
    round_ = MessagesRound(0, 0, lambda name: False)
    whole = b"".join(chunks)
    plain = plain_events(whole, named=True)
    if plain is None:
        for event in events([whole]):
            round_.feed_fields(event, *fields(event))
        return round_
    names: dict[bytes, str] = {}
    for name, data in plain[0]:
        if name not in names:
            names[name] = name.strip().decode("utf-8", "replace")
        round_.feed_fields(b"", names[name], data)
    return round_


def parse_messages_response(record: ExchangeRecord) -> ParsedResponse:
    if record.stream:
        return round_answer(read_stream(record.response_chunks))
    parsed = ParsedResponse()
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


def round_answer(round_: MessagesRound) -> ParsedResponse:
    """What the archive keeps of a streamed answer, from the round its events were fed to (the writer's
    own reading of the chunks, or the relay's, which saw the same events)."""
    parsed = ParsedResponse()
    if round_.malformed:
        parsed.problems.append(f"a stream event could not be read: {round_.malformed}")
    if round_.message_start is None:
        parsed.problems.append("the stream carried no message_start")
        return parsed
    message = round_.message_start.get("message")  # (not an object: named in `malformed` already)
    message_id = message.get("id") if isinstance(message, dict) else None
    parsed.response_id = message_id if isinstance(message_id, str) else None
    parsed.message, parsed.finish_reason = assistant(round_.blocks), round_.stop_reason
    if round_.usage:
        parsed.usage, parsed.raw_usage = neutral_usage(round_.usage), round_.usage
    return parsed
