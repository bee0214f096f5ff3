"""read_tool_result answered by the proxy, through the real server, streaming and not."""

from __future__ import annotations

import httpx
import orjson
import pytest

from tests.servers import Seen, Step, stream_chunks

BIG = "\n".join(f"line {i}: value={i * 7} path=src/mod_{i % 13}.py" for i in range(500))
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]


def history(call_id: str = "call_read") -> list[dict]:
    return [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Summarize big.log"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "read_file",
                                                              "arguments": '{"path": "big.log"}'}}]},
        {"role": "tool", "tool_call_id": call_id, "content": BIG},
    ]


def internal_call(call_id: str = "call_read", **extra) -> dict:
    return {"id": "int_1", "type": "function", "function": {
        "name": "read_tool_result", "arguments": orjson.dumps({"call_id": call_id, **extra}).decode()}}


def check_second_round(seen: Seen) -> Step:
    """The model's second call must carry the original bytes as the read_tool_result answer."""
    body = seen.json()
    answer = body["messages"][-1]
    assert answer["role"] == "tool" and answer["tool_call_id"] == "int_1"
    assert answer["content"] == BIG
    assert body["messages"][-2]["tool_calls"][0]["function"]["name"] == "read_tool_result"
    return Step(content="The log has 1500 lines.")


def test_summary_replaces_big_result_and_read_back_is_byte_identical(proxy, fake_upstream):
    fake_upstream.then(Step(tool_calls=[internal_call()]), check_second_round)
    client = proxy.client()
    raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=history(), tools=TOOLS)
    result = raw.parse()
    assert result.choices[0].message.content == "The log has 1500 lines."
    assert result.choices[0].message.tool_calls is None
    assert result.usage.prompt_tokens == 22  # both rounds are billed to the client's view
    first = fake_upstream.chat_requests[0].json()
    summary = first["messages"][-1]["content"]
    assert "summary" in summary and "call_id=call_read" in summary
    assert 'read_tool_result(call_id="call_read")' in summary
    assert len(summary) < len(BIG) / 5
    assert [t["function"]["name"] for t in first["tools"]] == ["read_file", "read_tool_result", "recall"]
    assert int(raw.headers["x-ctxproxy-tokens-after"]) < int(raw.headers["x-ctxproxy-tokens-before"]) / 3
    proxy.flush()
    rows = list(proxy.query("select status, forwarded_leaf, round from exchanges order by rowid"))
    assert len(rows) == 2 and all(r["status"] == 200 for r in rows)  # one row per upstream call
    assert [r["round"] for r in rows] == [0, 1]
    # each call's archived forwarded messages are what that call sent (not what later rounds added)
    for row, seen in zip(rows, fake_upstream.chat_requests, strict=True):
        chain = list(proxy.query("with recursive up(id, parent_id) as (select id, parent_id from messages "
                                 "where id = ? union all select m.id, m.parent_id from messages m "
                                 "join up on m.id = up.parent_id) select count(*) as n from up",
                                 (row["forwarded_leaf"],)))
        assert chain[0]["n"] == len(seen.json()["messages"])


def test_streaming_hides_internal_calls_and_continues_one_stream(proxy, fake_upstream):
    fake_upstream.then(
        Step(kind="stream", chunks=stream_chunks(["Let me look. "], tool_calls=[internal_call()],
                                                 response_id="chatcmpl-A")),
        lambda seen: (check_second_round(seen), Step(kind="stream", chunks=stream_chunks(
            ["It has ", "1500 lines."], response_id="chatcmpl-B")))[1])
    with httpx.stream("POST", f"{proxy.url}/v1/chat/completions", json={
            "model": "gpt-4o", "stream": True, "messages": history(), "tools": TOOLS},
            headers={"authorization": "Bearer k"}) as response:
        raw = b"".join(response.iter_bytes())
    events = [line[6:] for line in raw.split(b"\n\n") if line.startswith(b"data: ")]
    assert events.count(b"[DONE]") == 1 and events[-1] == b"[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    assert {c["id"] for c in chunks} == {"chatcmpl-A"}
    assert b"read_tool_result" not in raw and b"tool_calls\":[" not in raw
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "Let me look. It has 1500 lines."
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    proxy.flush()  # each round's upstream time: to its headers, and to its last byte
    rows = list(proxy.query("select round, upstream_headers_ms, upstream_ms from exchanges order by rowid"))
    assert [r["round"] for r in rows] == [0, 1]
    assert all(0 < r["upstream_headers_ms"] <= r["upstream_ms"] for r in rows)


def test_streaming_with_openai_sdk(proxy, fake_upstream):
    fake_upstream.then(
        Step(kind="stream", chunks=stream_chunks([], tool_calls=[internal_call()])),
        Step(kind="stream", chunks=stream_chunks(["done"])))
    stream = proxy.client().chat.completions.create(model="gpt-4o", messages=history(), tools=TOOLS,
                                                     stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "done"
    assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)


def test_client_tool_calls_in_a_stream_are_released_whole(proxy, fake_upstream):
    client_call = {"id": "call_x", "type": "function", "function": {"name": "read_file",
                                                                     "arguments": '{"path": "b"}'}}
    fake_upstream.then(Step(kind="stream", chunks=stream_chunks([], tool_calls=[client_call])))
    stream = proxy.client().chat.completions.create(model="gpt-4o", messages=history(), tools=TOOLS,
                                                     stream=True)
    calls = [c.choices[0].delta.tool_calls[0] for c in stream if c.choices and c.choices[0].delta.tool_calls]
    assert len(calls) == 1 and calls[0].id == "call_x" and calls[0].function.arguments == '{"path": "b"}'


@pytest.mark.parametrize(("arguments", "expected"), [
    ({"call_id": "call_read", "start_line": 10, "end_line": 12},
     "[lines 10-12 of 500 of call_id=call_read]\n" + "\n".join(BIG.splitlines()[9:12]) + "\n"),
    ({"call_id": "../etc/passwd"}, "error: call_id must be"),
    ({"call_id": "nope"}, "error: no stored tool result"),
])
def test_ranges_and_bad_ids_are_answered_as_text(proxy, fake_upstream, arguments, expected):
    call = {"id": "int_1", "type": "function", "function": {"name": "read_tool_result",
                                                             "arguments": orjson.dumps(arguments).decode()}}
    fake_upstream.then(Step(tool_calls=[call]), Step(content="ok"))
    proxy.client().chat.completions.create(model="gpt-4o", messages=history(), tools=TOOLS)
    answer = fake_upstream.chat_requests[1].json()["messages"][-1]["content"]
    assert answer.startswith(expected)


def test_other_tenants_cannot_read_a_stored_result(proxy, fake_upstream):
    proxy.client(api_key="key-A").chat.completions.create(model="gpt-4o", messages=history(), tools=TOOLS)
    fake_upstream.then(Step(tool_calls=[internal_call("call_read")]), Step(content="ok"))
    # key-B has a summarized result of its own (so the tool is offered) and asks for key-A's.
    proxy.client(api_key="key-B").chat.completions.create(
        model="gpt-4o", messages=history("call_other"), tools=TOOLS)
    answer = fake_upstream.chat_requests[-1].json()["messages"][-1]["content"]
    assert answer.startswith("error: no stored tool result")


def test_long_originals_come_in_pages(make_proxy, fake_upstream):
    proxy = make_proxy()
    policy = proxy.policies_dir / "small-pages.yaml"
    policy.write_text("tool_results:\n  read_page_chars: 2000\n")
    fake_upstream.then(Step(tool_calls=[internal_call()]), Step(content="ok"))
    httpx.post(f"{proxy.url}/p/small-pages/v1/chat/completions",
               json={"model": "gpt-4o", "messages": history(), "tools": TOOLS})
    answer = fake_upstream.chat_requests[1].json()["messages"][-1]["content"]
    assert answer.startswith("[lines 1-") and "start_line=" in answer and len(answer) < 2200
