"""The Responses-shaped fake upstream is what the official `openai` SDK expects (no proxy in between)."""

from __future__ import annotations

import json

import httpx
import openai
import orjson
import pytest

from tests.responses_upstream import (
    ERROR_STATUS,
    custom_tool_call,
    error_body,
    error_event,
    function_call,
    function_call_output,
    input_message,
    message_item,
    parse_stream,
    reasoning,
    response,
    response_stream,
)
from tests.servers import CLOSE, RESET, Step

TOOLS = [{"type": "function", "name": "shell", "description": "Runs a shell command and returns its output.",
          "strict": False,
          "parameters": {"type": "object",
                         "properties": {"command": {"type": "array", "items": {"type": "string"}},
                                        "workdir": {"type": "string"}},
                         "required": ["command"], "additionalProperties": False}}]
INPUT = [input_message("user", "run the tests")]
ARGS = json.dumps({"command": ["bash", "-lc", "pytest -x -q tests/test_app.py"], "workdir": "/home/dev/app"})
ENCRYPTED = "gAAAAABo" + "Zk3q" * 60
ITEMS = [
    reasoning("**Running the tests**\n\nThe user wants the suite run; call shell with pytest.", ENCRYPTED,
              id="rs_68a1"),
    message_item("Running the test suite now.", id="msg_68a2"),
    function_call("call_Q2x8mT4vR1", "shell", ARGS),
]
USAGE = {"input_tokens": 5120, "input_tokens_details": {"cached_tokens": 4096}, "output_tokens": 211,
         "output_tokens_details": {"reasoning_tokens": 128}}


@pytest.fixture
def client(upstream_server) -> openai.OpenAI:
    _, server = upstream_server
    return openai.OpenAI(api_key="sk-test", base_url=f"{server.url}/v1", max_retries=0, timeout=30)


def test_plain_response_parses(client, fake_upstream):
    fake_upstream.then(Step(content="plain answer", headers={"x-extra": "1"}))
    resp = client.responses.create(model="gpt-5", input=INPUT)
    assert resp.output_text == "plain answer" and resp.status == "completed"
    assert resp.output[0].type == "message" and resp.output[0].role == "assistant"
    assert resp.usage.input_tokens_details.cached_tokens == 0
    assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens
    assert resp._request_id == "req_fake" and resp.model == "gpt-5"
    (seen,) = fake_upstream.responses_requests
    assert seen.method == "POST" and seen.path == "/v1/responses"
    assert seen.headers["authorization"] == "Bearer sk-test"
    assert seen.json()["input"] == INPUT


def test_function_call_response_parses(client, fake_upstream):
    fake_upstream.then(Step(items=ITEMS), Step(payload=response([message_item("4 passed")], usage=USAGE,
                                                                response_id="resp_custom")))
    resp = client.responses.create(model="gpt-5-codex", input=INPUT, tools=TOOLS)
    assert [o.type for o in resp.output] == ["reasoning", "message", "function_call"]
    assert resp.output[0].encrypted_content == ENCRYPTED
    assert resp.output[0].summary[0].text.startswith("**Running the tests**")
    call = resp.output[2]
    assert (call.call_id, call.name, call.id) == ("call_Q2x8mT4vR1", "shell", "fc_Q2x8mT4vR1")
    assert json.loads(call.arguments)["command"][-1] == "pytest -x -q tests/test_app.py"
    assert resp.model == "gpt-5-codex"  # the reply names the requested model
    # The next turn sends the items back with the output; a payload is answered verbatim.
    next_input = [*INPUT, *ITEMS[1:], function_call_output("call_Q2x8mT4vR1", "4 passed")]
    resp = client.responses.create(model="gpt-5-codex", input=next_input)
    assert resp.id == "resp_custom" and resp.output_text == "4 passed"
    assert resp.usage.input_tokens_details.cached_tokens == 4096
    assert resp.usage.output_tokens_details.reasoning_tokens == 128 and resp.usage.total_tokens == 5331
    assert fake_upstream.responses_requests[1].json()["input"][-1]["type"] == "function_call_output"


def test_echo_default_plain_and_streamed(client, fake_upstream):
    assert client.responses.create(model="gpt-5", input="hello").output_text == "echo: hello"
    resp = client.responses.create(model="gpt-5", input=[
        input_message("developer", "<permissions instructions>x</permissions instructions>"),
        {"role": "user", "content": "first"}, input_message("assistant", "ok"),
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<env/>"},
                                                        {"type": "input_text", "text": "last"}]}])
    assert resp.output_text == "echo: last"
    with client.responses.stream(model="gpt-5", input=INPUT) as stream:
        assert stream.get_final_response().output_text == "echo: run the tests"
    assert fake_upstream.responses_requests[2].json()["stream"] is True


def test_streamed_response_assembles(client, fake_upstream):
    fake_upstream.then(Step(kind="stream", chunks=response_stream(ITEMS, usage=USAGE, pieces=3)))
    kinds = []
    with client.responses.stream(model="gpt-5", input=INPUT, tools=TOOLS) as stream:
        for ev in stream:
            kinds.append(ev.type)
        final = stream.get_final_response()
    assert final.output_text == "Running the test suite now."
    assert final.output[2].arguments == ARGS and final.output[0].encrypted_content == ENCRYPTED
    assert final.usage.output_tokens_details.reasoning_tokens == 128
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert kinds.count("response.function_call_arguments.delta") >= 2
    assert {"response.reasoning_summary_text.delta", "response.output_text.done",
            "response.content_part.done", "response.output_item.done"} <= set(kinds)


def test_create_stream_true_and_stream_step_from_items(client, fake_upstream):
    patch = "*** Begin Patch\n*** Update File: a.py\n@@\n-x = 1\n+x = 2\n*** End Patch"
    fake_upstream.then(Step(kind="stream", items=[custom_tool_call("call_P1", "apply_patch", patch)]))
    events = list(client.responses.create(model="gpt-5", input=INPUT, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done = [e for e in events if e.type == "response.custom_tool_call_input.done"]
    assert done[0].input == patch
    assert events[-1].type == "response.completed" and events[-1].response.output[0].input == patch


def test_stream_wire_sequence():
    items = [message_item("ab"), function_call("call_1", "shell", '{"command":["ls"]}')]
    chunks = response_stream(items)
    events = parse_stream(b"".join(chunks))
    assert len(events) == len(chunks) and all(c.endswith(b"\n\n") for c in chunks)
    assert all(e["_event"] == e["type"] for e in events)
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    assert events[0]["response"]["usage"] is None
    assert events[2]["item"]["content"] == [] and events[2]["item"]["status"] == "in_progress"
    assert [e["output_index"] for e in events[2:9]] == [0] * 7
    assert events[9]["item"]["arguments"] == "" and events[9]["output_index"] == 1
    assert "".join(e["delta"] for e in events[10:12]) == '{"command":["ls"]}'
    assert events[12]["arguments"] == '{"command":["ls"]}' and events[12]["name"] == "shell"
    assert events[13]["item"] == items[1]
    assert events[-1]["response"]["output"] == items and events[-1]["response"]["status"] == "completed"


def test_incomplete_and_reasoning_stream_shapes():
    events = parse_stream(b"".join(response_stream([reasoning(["one", "two"], "enc")], status="incomplete")))
    added = [e for e in events if e["type"] == "response.reasoning_summary_part.added"]
    assert [e["summary_index"] for e in added] == [0, 1]
    assert "encrypted_content" not in events[2]["item"] and events[-2]["item"]["encrypted_content"] == "enc"
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_error_body_raises(client, fake_upstream):
    fake_upstream.then(Step(kind="error", status=ERROR_STATUS["invalid_request_error"],
                            body=error_body("Your input exceeds the context window of this model.",
                                            code="context_length_exceeded", param="input")))
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="gpt-5", input=INPUT)
    assert info.value.code == "context_length_exceeded" and info.value.param == "input"
    assert info.value.body["type"] == "invalid_request_error"
    assert "context window" in info.value.message


def test_mid_stream_error_raises(client, fake_upstream):
    chunks = response_stream([message_item("partial answer")])[:5]
    fake_upstream.then(Step(kind="stream", chunks=[*chunks, error_event("The server had an error",
                                                                        sequence_number=5)]))
    with pytest.raises(openai.APIError, match="The server had an error"), \
            client.responses.stream(model="gpt-5", input=INPUT) as stream:
        stream.get_final_response()


def test_other_routes_unchanged(upstream_server, fake_upstream, client):
    fake_upstream.then(Step(content="hi"))
    assert client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}]) \
        .choices[0].message.content == "hi"
    echoed = client.post("/responses/resp_1/cancel", cast_to=object, body={"a": 1})
    assert echoed == {"a": 1}  # sub-paths of /v1/responses still reach the byte-echo route
    assert len(fake_upstream.chat_requests) == 1 and fake_upstream.responses_requests == []
    assert orjson.loads(fake_upstream.seen[-1].body) == {"a": 1}


@pytest.mark.parametrize(("fault", "error"), [(RESET, httpx.ReadError), (CLOSE, httpx.RemoteProtocolError)])
def test_stream_faults_break_the_connection(upstream_server, fake_upstream, fault, error):
    _, server = upstream_server
    fake_upstream.then(Step(kind="stream", items=[message_item("partial answer")], fault=fault))
    got = b""
    with pytest.raises(error), httpx.stream("POST", f"{server.url}/v1/responses", json={"input": "x"}) as r:
        for chunk in r.iter_raw():
            got += chunk
    assert parse_stream(got)[-1]["type"] == "response.completed"  # all events out, then the break


def test_raw_and_by_model_answers(upstream_server, fake_upstream, client):
    _, server = upstream_server
    fake_upstream.then(Step(kind="raw", status=502, body=b"<html>bad gateway</html>",
                            headers={"content-type": "text/html"}))
    r = httpx.post(f"{server.url}/v1/responses", json={"model": "gpt-5", "input": "x"})
    assert (r.status_code, r.content) == (502, b"<html>bad gateway</html>")
    fake_upstream.by_model["gpt-5-mini"] = lambda seen: Step(content=f"summary of {len(seen.body)} bytes")
    resp = client.responses.create(model="gpt-5-mini", input="summarize")
    assert resp.output_text.startswith("summary of ") and resp.model == "gpt-5-mini"
