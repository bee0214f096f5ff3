"""The archive's reading of a streamed Anthropic Messages answer (wire/messages_archive.py): the same round
as the relay's reading, event by event through the SSE splitter, whatever the bytes."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.sse import EventSplitter
from proxy.wire.messages_archive import fields, read_stream
from proxy.wire.messages_stream import MessagesRound, event_name


def relayed(chunks: list[bytes]) -> MessagesRound:
    """The plain reading: chunk by chunk through the splitter, each event fed whole."""
    round_ = MessagesRound(0, 0, lambda name: False)
    splitter = EventSplitter()
    for chunk in chunks:
        for event in splitter.feed(chunk):
            round_.feed(event)
    return round_


def state(round_: MessagesRound) -> tuple[Any, ...]:
    return (round_.message_start, round_.blocks, round_.stop_reason, round_.usage, round_.done,
            round_.error, round_.malformed, round_.calls)


JSON = "input_json_delta"
PAYLOADS: list[dict[str, Any]] = [
    {"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 5, "output_tokens": 1}}},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hel"}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "lo\n\n"}},
    {"type": "content_block_stop", "index": 0},
    {"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "toolu_1",
                                                                   "name": "bash", "input": {}}},
    {"type": "content_block_delta", "index": 1, "delta": {"type": JSON, "partial_json": '{"'}},
    {"type": "content_block_delta", "index": 1, "delta": {"type": JSON, "partial_json": 'c":1}'}},
    {"type": "content_block_stop", "index": 1},
    {"type": "content_block_start", "index": 2, "content_block": {"type": "thinking", "thinking": 5}},
    {"type": "content_block_delta", "index": 2, "delta": {"type": "thinking_delta", "thinking": "hm"}},
    {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}},
    {"type": "message_stop"},
    {"type": "ping"},
    {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}},
]
# events as providers send them, and odd ones: unnamed, comments, data over two lines, not JSON, not objects
ODD = [b": keep-alive", b"data: {\"type\": \"ping\"}", b"event: ping\ndata: {\"type\":\ndata: \"ping\"}",
       b"event: message_delta\ndata: {not json", b"event: x\ndata: [1, 2]", b"event: error\ndata: {}",
       b"retry: 10", b"", b"event:content_block_delta\ndata:{\"type\":\"content_block_delta\",\"index\":7}"]


def named(payload: dict[str, Any]) -> bytes:
    return b"event: " + payload["type"].encode() + b"\ndata: " + orjson.dumps(payload)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(PAYLOADS).map(named), st.sampled_from(ODD)), max_size=24),
       st.sampled_from([b"\n", b"\r\n", b"\r"]), st.booleans(), st.lists(st.integers(1, 60), min_size=1),
       st.one_of(st.binary(max_size=12), st.sampled_from(PAYLOADS).map(named)))
def test_the_archive_reads_a_stream_as_the_relay_does(events: list[bytes], newline: bytes, mixed: bool,
                                                      cuts: list[int], tail: bytes) -> None:
    lines = [event.replace(b"\n", newline) if not mixed or n % 2 else event for n, event in enumerate(events)]
    whole = b"".join(line + newline * 2 for line in lines) + tail  # (a tail: bytes, or an event, unfinished)
    chunks, at = [], 0
    while at < len(whole):  # (cut at arbitrary places, as network reads are)
        size = cuts[len(chunks) % len(cuts)]
        chunks.append(whole[at:at + size])
        at += size
    assert state(read_stream(chunks)) == state(relayed(chunks))


def test_a_provider_event_is_read_by_slicing_as_line_by_line() -> None:
    for payload in PAYLOADS:
        event = named(payload)
        assert fields(event) == (event_name(event), orjson.dumps(payload))
    assert fields(b"event: ping\ndata:   {}") == ("ping", b"{}")
    assert fields(b"event: a\nevent: b\ndata: {}") == ("a", b"{}")  # (line by line: the first name)
