"""The OpenAI Responses API through the real server with the official openai SDK's `responses.create`:
plain and streamed answers, a stateless tool loop forwarded byte for byte, a summarized output read back
by the model (the client never sees the internal function_call), mixed internal and client calls,
previous_response_id passed through, compaction and reasoning items kept, errors and refusals."""

from __future__ import annotations

import httpx
import openai
import orjson
import pytest

from tests.responses_upstream import (
    custom_tool_call,
    error_body,
    function_call,
    function_call_output,
    input_message,
    message_item,
    reasoning,
    response_stream,
)
from tests.servers import CLOSE, Seen, Step

MODEL = "gpt-5"
BIG = "\n".join(f"line {i}: value={i * 7} path=src/mod_{i % 13}.py" for i in range(500))
TOOLS = [{"type": "function", "name": "read_file", "parameters": {"type": "object", "properties": {}}}]


def history(result: str = BIG) -> list[dict]:
    return [input_message("user", "Summarize big.log"),
            reasoning("I should read it.", "ENCRYPTED-1", id="rs_1"),
            function_call("call_read", "read_file", '{"path": "big.log"}'),
            function_call_output("call_read", result)]


def internal(call_id: str = "call_int") -> dict:
    return function_call(call_id, "read_tool_result", '{"call_id": "call_read"}')


def exchanges(proxy) -> list[dict]:
    proxy.flush()
    return list(proxy.query("select * from exchanges order by rowid"))


def test_plain_answer_headers_and_archive(proxy, fake_upstream):
    fake_upstream.then(Step(content="hello"))
    raw = proxy.client().responses.with_raw_response.create(model=MODEL, input="hi", instructions="Be brief.")
    assert raw.parse().output_text == "hello"
    assert raw.headers["x-ctxproxy-gate"] == "pass" and raw.headers["x-ctxproxy-policy"] == "default"
    [row] = exchanges(proxy)
    assert row["route"] == "responses" and row["status"] == 200
    assert row["prompt_tokens"] == 36 and row["completion_tokens"] == 18 and row["cached_tokens"] == 0
    assert orjson.loads(row["usage"])["output_tokens_details"] == {"reasoning_tokens": 0}


def test_unchanged_request_goes_upstream_byte_for_byte(proxy, fake_upstream):
    body = orjson.dumps({"model": MODEL, "instructions": "You are Codex.", "input": history("small"),
                         "tools": TOOLS, "store": False, "include": ["reasoning.encrypted_content"],
                         "prompt_cache_key": "pck-1", "metadata": {"k": "v"}, "x-unknown": [1]})
    fake_upstream.then(Step(content="done"))
    response = httpx.post(f"{proxy.url}/v1/responses", content=body, headers={"authorization": "Bearer k"})
    assert response.status_code == 200 and response.headers["x-ctxproxy-session"] == "pck-1"
    assert fake_upstream.responses_requests[0].body == body


def second_round(seen: Seen) -> Step:
    sent = seen.json()["input"]
    assert sent[-1] == {"type": "function_call_output", "call_id": "call_int", "output": BIG}
    assert sent[-2]["name"] == "read_tool_result" and sent[-3]["encrypted_content"] == "ENCRYPTED-2"
    return Step(items=[message_item("The log has 500 lines.")])


def test_summarized_output_is_read_back_and_the_client_never_sees_the_call(proxy, fake_upstream):
    fake_upstream.then(Step(items=[reasoning("read the original", "ENCRYPTED-2", id="rs_2"), internal()]),
                       second_round)
    raw = proxy.client().responses.with_raw_response.create(
        model=MODEL, instructions="You are Codex.", input=history(), tools=TOOLS, store=False)
    result = raw.parse()
    assert [i.type for i in result.output] == ["message"] and result.output_text == "The log has 500 lines."
    assert result.usage.input_tokens == 72  # both rounds
    first = fake_upstream.responses_requests[0].json()
    replaced = first["input"][3]["output"]
    assert "call_read" in replaced and "read_tool_result" in replaced and len(replaced) < len(BIG) / 5
    assert first["input"][:3] == history()[:3] and first["instructions"] == "You are Codex."
    assert [t["name"] for t in first["tools"]] == ["read_file", "read_tool_result", "recall"]
    assert first["tools"][1]["parameters"]["required"] == ["call_id"]
    assert [r["status"] for r in exchanges(proxy)] == [200, 200]


def test_streamed_rounds_are_one_response(proxy, fake_upstream):
    fake_upstream.then(
        Step(kind="stream", items=[message_item("Let me look. ", id="msg_1"), internal()]),
        lambda seen: (second_round_stream(seen), Step(kind="stream", items=[message_item("500 lines.")]))[1])
    with proxy.client().responses.stream(model=MODEL, input=history(), tools=TOOLS) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert final.output_text == "Let me look. 500 lines." and final.id == "resp_fake"
    assert [e.type for e in events].count("response.created") == 1
    assert [e.type for e in events].count("response.completed") == 1
    sequence = [e.sequence_number for e in events]
    assert sequence == list(range(len(events)))
    assert not any(getattr(getattr(e, "item", None), "type", "") == "function_call" for e in events)
    assert [r["status"] for r in exchanges(proxy)] == [200, 200]


def second_round_stream(seen: Seen) -> None:
    assert seen.json()["input"][-1]["output"] == BIG


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_mixed_internal_and_client_calls(proxy, fake_upstream, stream):
    items = [message_item("Both."), internal(), function_call("call_client", "read_file", '{"path": "b"}')]
    fake_upstream.then(Step(kind="stream", items=items) if stream else Step(items=items))
    client = proxy.client()
    kwargs = {"model": MODEL, "input": history(), "tools": TOOLS, "store": False}
    if stream:
        with client.responses.stream(**kwargs) as events:
            result = events.get_final_response()
    else:
        result = client.responses.create(**kwargs)
    assert [i.type for i in result.output] == ["message", "function_call"]
    assert result.output[1].call_id == "call_client"
    # Codex sends the turn back with its call's output; ours go back in, byte for byte, with their output.
    fake_upstream.then(Step(content="ok"))
    follow = [*history(), *(i.model_dump(exclude_none=True) for i in result.output),
              function_call_output("call_client", "B contents")]
    client.responses.create(**(kwargs | {"input": follow}))
    sent = fake_upstream.responses_requests[-1].json()["input"]
    calls = [i["call_id"] for i in sent if i.get("type") == "function_call"]
    outputs = [i["call_id"] for i in sent if i.get("type") == "function_call_output"]
    assert calls == ["call_read", "call_client", "call_int"] and sorted(outputs) == sorted(calls)
    assert next(i for i in sent if i.get("call_id") == "call_int" and "output" in i)["output"] == BIG


def test_previous_response_id_is_passed_through_and_said_so(proxy, fake_upstream):
    body = orjson.dumps({"model": MODEL, "previous_response_id": "resp_prev", "input": [
        function_call_output("call_read", BIG)], "tools": TOOLS})
    fake_upstream.then(Step(content="ok"))
    response = httpx.post(f"{proxy.url}/v1/responses", content=body, headers={"authorization": "Bearer k"})
    assert response.status_code == 200 and response.headers["x-ctxproxy-state"] == "provider"
    assert fake_upstream.responses_requests[0].body == body  # never break a chain
    assert exchanges(proxy)[0]["route"] == "responses"


def test_compaction_item_and_what_precedes_it_are_the_providers(make_proxy, fake_upstream):
    proxy = make_proxy()
    (proxy.policies_dir / "small.yaml").write_text("window: {max_tokens: 1200}\n")
    early = history()
    compaction = {"type": "compaction", "id": "cmp_1", "encrypted_content": "COMPACTED"}
    later = [input_message("user", "next"), reasoning("r", "ENC-3", id="rs_3"),
             function_call("call_b", "read_file", '{"path": "b"}'), function_call_output("call_b", BIG),
             input_message("user", "and now?")]
    fake_upstream.then(Step(content="ok"))
    proxy.client().responses.create(model=MODEL, input=[*early, compaction, *later], tools=TOOLS,
                                    extra_headers={"x-ctxproxy-policy": "small"})
    sent = fake_upstream.responses_requests[0].json()["input"]
    assert sent[:5] == [*early, compaction]  # kept as sent: the provider compacted it
    assert "read_tool_result" in orjson.dumps(sent[5:]).decode()  # ours acts after it


def test_refusal_is_context_length_exceeded_with_checkpoint(make_proxy, fake_upstream):
    proxy = make_proxy()
    (proxy.policies_dir / "tiny.yaml").write_text(
        "budget: {max_input_tokens: 300}\nwindow: {enabled: false}\n")
    with pytest.raises(openai.BadRequestError) as raised:
        proxy.client(base_url=f"{proxy.url}/p/tiny/v1").responses.create(model=MODEL, input="word " * 2000)
    error = raised.value.body
    assert error["code"] == "context_length_exceeded" and error["param"] == "input"
    assert error["checkpoint_id"].startswith("ckpt-")
    assert fake_upstream.responses_requests == []


@pytest.mark.parametrize("body, param", [
    (b'{"model": "m"}', "input"),
    (b'{"model": "m", "input": [{"type": "function_call", "name": "x"}]}', "input[0].call_id"),
    (b'{"model": "m", "input": 5}', "input"),
], ids=["no-input", "call-without-id", "input-number"])
def test_client_mistakes_are_openai_shaped_400s(proxy, fake_upstream, body, param):
    response = httpx.post(f"{proxy.url}/v1/responses", content=body, headers={"authorization": "Bearer k"})
    assert response.status_code == 400 and response.json()["error"]["param"] == param
    assert fake_upstream.responses_requests == []


def test_other_responses_routes_pass_through(proxy, fake_upstream):
    fake_upstream.then(Step(payload={"id": "resp_1", "object": "response"}))
    response = httpx.get(f"{proxy.url}/v1/responses/resp_1/input_items",
                         headers={"authorization": "Bearer k"})
    assert response.status_code == 200 and fake_upstream.seen[-1].path == "/v1/responses/resp_1/input_items"


def test_a_stream_cut_short_raises_in_the_sdk(proxy, fake_upstream):
    cut = response_stream([message_item("partial")])[:4]
    fake_upstream.then(Step(kind="stream", chunks=cut, fault=CLOSE))
    with pytest.raises(openai.APIError), proxy.client().responses.stream(model=MODEL, input="hi") as stream:
        stream.get_final_response()
    assert "stream" in exchanges(proxy)[-1]["error"]


def test_upstream_error_reaches_the_sdk(proxy, fake_upstream):
    fake_upstream.then(Step(kind="error", status=429, body=error_body("slow down", "rate_limit_error")))
    with pytest.raises(openai.RateLimitError):
        proxy.client().responses.create(model=MODEL, input="x")


def test_slash_command_answers_in_responses_shape(proxy, fake_upstream):
    client = proxy.client()
    assert "big.log" in client.responses.create(model=MODEL, input="/recall big.log").output_text
    with client.responses.stream(model=MODEL, input="/pins") as stream:
        assert stream.get_final_response().output_text
    assert fake_upstream.responses_requests == []


def test_custom_tool_calls_reach_the_client(proxy, fake_upstream):
    patch = "*** Begin Patch\n*** Update File: a.py\n-x\n+y\n*** End Patch"
    fake_upstream.then(Step(kind="stream", items=[custom_tool_call("call_patch", "apply_patch", patch)]))
    tools = [*TOOLS, {"type": "custom", "name": "apply_patch"}]
    with proxy.client().responses.stream(model=MODEL, input=history(), tools=tools) as stream:
        final = stream.get_final_response()
    assert [i.type for i in final.output] == ["custom_tool_call"] and final.output[0].input == patch


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_rounds_that_run_out_say_so(make_proxy, fake_upstream, stream):
    proxy = make_proxy()
    (proxy.policies_dir / "one.yaml").write_text("tool_results: {max_internal_rounds: 1}\n")
    again = Step(kind="stream", items=[internal("call_2")]) if stream else Step(items=[internal("call_2")])
    first = Step(kind="stream", items=[internal()]) if stream else Step(items=[internal()])
    fake_upstream.then(first, again)
    client = proxy.client(base_url=f"{proxy.url}/p/one/v1")
    kwargs = {"model": MODEL, "input": history(), "tools": TOOLS}
    if stream:
        with client.responses.stream(**kwargs) as events:
            result = events.get_final_response()
    else:
        result = client.responses.create(**kwargs)
    assert "stopped after 1 read_tool_result rounds" in result.output_text
    assert all(i.type != "function_call" for i in result.output)
