"""Every reader of an upstream answer takes events and bodies of any JSON shape without raising: the relay's
rounds on each route (proxy/round_stream.py, wire/messages_stream.py, wire/responses_stream.py) and the
archive's readers (proxy/archive_parse.py). A reader that raised broke a stream mid-answer, or kept its
exchange out of the archive (a message_start whose message was a list once did)."""

from __future__ import annotations

import os
from typing import Any

import orjson
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from proxy.archive_parse import parse_response
from proxy.round_stream import RoundState, _event
from proxy.sse import assemble
from proxy.wire.messages_stream import MessagesRound
from proxy.wire.messages_stream import final_events as messages_end
from proxy.wire.responses_stream import ResponsesRound

EXAMPLES = int(os.environ.get("CTXPROXY_FUZZ_EXAMPLES", "300"))
SEED = int(os.environ.get("CTXPROXY_FUZZ_SEED") or 0)
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))

KEYS = ["type", "index", "text", "thinking", "delta", "content_block", "partial_json", "citation",
        "citations", "id", "name", "input", "usage", "message", "stop_reason", "signature", "error",
        "output", "status", "item", "output_index", "call_id", "arguments", "response", "content", "role",
        "choices", "tool_calls", "function", "finish_reason"]
WORDS = ["", "x", "tool_use", "text", "text_delta", "input_json_delta", "thinking_delta", "citations_delta",
         "signature_delta", "function_call", "message", "output_text", "completed", "{", "{}", "[1]"]
scalars = st.none() | st.booleans() | st.integers(-2, 3) | st.floats(allow_nan=False) | st.sampled_from(WORDS)
values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS), inner,
                                                                         max_size=4),
    max_leaves=14)


def typed(kinds: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(lambda kind, rest: {**rest, "type": kind}, st.sampled_from(kinds),
                     st.dictionaries(st.sampled_from(KEYS), values, max_size=4))


MESSAGES = typed(["message_start", "content_block_start", "content_block_delta", "content_block_stop",
                  "message_delta", "message_stop", "ping", "error", "something_new"])
RESPONSES = typed(["response.created", "response.output_item.added", "response.output_item.done",
                   "response.output_text.delta", "response.function_call_arguments.delta",
                   "response.function_call_arguments.done", "response.content_part.added",
                   "response.completed", "response.incomplete", "response.failed", "error", "something.new"])
DELTAS = st.dictionaries(st.sampled_from(["content", "tool_calls", "role", "refusal"]), values, max_size=3)
CHAT = st.dictionaries(st.sampled_from(["id", "choices", "usage", "model", "error"]), values, max_size=3) \
    | st.builds(lambda delta: {"choices": [{"index": 0, "delta": delta}]}, DELTAS)


def named(event: dict[str, Any]) -> bytes:
    return b"event: " + str(event["type"]).encode() + b"\ndata: " + orjson.dumps(event)


class Answer:
    """The fields of an exchange record the archive's readers look at."""

    def __init__(self, route: str, events: list[bytes] | None = None, body: bytes = b"") -> None:
        self.route, self.stream, self.response_body = route, events is not None, body
        self.response_chunks = [b"".join(e + b"\n\n" for e in events)] if events is not None else []


@seed(SEED)
@FUZZ
@given(st.lists(MESSAGES, max_size=12))
def test_messages_events_of_any_shape(events: list[dict[str, Any]]) -> None:
    raw = [named(event) for event in events]
    round_ = MessagesRound(0, 0, lambda name: name == "x")
    for event in raw:
        round_.feed(event)
    assert isinstance(round_.text, str)
    round_.release([c["id"] for c in round_.calls if isinstance(c["id"], str)], 0)
    messages_end(round_.stop_reason, round_.usage, round_.delta_template)
    parse_response(Answer("messages", raw))  # type: ignore[arg-type]


@seed(SEED)
@FUZZ
@given(st.lists(RESPONSES, max_size=12))
def test_responses_events_of_any_shape(events: list[dict[str, Any]]) -> None:
    raw = [named(event) for event in events]
    round_ = ResponsesRound(0, 0, lambda name: name == "x")
    for event in raw:
        round_.feed(event)
    assert isinstance(round_.text, str)
    round_.items, round_.sent_items  # noqa: B018 (read: they assemble)
    round_.release([c["call_id"] for c in round_.calls if isinstance(c.get("call_id"), str)], 0)
    parse_response(Answer("responses", raw))  # type: ignore[arg-type]  # (final_response: its last event)


@seed(SEED)
@FUZZ
@given(st.lists(CHAT, max_size=10))
def test_chat_chunks_of_any_shape(chunks: list[dict[str, Any]]) -> None:
    raw = [b"data: " + orjson.dumps(chunk) for chunk in chunks]
    state = RoundState()
    for event in raw:
        _event(event, state, 1, "chatcmpl-first")
    assemble([b"\n\n".join(raw) + b"\n\n"]).message()
    parse_response(Answer("chat/completions", raw))  # type: ignore[arg-type]


@seed(SEED)
@FUZZ
@given(st.dictionaries(st.sampled_from(KEYS), values | st.lists(st.dictionaries(st.sampled_from(KEYS), values,
                                                                                 max_size=4), max_size=3),
                       max_size=5),
       st.sampled_from(["messages", "responses", "chat/completions"]))
def test_bodies_of_any_shape(body: dict[str, Any], route: str) -> None:
    parse_response(Answer(route, body=orjson.dumps(body)))  # type: ignore[arg-type]
