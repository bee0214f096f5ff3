"""Anthropic Messages streaming rounds: content relayed as it comes, tool_use held, indexes renumbered."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.sse import EventSplitter, event_data
from proxy.wire.messages_stream import MessagesRound, add_usage, error_event, final_events, is_whole

INTERNAL = frozenset({"read_tool_result", "recall"})


def is_internal(name: str) -> bool:
    return name in INTERNAL


def ev(obj: dict[str, Any]) -> bytes:
    """One upstream event as EventSplitter yields it (no trailing blank line)."""
    return b"event: " + obj["type"].encode() + b"\ndata: " + orjson.dumps(obj)


def pieces(text: str, n: int) -> list[str]:
    size = max(1, -(-len(text) // max(1, n)))
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


def message_start(input_tokens: int = 10, msg_id: str = "msg_1") -> dict[str, Any]:
    return {"type": "message_start", "message": {
        "id": msg_id, "type": "message", "role": "assistant", "content": [], "model": "claude-x",
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 1, "cache_read_input_tokens": 0}}}


def text_block(index: int, text: str, n: int = 2) -> list[dict[str, Any]]:
    return [{"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
            *({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": p}}
              for p in pieces(text, n)),
            {"type": "content_block_stop", "index": index}]


def thinking_block(index: int, thinking: str, signature: str) -> list[dict[str, Any]]:
    return [{"type": "content_block_start", "index": index,
             "content_block": {"type": "thinking", "thinking": "", "signature": ""}},
            *({"type": "content_block_delta", "index": index,
               "delta": {"type": "thinking_delta", "thinking": p}} for p in pieces(thinking, 3)),
            {"type": "content_block_delta", "index": index,
             "delta": {"type": "signature_delta", "signature": signature}},
            {"type": "content_block_stop", "index": index}]


def redacted_block(index: int, data: str) -> list[dict[str, Any]]:
    return [{"type": "content_block_start", "index": index,
             "content_block": {"type": "redacted_thinking", "data": data}},
            {"type": "content_block_stop", "index": index}]


def tool_block(index: int, call_id: str, name: str, args: dict[str, Any], n: int = 3,
               kind: str = "tool_use") -> list[dict[str, Any]]:
    raw = orjson.dumps(args).decode()
    return [{"type": "content_block_start", "index": index,
             "content_block": {"type": kind, "id": call_id, "name": name, "input": {}}},
            *({"type": "content_block_delta", "index": index,
               "delta": {"type": "input_json_delta", "partial_json": p}} for p in ["", *pieces(raw, n)]),
            {"type": "content_block_stop", "index": index}]


def search_result_block(index: int, tool_use_id: str) -> list[dict[str, Any]]:
    return [{"type": "content_block_start", "index": index, "content_block": {
                "type": "web_search_tool_result", "tool_use_id": tool_use_id,
                "content": [{"type": "web_search_result", "url": "https://example.com", "title": "Example",
                             "encrypted_content": "enc", "page_age": None}]}},
            {"type": "content_block_stop", "index": index}]


def message_delta(stop_reason: str, output_tokens: int = 20) -> dict[str, Any]:
    return {"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": output_tokens}}


STOP = {"type": "message_stop"}
PING = {"type": "ping"}


def run(rnd: MessagesRound, events: list[bytes]) -> list[bytes]:
    return [out for out in map(rnd.feed, events) if out is not None]


def parsed(chunks: list[bytes]) -> list[dict[str, Any]]:
    """The client-side events, read back from the bytes it was sent."""
    splitter = EventSplitter()
    events = splitter.feed(b"".join(chunks))
    assert splitter.rest() == b""
    out = []
    for event in events:
        data = event_data(event)
        assert data is not None
        obj = orjson.loads(data)
        name = next(line[6:].strip() for line in event.splitlines() if line.startswith(b"event:"))
        assert name.decode() == obj["type"]
        out.append(obj)
    return out


def accumulate(chunks: list[bytes]) -> Any:
    """The whole client stream through the official SDK's accumulator (as client.messages.stream does)."""
    messages = pytest.importorskip("anthropic.lib.streaming._messages")
    snapshot, bufs = None, {}
    for obj in parsed(chunks):
        if obj["type"] == "ping":
            continue
        snapshot = messages.accumulate_event(event=obj, current_snapshot=snapshot, json_bufs=bufs)
    return snapshot


def test_text_only_round_relays_the_upstream_bytes_but_the_end() -> None:
    upstream = [ev(e) for e in [message_start(), PING, *text_block(0, "Hello, world", 4),
                                message_delta("end_turn", 7), STOP]]
    rnd = MessagesRound(0, 0, is_internal)
    out = run(rnd, upstream)
    assert out == [e + b"\n\n" for e in upstream[:-2]]
    assert rnd.blocks == [{"type": "text", "text": "Hello, world"}]
    assert rnd.text == "Hello, world"
    assert rnd.calls == []
    assert rnd.done and is_whole(rnd) and rnd.stop_reason == "end_turn"
    assert rnd.usage == {"input_tokens": 10, "output_tokens": 7, "cache_read_input_tokens": 0}
    assert rnd.message_start == message_start()
    assert rnd.blocks_sent_after == 1
    assert rnd.error is None and rnd.malformed is None
    end = final_events(rnd.stop_reason, rnd.usage, rnd.delta_template)
    delta = {"stop_reason": "end_turn", "stop_sequence": None}
    assert parsed(end) == [{"type": "message_delta", "delta": delta, "usage": rnd.usage}, STOP]
    message = accumulate(out + end)
    assert message.content[0].text == "Hello, world" and message.stop_reason == "end_turn"


def round0_events() -> list[bytes]:
    return [ev(e) for e in [message_start(), *thinking_block(0, "Let me read the log.", "sig-abc"),
                            *text_block(1, "Reading it back."),
                            *tool_block(2, "toolu_int", "read_tool_result", {"call_id": "call_9"}, n=5),
                            message_delta("tool_use", 30), STOP]]


def test_internal_tool_use_is_held_and_content_relayed() -> None:
    rnd = MessagesRound(0, 0, is_internal)
    out = run(rnd, round0_events())
    client = parsed(out)
    assert [e["type"] for e in client] == [
        "message_start", "content_block_start", *["content_block_delta"] * 4, "content_block_stop",
        "content_block_start", *["content_block_delta"] * 2, "content_block_stop"]
    assert {e.get("index") for e in client[1:]} == {0, 1}
    assert b"tool_use" not in b"".join(out) and b"read_tool_result" not in b"".join(out)
    assert rnd.blocks == [
        {"type": "thinking", "thinking": "Let me read the log.", "signature": "sig-abc"},
        {"type": "text", "text": "Reading it back."},
        {"type": "tool_use", "id": "toolu_int", "name": "read_tool_result", "input": {"call_id": "call_9"}}]
    assert rnd.calls == [{"id": "toolu_int", "type": "function",
                          "function": {"name": "read_tool_result", "arguments": '{"call_id":"call_9"}'}}]
    assert rnd.internal_calls == rnd.calls and rnd.client_calls == []
    assert rnd.text == "Reading it back."
    assert rnd.stop_reason == "tool_use" and is_whole(rnd)
    assert rnd.blocks_sent_after == 2


def test_next_round_continues_the_same_message_and_releases_client_calls() -> None:
    first = MessagesRound(0, 0, is_internal)
    out = run(first, round0_events())
    second = MessagesRound(1, first.blocks_sent_after, is_internal)
    upstream = [ev(e) for e in [message_start(50, "msg_2"), PING, *text_block(0, "The log says 42."),
                                *tool_block(1, "toolu_client", "run_tests", {"path": "tests/", "k": "é"}),
                                message_delta("tool_use", 12), STOP]]
    relayed = run(second, upstream)
    client = parsed(relayed)
    assert [e["type"] for e in client] == ["ping", "content_block_start", "content_block_delta",
                                           "content_block_delta", "content_block_stop"]
    assert [e["index"] for e in client[1:]] == [2, 2, 2, 2]
    assert client[1]["content_block"] == {"type": "text", "text": ""}
    assert second.message_start == message_start(50, "msg_2")
    assert second.blocks_sent_after == 3
    assert second.client_calls == second.calls and second.internal_calls == []
    released = second.release([c["id"] for c in second.client_calls], second.blocks_sent_after)
    back = parsed(released)
    assert [e["type"] for e in back] == ["content_block_start", *["content_block_delta"] * 4,
                                         "content_block_stop"]
    assert {e["index"] for e in back} == {3}
    assert back[0]["content_block"]["id"] == "toolu_client"
    usage = add_usage(add_usage(None, first.usage), second.usage)
    assert usage == {"input_tokens": 60, "output_tokens": 42, "cache_read_input_tokens": 0}
    end = final_events(second.stop_reason, usage, second.delta_template)
    message = accumulate(out + relayed + released + end)
    assert message.id == "msg_1"
    assert [b.type for b in message.content] == ["thinking", "text", "text", "tool_use"]
    assert message.content[0].signature == "sig-abc"
    assert message.content[2].text == "The log says 42."
    assert message.content[3].input == {"path": "tests/", "k": "é"}
    assert message.stop_reason == "tool_use"
    assert message.usage.input_tokens == 60 and message.usage.output_tokens == 42


def test_release_only_names_the_asked_ids_and_closes_unstopped_blocks() -> None:
    rnd = MessagesRound(0, 0, is_internal)
    events = [message_start(), *tool_block(0, "toolu_a", "read_tool_result", {"call_id": "x"}),
              *tool_block(1, "toolu_b", "edit", {"file": "a.py"})[:-1]]  # b's stop never came
    assert run(rnd, [ev(e) for e in events]) == [ev(message_start()) + b"\n\n"]
    back = parsed(rnd.release(["toolu_b"], 5))
    assert back[0]["content_block"]["id"] == "toolu_b"
    assert back[-1] == {"type": "content_block_stop", "index": 5}
    assert {e["index"] for e in back} == {5}
    assert rnd.blocks[1]["input"] == {"file": "a.py"}
    assert not is_whole(rnd)


def test_input_json_in_many_pieces() -> None:
    args = {"query": "naïve “quotes” \\ back\nslash", "n": [1, 2, {"deep": None}], "emoji": "🙂"}
    rnd = MessagesRound(0, 0, is_internal)
    raw = orjson.dumps(args).decode()
    events = tool_block(0, "toolu_1", "recall", args, n=len(raw))  # one character a piece
    assert run(rnd, [ev(e) for e in events]) == []
    assert rnd.blocks[0]["input"] == args
    assert orjson.loads(rnd.calls[0]["function"]["arguments"]) == args
    assert rnd.malformed is None


def test_tool_use_without_input_deltas_and_with_bad_json() -> None:
    rnd = MessagesRound(0, 0, is_internal)
    events = [{"type": "content_block_start", "index": 0,
               "content_block": {"type": "tool_use", "id": "t0", "name": "now", "input": {}}},
              {"type": "content_block_stop", "index": 0},
              *tool_block(1, "t1", "edit", {"a": 1})]
    events[-2]["delta"]["partial_json"] += "}"  # type: ignore[index]
    run(rnd, [ev(e) for e in events])
    assert rnd.blocks[0]["input"] == {}
    assert rnd.calls[0]["function"]["arguments"] == "{}"
    assert rnd.blocks[1]["input"] == {}
    assert rnd.calls[1]["function"]["arguments"] == '{"a":1}}'  # the model's text, for the tool to reject
    assert rnd.malformed is not None and "t1" in rnd.malformed


def test_provider_tools_are_relayed_with_their_input_assembled() -> None:
    rnd = MessagesRound(0, 2, is_internal)
    upstream = [ev(e) for e in [
        *tool_block(0, "srvtoolu_1", "web_search", {"query": "ctxproxy"}, kind="server_tool_use"),
        *search_result_block(1, "srvtoolu_1"), *text_block(2, "Found it.")]]
    client = parsed(run(rnd, upstream))
    assert [e["index"] for e in client] == [2] * 6 + [3, 3] + [4] * 4
    assert client[0]["content_block"]["type"] == "server_tool_use"
    assert rnd.blocks[0]["input"] == {"query": "ctxproxy"}
    assert rnd.blocks[1]["content"][0]["url"] == "https://example.com"
    assert rnd.calls == [] and rnd.blocks_sent_after == 5


def test_citations_and_redacted_thinking_are_kept() -> None:
    rnd = MessagesRound(0, 0, is_internal)
    citation = {"type": "char_location", "cited_text": "x", "document_index": 0, "start_char_index": 0,
                "end_char_index": 1}
    events = [*redacted_block(0, "opaque=="), *text_block(1, "cited"),
              {"type": "content_block_delta", "index": 1, "delta": {"type": "citations_delta",
                                                                      "citation": citation}}]
    out = run(rnd, [ev(e) for e in events])
    assert len(out) == len(events)
    assert rnd.blocks == [{"type": "redacted_thinking", "data": "opaque=="},
                          {"type": "text", "text": "cited", "citations": [citation]}]


def test_text_joins_its_deltas_whatever_the_start_said() -> None:
    # A start whose text is not a string counts as none (it made the relay raise mid-stream once);
    # deltas after a block's stop are still its text; an index of True is not block 1.
    rnd = MessagesRound(0, 0, is_internal)
    delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}}
    events = [{"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": 5}},
              delta, {"type": "content_block_stop", "index": 0},
              {**delta, "delta": {"type": "text_delta", "text": "!"}},
              {"type": "content_block_start", "index": 1,
               "content_block": {"type": "thinking", "thinking": "a"}},
              {"type": "content_block_delta", "index": 1,
               "delta": {"type": "thinking_delta", "thinking": "b"}},
              {**delta, "index": True}]
    out = run(rnd, [ev(e) for e in events])
    assert len(out) == len(events)
    assert rnd.blocks == [{"type": "text", "text": "hi!"}, {"type": "thinking", "thinking": "ab"}]
    assert rnd.text == "hi!"
    assert rnd.malformed is not None and "did not start" in rnd.malformed  # (the True index)


def test_upstream_error_event_is_relayed_and_kept() -> None:
    rnd = MessagesRound(1, 3, is_internal)
    out = run(rnd, [ev(e) for e in [message_start(), *text_block(0, "partial")[:2]]])
    assert [e["index"] for e in parsed(out)] == [3, 3]  # message_start of a later round dropped
    error = b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'
    assert rnd.feed(error) == error + b"\n\n"
    assert rnd.error == {"type": "overloaded_error", "message": "Overloaded"}
    assert not is_whole(rnd)


def test_malformed_events_are_relayed_untouched() -> None:
    rnd = MessagesRound(0, 0, is_internal)
    bad = b"event: content_block_delta\ndata: {not json"
    assert rnd.feed(bad) == bad + b"\n\n"
    assert rnd.malformed is not None and "not JSON" in rnd.malformed
    first = rnd.malformed
    stray = {"type": "content_block_delta", "index": 7, "delta": {"type": "text_delta", "text": "x"}}
    for event in (b"data: [1, 2]", ev(stray),
                  ev({"type": "content_block_start", "index": "0", "content_block": {"type": "text"}})):
        assert rnd.feed(event) == event + b"\n\n"
    assert rnd.malformed == first  # the first one is named


def test_comments_and_unknown_events_pass_untouched() -> None:
    rnd = MessagesRound(0, 1, is_internal)
    comment = b": keep-alive"
    future = ev({"type": "future_event", "what": 1})
    assert rnd.feed(comment) == comment + b"\n\n"
    assert rnd.feed(future) == future + b"\n\n"
    run(rnd, [ev(e) for e in tool_block(0, "t", "edit", {})])
    run(rnd, [ev(e) for e in text_block(1, "hi")])
    on_held = ev({"type": "block_annotation", "index": 0})
    on_relayed = ev({"type": "block_annotation", "index": 1})
    assert rnd.feed(on_held) is None
    assert parsed([rnd.feed(on_relayed) or b""]) == [{"type": "block_annotation", "index": 1}]
    assert parsed(rnd.release(["t"], 2))[-1] == {"type": "block_annotation", "index": 2}


def test_final_events_error_event_and_usage() -> None:
    template = {"type": "message_delta", "delta": {"stop_reason": "stop_sequence", "stop_sequence": "END"},
                "usage": {"output_tokens": 3}, "extra": True}
    delta, stop = parsed(final_events("end_turn", {"output_tokens": 9}, template))
    assert delta == {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                     "usage": {"output_tokens": 9}, "extra": True}
    assert stop == STOP
    kept = parsed(final_events("stop_sequence", None, template))[0]
    assert kept["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    assert kept["usage"] == {"output_tokens": 3}
    assert parsed(final_events(None, None, None))[0] == {
        "type": "message_delta", "delta": {"stop_reason": None, "stop_sequence": None},
        "usage": {"output_tokens": 0}}
    assert error_event("broke off", "overloaded_error") == (
        b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"broke off"}}\n\n')
    assert parsed([error_event("x")])[0]["error"]["type"] == "api_error"
    total = add_usage(None, {"input_tokens": 1, "cache_creation_input_tokens": None,
                             "cache_creation": {"ephemeral_5m_input_tokens": 2}, "service_tier": "standard"})
    total = add_usage(total, {"input_tokens": 4, "cache_creation_input_tokens": 5,
                              "cache_creation": {"ephemeral_5m_input_tokens": 3}, "service_tier": "standard",
                              "server_tool_use": {"web_search_requests": 1}})
    assert total == {"input_tokens": 5, "cache_creation_input_tokens": 5,
                     "cache_creation": {"ephemeral_5m_input_tokens": 5}, "service_tier": "standard",
                     "server_tool_use": {"web_search_requests": 1}}
    assert add_usage(total, None) is total and add_usage(None, {}) is None


KINDS = ("text", "thinking", "redacted", "server", "internal", "client")


def block_events(kind: str, index: int, tag: str, n: int) -> list[dict[str, Any]]:
    if kind == "text":
        return text_block(index, f"text {tag} " * n, n)
    if kind == "thinking":
        return thinking_block(index, f"thought {tag}", f"sig-{tag}")
    if kind == "redacted":
        return redacted_block(index, f"data-{tag}")
    if kind == "server":
        return tool_block(index, f"srv_{tag}", "web_search", {"q": tag}, n, kind="server_tool_use")
    name = "read_tool_result" if kind == "internal" else "edit"
    return tool_block(index, f"toolu_{tag}", name, {"tag": tag, "n": n}, n)


@settings(max_examples=150, deadline=None, database=None)
@given(rounds=st.lists(st.lists(st.tuples(st.sampled_from(KINDS), st.integers(1, 6)), max_size=6),
                       min_size=1, max_size=4),
       pings=st.lists(st.integers(0, 60), max_size=5))
def test_client_indexes_are_contiguous_over_any_rounds(rounds: list[list[tuple[str, int]]],
                                                       pings: list[int]) -> None:
    chunks: list[bytes] = []
    sent = 0
    expected: list[str] = []  # the client's block types, in order
    for round_no, blocks in enumerate(rounds):
        events = [message_start(msg_id=f"msg_{round_no}")]
        for index, (kind, n) in enumerate(blocks):
            events += block_events(kind, index, f"{round_no}_{index}", n)
        for at in pings:
            events.insert(min(at, len(events)), PING)
        last = round_no == len(rounds) - 1
        events += [message_delta("tool_use" if not last else "end_turn"), STOP]
        rnd = MessagesRound(round_no, sent, is_internal)
        chunks += run(rnd, [ev(e) for e in events])
        assert is_whole(rnd) and rnd.malformed is None
        assert len(rnd.blocks) == len(blocks)
        expected += [b["type"] for b in rnd.blocks if b["type"] != "tool_use"]
        sent = rnd.blocks_sent_after
        if last:
            client_ids = [c["id"] for c in rnd.client_calls]
            chunks += rnd.release(client_ids, sent)
            expected += ["tool_use"] * len(client_ids)
            chunks += final_events(rnd.stop_reason, rnd.usage, rnd.delta_template)
    client = parsed(chunks)
    assert [e["type"] for e in client].count("message_start") == 1
    assert client[0]["type"] in ("message_start", "ping")
    open_index: int | None = None
    started = 0
    for event in client:
        if event["type"] == "content_block_start":
            assert open_index is None and event["index"] == started
            open_index, started = started, started + 1
        elif event["type"] == "content_block_delta":
            assert event["index"] == open_index
        elif event["type"] == "content_block_stop":
            assert event["index"] == open_index
            open_index = None
    assert open_index is None and started == len(expected)
    assert all("read_tool_result" not in orjson.dumps(e).decode() for e in client)
    message = accumulate(chunks)
    assert [b.type for b in message.content] == expected
