"""Reading an archived Responses answer (a response object, or the stream whose last response.completed
carries it) into what the archive keeps for every format: the assistant message in neutral form, usage in
the chat columns (cached input apart), the id and the status."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from proxy.archive_codec import loads
from proxy.archive_parse import NOT_JSON, ParsedResponse, integer, response_json
from proxy.sse import iter_data
from proxy.wire.responses import neutral_call, text_of

if TYPE_CHECKING:
    from proxy.archive import ExchangeRecord


def neutral_usage(usage: dict[str, Any]) -> dict[str, Any]:
    details = usage.get("input_tokens_details")
    details = details if isinstance(details, dict) else {}
    return {"prompt_tokens": integer(usage.get("input_tokens")),
            "completion_tokens": integer(usage.get("output_tokens")),
            "prompt_tokens_details": {"cached_tokens": integer(details.get("cached_tokens")),
                                      "cache_write_tokens": integer(details.get("cache_write_tokens"))}}


def assistant(items: list[Any]) -> dict[str, Any]:
    output = [i for i in items if isinstance(i, dict)]
    text = "\n".join(text_of(i.get("content")) for i in output if i.get("type") == "message")
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    calls = [c for c in (neutral_call(i) for i in output) if c is not None]
    if calls:
        message["tool_calls"] = calls
    return message


_FINAL = ("response.completed", "response.incomplete", "response.failed")
_FINAL_BYTES = tuple(kind.encode() for kind in _FINAL)
_BLANK_LINES = (b"\n\n", b"\r\r", b"\r\n\r\n")  # where an event ends (whatever else ends one is found later)


def final_response(chunks: list[bytes]) -> dict[str, Any] | None:
    """The response object of the stream's last response.completed / incomplete / failed event. The
    stream is searched from its end for those names, and only the events from the blank line before a
    find on are split and parsed (a stream's deltas are most of its events)."""
    whole = b"".join(chunks)
    blank_lines = _BLANK_LINES if b"\r" in whole else _BLANK_LINES[:1]
    end = len(whole)
    while end > 0:
        found = -1
        for kind in _FINAL_BYTES:  # the last of any: a later name is looked for only past an earlier find
            found = max(found, whole.rfind(kind, found + 1, end))
        if found < 0:
            return None
        start = max(0, *(whole.rfind(blank, 0, found) for blank in blank_lines))
        for data in reversed(list(iter_data([whole[start:end]]))):
            if not any(kind in data for kind in _FINAL_BYTES):
                continue
            try:
                event = loads(data)
            except ValueError:
                continue
            if isinstance(event, dict) and isinstance(event.get("response"), dict) and str(
                    event.get("type")) in _FINAL:
                return event["response"]
        end = start
    return None


def parse_responses_response(record: ExchangeRecord) -> ParsedResponse:
    parsed = ParsedResponse()
    if record.stream:
        body = final_response(record.response_chunks)
        if body is None:
            parsed.problems.append("the stream carried no response.completed")
            return parsed
    else:
        body = response_json(record, parsed)
        if body is NOT_JSON:
            return parsed
    return response_answer(body, parsed)


def response_answer(body: Any, parsed: ParsedResponse | None = None) -> ParsedResponse:
    """What the archive keeps of a response object (the stream's final one, or the body)."""
    parsed = parsed if parsed is not None else ParsedResponse()
    if not isinstance(body, dict) or not isinstance(body.get("output"), list):
        parsed.problems.append("the response is not a response object with an output list")
        return parsed
    parsed.response_id = body.get("id") if isinstance(body.get("id"), str) else None
    parsed.finish_reason = body.get("status") if isinstance(body.get("status"), str) else None
    parsed.message = assistant(body["output"])
    if isinstance(body.get("usage"), dict):
        parsed.usage, parsed.raw_usage = neutral_usage(body["usage"]), body["usage"]
    return parsed
