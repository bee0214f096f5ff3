"""OpenAI Responses streaming rounds: items relayed as they come, function calls held, one output_index
sequence and one sequence_number counter across rounds; the client stream read back by the openai SDK."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from proxy.sse import EventSplitter, event_data
from proxy.wire.responses_stream import ResponsesRound, add_usage, error_event, final_events, is_whole

openai = pytest.importorskip("openai")

INTERNAL = frozenset({"read_tool_result", "recall"})
Item = tuple[str, str]  # (kind, a label that makes ids and text distinct)


def is_internal(name: str) -> bool:
    return name in INTERNAL


def pieces(text: str, n: int) -> list[str]:
    size = max(1, -(-len(text) // max(1, n)))
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


def response(resp_id: str, status: str = "in_progress", usage: dict[str, Any] | None = None,
             output: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"id": resp_id, "object": "response", "created_at": 1700000000, "status": status, "model": "gpt-x",
            "output": output or [], "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "error": None, "incomplete_details": None, "usage": usage}


def usage(inp: int, out: int) -> dict[str, Any]:
    return {"input_tokens": inp, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": out,
            "output_tokens_details": {"reasoning_tokens": 1}, "total_tokens": inp + out}


def reasoning(i: int, label: str) -> list[dict[str, Any]]:
    rid, summary = f"rs_{label}", f"Thinking about {label}."
    done = {"id": rid, "type": "reasoning", "summary": [{"type": "summary_text", "text": summary}],
            "encrypted_content": f"gAAAA-{label}"}
    at = {"item_id": rid, "output_index": i, "summary_index": 0}
    return [{"type": "response.output_item.added", "output_index": i,
             "item": {"id": rid, "type": "reasoning", "summary": []}},
            {"type": "response.reasoning_summary_part.added", **at,
             "part": {"type": "summary_text", "text": ""}},
            *({"type": "response.reasoning_summary_text.delta", **at, "delta": p}
              for p in pieces(summary, 3)),
            {"type": "response.reasoning_summary_text.done", **at, "text": summary},
            {"type": "response.reasoning_summary_part.done", **at, "part": done["summary"][0]},
            {"type": "response.output_item.done", "output_index": i, "item": done}]


def message(i: int, label: str) -> list[dict[str, Any]]:
    mid, text = f"msg_{label}", f"Answer {label}: é ok."
    part = {"type": "output_text", "text": text, "annotations": []}
    at = {"item_id": mid, "output_index": i, "content_index": 0}
    item = {"id": mid, "type": "message", "status": "in_progress", "role": "assistant", "content": []}
    return [{"type": "response.output_item.added", "output_index": i, "item": item},
            {"type": "response.content_part.added", **at, "part": {**part, "text": ""}},
            *({"type": "response.output_text.delta", **at, "delta": p, "logprobs": []}
              for p in pieces(text, 3)),
            {"type": "response.output_text.done", **at, "text": text, "logprobs": []},
            {"type": "response.content_part.done", **at, "part": part},
            {"type": "response.output_item.done", "output_index": i,
             "item": {**item, "status": "completed", "content": [part]}}]


def function_call(i: int, label: str, name: str, args: dict[str, Any]) -> list[dict[str, Any]]:
    fid, raw = f"fc_{label}", orjson.dumps(args).decode()
    item = {"id": fid, "type": "function_call", "status": "in_progress", "arguments": "",
            "call_id": f"call_{label}", "name": name}
    at = {"item_id": fid, "output_index": i}
    return [{"type": "response.output_item.added", "output_index": i, "item": item},
            *({"type": "response.function_call_arguments.delta", **at, "delta": p} for p in pieces(raw, 4)),
            {"type": "response.function_call_arguments.done", **at, "arguments": raw, "name": name},
            {"type": "response.output_item.done", "output_index": i,
             "item": {**item, "status": "completed", "arguments": raw}}]


def item_events(i: int, kind: str, label: str) -> list[dict[str, Any]]:
    if kind == "reasoning":
        return reasoning(i, label)
    if kind == "message":
        return message(i, label)
    if kind == "internal":
        return function_call(i, label, "read_tool_result", {"call_id": f"call_old_{label}"})
    return function_call(i, label, "run_shell", {"cmd": f"ls {label}", "é": 1})


def upstream(resp_id: str, items: list[Item], end: str = "response.completed",
             use: dict[str, Any] | None = None) -> list[bytes]:
    """One upstream round as EventSplitter yields it: named events, sequence numbers from 0."""
    events = [{"type": "response.created", "response": response(resp_id)},
              {"type": "response.in_progress", "response": response(resp_id)}]
    for i, (kind, label) in enumerate(items):
        events += item_events(i, kind, label)
    outputs = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    status = end.removeprefix("response.")
    events.append({"type": end, "response": response(resp_id, status, use or usage(10, 5), outputs)})
    return [b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps({**e, "sequence_number": n})
            for n, e in enumerate(events)]


def run(rnd: ResponsesRound, events: list[bytes]) -> list[bytes]:
    return [out for out in map(rnd.feed, events) if out is not None]


def parsed(chunks: list[bytes]) -> list[dict[str, Any]]:
    splitter = EventSplitter()
    events = splitter.feed(b"".join(chunks))
    assert splitter.rest() == b""
    out = []
    for event in events:
        data = event_data(event)
        assert data is not None
        obj = orjson.loads(data)
        assert event.startswith(b"event: " + obj["type"].encode() + b"\n")
        out.append(obj)
    return out


def client_for(chunks: list[bytes]) -> Any:
    body = b"".join(chunks)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    return openai.OpenAI(api_key="sk-test", base_url="http://upstream.test/v1", max_retries=0,
                         http_client=httpx.Client(transport=httpx.MockTransport(handler)))


def sdk_final(chunks: list[bytes]) -> Any:
    """The client stream through the official SDK's Responses stream accumulation."""
    with client_for(chunks).responses.stream(model="gpt-x", input="hi") as stream:
        for _ in stream:
            pass
        return stream.get_final_response()


def test_text_only_round_relays_the_upstream_bytes_but_the_end() -> None:
    events = upstream("resp_1", [("message", "a")])
    rnd = ResponsesRound(0, 0, is_internal)
    out = run(rnd, events)
    assert out == [e + b"\n\n" for e in events[:-1]]  # untouched bytes; response.completed held
    assert rnd.text == "Answer a: é ok." and rnd.calls == []
    assert rnd.done and is_whole(rnd) and rnd.error is None and rnd.malformed is None
    assert rnd.usage == usage(10, 5) and rnd.response is not None and rnd.response["status"] == "completed"
    assert rnd.items_sent_after == 1 and rnd.sequence == len(events) - 1
    end = final_events(rnd.response, rnd.sent_items, rnd.usage, rnd.sequence)
    (completed,) = parsed(end)
    assert completed["sequence_number"] == len(events) - 1
    assert completed["response"] == orjson.loads(event_data(events[-1]) or b"")["response"]
    final = sdk_final(out + end)
    assert final.id == "resp_1" and final.output_text == "Answer a: é ok."


ROUND0: list[Item] = [("reasoning", "r0"), ("internal", "i0"), ("message", "m0")]


def test_internal_function_call_is_held_and_the_rest_relayed_renumbered() -> None:
    rnd = ResponsesRound(0, 0, is_internal)
    out = run(rnd, upstream("resp_1", ROUND0))
    client = parsed(out)
    assert [e["sequence_number"] for e in client] == list(range(len(client)))
    assert not any("function_call" in e["type"] for e in client)
    assert b"read_tool_result" not in b"".join(out) and b"fc_i0" not in b"".join(out)
    added = [e for e in client if e["type"] == "response.output_item.added"]
    assert [(e["output_index"], e["item"]["type"]) for e in added] == [(0, "reasoning"), (1, "message")]
    assert {e["output_index"] for e in client if e.get("item_id") == "msg_m0"} == {1}
    assert [item["type"] for item in rnd.items] == ["reasoning", "function_call", "message"]
    assert rnd.items[0]["encrypted_content"] == "gAAAA-r0"
    assert rnd.items[1]["arguments"] == '{"call_id":"call_old_i0"}'
    assert rnd.calls == [{"id": "call_i0", "type": "function",
                          "function": {"name": "read_tool_result", "arguments": '{"call_id":"call_old_i0"}'}}]
    assert rnd.text == "Answer m0: é ok." and rnd.items_sent_after == 2 and is_whole(rnd)
    assert [item["type"] for item in rnd.sent_items] == ["reasoning", "message"]


def test_next_round_continues_indexes_sequence_and_id_then_releases_a_client_call() -> None:
    first = ResponsesRound(0, 0, is_internal)
    out = run(first, upstream("resp_1", ROUND0))
    assert first.response is not None
    second = ResponsesRound(1, first.items_sent_after, is_internal, sequence=first.sequence,
                            response_id=first.response["id"])
    relayed = run(second, upstream("resp_2", [("message", "m1"), ("client", "c1")], use=usage(40, 7)))
    client = parsed(relayed)
    assert not any(e["type"] in ("response.created", "response.in_progress") for e in client)
    assert [e["sequence_number"] for e in client] == list(range(first.sequence, second.sequence))
    assert {e["output_index"] for e in client} == {2}
    assert second.response is not None and second.response["id"] == "resp_1"
    assert [c["function"]["name"] for c in second.calls] == ["run_shell"]
    released = second.release([c["id"] for c in second.calls], second.items_sent_after)
    back = parsed(released)
    assert [e["type"] for e in back] == [
        "response.output_item.added", *["response.function_call_arguments.delta"] * 4,
        "response.function_call_arguments.done", "response.output_item.done"]
    assert {e["output_index"] for e in back} == {3}
    after = client[-1]["sequence_number"] + 1
    assert [e["sequence_number"] for e in back] == list(range(after, second.sequence))
    total = add_usage(add_usage(None, first.usage), second.usage)
    assert total == {"input_tokens": 50, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 12,
                     "output_tokens_details": {"reasoning_tokens": 2}, "total_tokens": 62}
    output = first.sent_items + second.sent_items
    end = final_events(second.response, output, total, second.sequence)
    (completed,) = parsed(end)
    assert completed["type"] == "response.completed" and completed["sequence_number"] == second.sequence
    assert [i["type"] for i in completed["response"]["output"]] == ["reasoning", "message", "message",
                                                                   "function_call"]
    final = sdk_final(out + relayed + released + end)
    assert final.id == "resp_1" and final.usage is not None and final.usage.total_tokens == 62
    assert [i.type for i in final.output] == ["reasoning", "message", "message", "function_call"]
    assert final.output[0].encrypted_content == "gAAAA-r0"
    assert final.output[3].call_id == "call_c1" and orjson.loads(final.output[3].arguments) == {
        "cmd": "ls c1", "é": 1}


def test_final_events_leave_internal_calls_out_and_keep_incomplete() -> None:
    items = [{"type": "function_call", "name": "recall", "call_id": "c", "arguments": "{}"},
             {"type": "message", "id": "m", "content": []},
             {"type": "function_call", "name": "run_shell", "call_id": "d", "arguments": "{}"}]
    (done,) = parsed(final_events(response("r", "completed"), items, None, 9, is_internal=is_internal))
    assert [i.get("call_id", i["type"]) for i in done["response"]["output"]] == ["message", "d"]
    assert done["response"]["usage"] is None
    (inc,) = parsed(final_events(response("r", "incomplete"), [], usage(1, 1), 3))
    assert inc["type"] == "response.incomplete" and inc["response"]["usage"] == usage(1, 1)


def test_upstream_error_event_is_relayed_renumbered_and_the_sdk_raises() -> None:
    rnd = ResponsesRound(1, 4, is_internal, sequence=30, response_id="resp_1")
    events = upstream("resp_2", [("message", "x")])[:5]
    error = {"type": "error", "sequence_number": 5, "error": {
        "type": "server_error", "code": "server_error", "message": "The model crashed", "param": None}}
    out = run(rnd, [*events, b"event: error\ndata: " + orjson.dumps(error)])
    assert rnd.error == error["error"] and not is_whole(rnd)
    assert parsed(out)[-1] == {**error, "sequence_number": 33}  # 3 item events relayed first
    with pytest.raises(openai.APIError, match="The model crashed"):
        list(client_for(out).responses.create(model="gpt-x", input="hi", stream=True))


def test_our_error_event_is_raised_by_the_sdk_and_reads_as_a_response_error_event() -> None:
    event = error_event("upstream stream broke off", "upstream_stream_broken", sequence=7)
    (obj,) = parsed([event])
    assert obj["sequence_number"] == 7 and obj["message"] == "upstream stream broke off"
    assert obj["error"]["code"] == "upstream_stream_broken"
    typed = openai.types.responses.ResponseErrorEvent.model_validate(obj)
    assert typed.code == "upstream_stream_broken"
    with pytest.raises(openai.APIError, match="upstream stream broke off"):
        sdk_final([*upstream("resp_1", [])[:1], b"\n\n", event])


def test_response_failed_is_relayed_under_the_client_id_without_internal_calls() -> None:
    rnd = ResponsesRound(1, 2, is_internal, sequence=10, response_id="resp_1")
    failed = response("resp_2", "failed", output=[{"type": "function_call", "name": "recall", "call_id": "x",
                                                   "arguments": "{}"}])
    failed["error"] = {"code": "server_error", "message": "boom"}
    out = run(rnd, [b"event: response.failed\ndata: " + orjson.dumps(
        {"type": "response.failed", "sequence_number": 0, "response": failed})])
    (obj,) = parsed(out)
    assert obj["sequence_number"] == 10 and obj["response"]["id"] == "resp_1"
    assert obj["response"]["output"] == [] and rnd.error == {"code": "server_error", "message": "boom"}


@pytest.mark.parametrize(("event", "problem"), [
    (b"data: {not json", "not JSON"),
    (b"data: [1, 2]", "a JSON list"),
    (b'data: {"type": "response.output_text.delta", "output_index": 9, "delta": "x"}', "was not added"),
    (b'data: {"type": "response.output_item.added", "output_index": 0}', "typed item"),
])
def test_malformed_events_are_named_and_relayed_untouched(event: bytes, problem: str) -> None:
    rnd = ResponsesRound(0, 0, is_internal)
    assert rnd.feed(event) == event + b"\n\n"
    assert rnd.malformed is not None and problem in rnd.malformed
    assert rnd.feed(b": keep-alive") == b": keep-alive\n\n" and rnd.feed(b"data: [DONE]") is None


def test_function_call_arguments_that_are_not_an_object_are_named() -> None:
    rnd = ResponsesRound(0, 0, is_internal)
    events = [{"type": "response.output_item.added", "output_index": 0,
               "item": {"type": "function_call", "call_id": "c", "name": "recall", "arguments": ""}},
              {"type": "response.function_call_arguments.delta", "output_index": 0, "delta": '{"q": '},
              {"type": "response.output_item.done", "output_index": 0,
               "item": {"type": "function_call", "call_id": "c", "name": "recall", "arguments": '{"q": '}}]
    assert run(rnd, [b"data: " + orjson.dumps(e) for e in events]) == []
    assert rnd.malformed is not None and "not a JSON object" in rnd.malformed
    assert rnd.calls[0]["function"]["arguments"] == '{"q": '


def test_unknown_events_are_relayed_and_follow_their_item() -> None:
    rnd = ResponsesRound(0, 3, is_internal, sequence=4)
    run(rnd, upstream("resp_1", [("internal", "i"), ("message", "m")])[:-1])
    at = rnd.sequence
    note = {"type": "response.output_text.annotation.added", "output_index": 1, "sequence_number": 99}
    held = {"type": "response.future.thing", "output_index": 0}
    other = {"type": "response.future.global", "sequence_number": 1}
    out = run(rnd, [b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e)
                    for e in (note, held, other)])
    assert parsed(out) == [{**note, "output_index": 3, "sequence_number": at},
                           {**other, "sequence_number": at + 1}]
    assert rnd.calls[0]["id"] == "call_i" and rnd.items_sent_after == 4


kinds = st.sampled_from(["reasoning", "message", "internal", "client"])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(kinds, max_size=4), min_size=1, max_size=4))
def test_rounds_make_one_well_formed_client_stream(rounds: list[list[str]]) -> None:
    chunks: list[bytes] = []
    sent: list[dict[str, Any]] = []
    items_sent, sequence, total, first_id = 0, 0, None, None
    rnd = ResponsesRound(0, 0, is_internal)
    for number, kinds_ in enumerate(rounds):
        rnd = ResponsesRound(number, items_sent, is_internal, sequence=sequence, response_id=first_id)
        chunks += run(rnd, upstream(f"resp_{number}", [(k, f"{number}_{i}") for i, k in enumerate(kinds_)]))
        assert is_whole(rnd) and rnd.malformed is None and rnd.response is not None
        first_id = first_id or rnd.response["id"]
        items_sent, sequence, total = rnd.items_sent_after, rnd.sequence, add_usage(total, rnd.usage)
        if number < len(rounds) - 1:
            sent += rnd.sent_items
    client_ids = [c["id"] for c in rnd.calls if not is_internal(c["function"]["name"])]
    chunks += rnd.release(client_ids, items_sent)
    sent += rnd.sent_items
    chunks += final_events(rnd.response, sent, total, rnd.sequence)
    client = parsed(chunks)
    assert [e["sequence_number"] for e in client] == list(range(len(client)))
    assert [e["type"] for e in client].count("response.created") == 1
    assert [e["type"] for e in client][-1] == "response.completed"
    assert [e["type"] for e in client].count("response.completed") == 1
    added = [e["output_index"] for e in client if e["type"] == "response.output_item.added"]
    assert added == list(range(len(added)))
    assert all(e["output_index"] < len(added) for e in client if "output_index" in e)
    assert b"read_tool_result" not in b"".join(chunks)
    final = sdk_final(chunks)
    assert final.id == "resp_0" and len(final.output) == len(added) == len(sent)
    relayed = [k for kinds_ in rounds for k in kinds_ if k in ("reasoning", "message")]
    released = ["function_call"] * rounds[-1].count("client")
    assert [i.type for i in final.output] == relayed + released


def test_custom_tool_call_is_held_shown_as_a_custom_call_and_released_whole() -> None:
    rnd = ResponsesRound(0, 0, is_internal, sequence=2)
    item = {"id": "ctc_1", "type": "custom_tool_call", "call_id": "call_p", "name": "apply_patch",
            "input": ""}
    events = [{"type": "response.output_item.added", "output_index": 0, "item": item},
              *({"type": "response.custom_tool_call_input.delta", "output_index": 0, "item_id": "ctc_1",
                 "delta": p} for p in ("*** Begin", " Patch")),
              {"type": "response.custom_tool_call_input.done", "output_index": 0, "item_id": "ctc_1",
               "input": "*** Begin Patch"}]  # no output_item.done: release completes the item
    assert run(rnd, [b"data: " + orjson.dumps(e) for e in events]) == []
    assert rnd.calls == [{"id": "call_p", "type": "custom",
                          "custom": {"name": "apply_patch", "input": "*** Begin Patch"}}]
    back = parsed(rnd.release(["call_p"], 5))
    assert [(e["type"], e["output_index"], e["sequence_number"]) for e in back] == [
        ("response.output_item.added", 5, 2), ("response.custom_tool_call_input.delta", 5, 3),
        ("response.custom_tool_call_input.delta", 5, 4), ("response.custom_tool_call_input.done", 5, 5),
        ("response.output_item.done", 5, 6)]
    assert back[-1]["item"] == {**item, "input": "*** Begin Patch"} and rnd.sent_items == [back[-1]["item"]]
    assert rnd.release(["call_other"], 6) == []


def folded_eagerly(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The items the events make, each delta joined onto its field as it comes (the plain reading)."""
    items: dict[int, dict[str, Any]] = {}
    for obj in events:
        kind, index = obj["type"], obj.get("output_index")
        if kind == "response.output_item.added":
            items.setdefault(index, orjson.loads(orjson.dumps(obj["item"])))
        elif index not in items:
            continue
        elif kind == "response.output_item.done":
            items[index] = orjson.loads(orjson.dumps(obj["item"]))
        elif kind == "response.content_part.added":
            parts, where = items[index].setdefault("content", []), obj["content_index"]
            part = orjson.loads(orjson.dumps(obj["part"]))
            if 0 <= where < len(parts):
                parts[where] = part
            else:
                parts.append(part)
        else:
            listed, name, source = {"response.output_text.delta": ("content", "text", "delta"),
                                    "response.output_text.done": ("content", "text", "text"),
                                    "response.function_call_arguments.delta": (None, "arguments", "delta"),
                                    "response.function_call_arguments.done": (None, "arguments", "arguments"),
                                    }[kind]
            target = items[index]
            if listed is not None:
                parts, where = target.get(listed) or [], obj["content_index"]
                target = parts[where] if 0 <= where < len(parts) else None
            if target is not None:
                before = target.get(name) if isinstance(target.get(name), str) else ""
                target[name] = before + obj[source] if source == "delta" else obj[source]
    return [items[index] for index in sorted(items, key=list(items).index)]


stream_steps = st.lists(st.one_of(
    st.builds(lambda i, kind: {"type": "response.output_item.added", "output_index": i,
                               "item": {"id": f"i{i}", "type": kind, "call_id": f"c{i}", "name": "f",
                                        "arguments": "", "content": []}},
              st.integers(0, 1), st.sampled_from(["message", "function_call"])),
    st.builds(lambda i, c, text: {"type": "response.content_part.added", "output_index": i,
                                  "content_index": c, "part": {"type": "output_text", "text": text}},
              st.integers(0, 1), st.integers(0, 1), st.sampled_from(["", "p"])),
    st.builds(lambda i, c, text: {"type": "response.output_text.delta", "output_index": i, "content_index": c,
                                  "delta": text},
              st.integers(0, 1), st.integers(0, 1), st.sampled_from(["a", "bc"])),
    st.builds(lambda i, c: {"type": "response.output_text.done", "output_index": i, "content_index": c,
                            "text": "whole"}, st.integers(0, 1), st.integers(0, 1)),
    st.builds(lambda i, text: {"type": "response.function_call_arguments.delta", "output_index": i,
                               "delta": text}, st.integers(0, 1), st.sampled_from(["{", "}", "\"k\":1"])),
    st.builds(lambda i: {"type": "response.function_call_arguments.done", "output_index": i,
                         "arguments": "{}"}, st.integers(0, 1)),
    st.builds(lambda i: {"type": "response.output_item.done", "output_index": i,
                         "item": {"id": f"i{i}", "type": "message", "content": [{"type": "output_text",
                                                                                "text": "done"}]}},
              st.integers(0, 1))), max_size=30)


ADDED = {"type": "response.output_item.added", "output_index": 0,
         "item": {"id": "m", "type": "message", "content": []}}
PART = {"type": "response.content_part.added", "output_index": 0, "content_index": 0,
        "part": {"type": "output_text", "text": ""}}
DELTA = {"type": "response.output_text.delta", "output_index": 0, "content_index": 0, "delta": "a"}


@settings(max_examples=400, deadline=None)
@given(stream_steps, st.lists(st.integers(1, 30), max_size=3))
@example([ADDED, PART, DELTA, {**DELTA, "type": "response.output_text.done", "text": "whole"}], [])
@example([ADDED, PART, DELTA, {"type": "response.output_item.done", "output_index": 0,
                               "item": {"id": "m", "type": "message", "content": [{"text": "x"}]}}], [])
@example([ADDED, PART, DELTA, PART, DELTA], [3])
def test_deltas_joined_once_make_the_items_joining_each_would(events: list[dict[str, Any]],
                                                               reads: list[int]) -> None:
    # (the items read between events too: a read joins what came so far, and later deltas go on)
    round_ = ResponsesRound(0, 0, is_internal)
    for n, obj in enumerate(events, 1):
        round_.feed(b"event: " + obj["type"].encode() + b"\ndata: " + orjson.dumps(obj))
        if n in reads:
            assert round_.items == folded_eagerly(events[:n])
    assert round_.items == folded_eagerly(events)
