"""No silent ends: an upstream that breaks off, stalls, stops short or talks nonsense, through the real
server, on the plain path and the internal-tools path, streaming and not.

A broken stream must end with an OpenAI-shaped error event and no [DONE] (the openai SDK raises), a
broken whole answer must be an OpenAI-shaped 502/504, and the archive must name the true cause.
"""

from __future__ import annotations

import socket
import time

import httpx
import openai
import orjson
import pytest

from tests.servers import CLOSE, RESET, Step, huge_stream, sse, stream_chunks
from tests.test_rounds import BIG, TOOLS, history, internal_call

USER = [{"role": "user", "content": "hello"}]
HEAD = stream_chunks(["Hel", "lo"])[:3]  # role chunk and two content deltas: no finish, no [DONE]


def exchanges(proxy) -> list[dict]:
    proxy.flush()
    return list(proxy.query("select status, error, upstream_ms, stream from exchanges order by rowid"))


def raw_stream(proxy, messages, tools=None, timeout: float = 30) -> tuple[int, bytes]:
    body = {"model": "gpt-4o", "stream": True, "messages": messages}
    if tools:
        body["tools"] = tools
    with httpx.stream("POST", f"{proxy.url}/v1/chat/completions", json=body, timeout=timeout,
                      headers={"authorization": "Bearer sk-test-key"}) as response:
        return response.status_code, b"".join(response.iter_bytes())


def data_events(raw: bytes) -> list[bytes]:
    return [e[len(b"data: "):] for e in raw.replace(b"\r\n", b"\n").split(b"\n\n") if e.startswith(b"data: ")]


def sdk_stream(proxy, messages, tools=None) -> tuple[list, openai.APIError]:
    """Read a stream with the openai SDK until it raises; what it yielded before, and the error."""
    got = []
    kwargs = {"tools": tools} if tools else {}
    stream = proxy.client().chat.completions.create(model="gpt-4o", messages=messages, stream=True, **kwargs)
    with pytest.raises(openai.APIError) as raised:
        for chunk in stream:
            got.append(chunk)
    return got, raised.value


def text_of(chunks) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


@pytest.fixture
def slow_proxy(make_proxy, fake_upstream):
    """A proxy whose upstream read timeout is short, for stalls."""
    return make_proxy({"upstream": {"timeout_s": 0.5}})


# ----------------------------------------------------------------------------------- plain stream

@pytest.mark.parametrize(("step", "code", "cause"), [
    (Step(kind="stream", chunks=HEAD, fault=RESET), "upstream_stream_broken",
     "upstream stream broke off: ReadError"),
    (Step(kind="stream", chunks=HEAD, fault=CLOSE), "upstream_stream_broken",
     "upstream stream broke off: RemoteProtocolError: peer closed connection"),
    (Step(kind="stream", chunks=HEAD), "upstream_stream_broken",
     "upstream stream ended without a finish_reason or [DONE]"),
], ids=["reset", "close", "clean-close-cut-short"])
def test_plain_stream_that_breaks_off_ends_with_an_error_event(proxy, fake_upstream, step, code, cause):
    fake_upstream.then(step)
    got, error = sdk_stream(proxy, USER)
    assert text_of(got) == "Hello"  # what came before the break still reached the client
    assert error.code == code and error.type == "upstream_error"
    assert error.message.startswith(cause)
    [row] = exchanges(proxy)
    assert row["error"].startswith(cause) and row["status"] == 200 and row["upstream_ms"] > 0


def test_plain_stream_error_event_is_the_last_thing_and_no_done(proxy, fake_upstream):
    fake_upstream.then(Step(kind="stream", chunks=HEAD, fault=CLOSE))
    status, raw = raw_stream(proxy, USER)
    assert status == 200
    assert raw.startswith(b"".join(HEAD))  # relayed byte for byte up to the break
    events = data_events(raw)
    assert b"[DONE]" not in events
    last = orjson.loads(events[-1])
    assert set(last) == {"error"} and last["error"]["param"] is None
    assert last["error"]["code"] == "upstream_stream_broken" and last["error"]["type"] == "upstream_error"
    assert raw.endswith(b"}\n\n")


def test_plain_stream_stall_is_a_timeout(slow_proxy, fake_upstream):
    fake_upstream.then(Step(kind="stream", chunks=HEAD, hang_after_chunks=True))
    got, error = sdk_stream(slow_proxy, USER)
    assert text_of(got) == "Hello"
    assert error.code == "upstream_timeout"
    assert fake_upstream.saw_disconnect.wait(10)  # the stalled upstream call was given up
    [row] = exchanges(slow_proxy)
    assert row["error"].startswith("upstream stream broke off: ReadTimeout")
    assert "no data for 0.5 s" in row["error"]
    assert row["upstream_ms"] >= 500  # from opening the request to the end of the stream


def test_plain_stream_cut_mid_event_ends_with_a_clean_error_event(proxy, fake_upstream):
    half = b'data: {"id":"chatcmpl-stream","object":"chat.completion.chunk","choi'
    fake_upstream.then(Step(kind="stream", chunks=[*HEAD, half], fault=CLOSE))
    _status, raw = raw_stream(proxy, USER)
    assert half not in raw  # never half an event: the SSE parser sees whole events only
    assert orjson.loads(data_events(raw)[-1])["error"]["code"] == "upstream_stream_broken"
    fake_upstream.then(Step(kind="stream", chunks=[*HEAD, half], fault=CLOSE))
    got, error = sdk_stream(proxy, USER)  # an APIError, not a JSONDecodeError on half an event
    assert text_of(got) == "Hello" and "(mid-event)" in error.message
    assert all("(mid-event)" in row["error"] for row in exchanges(proxy))


def test_plain_stream_last_event_without_blank_line_is_terminated(proxy, fake_upstream):
    chunks = stream_chunks(["Hel", "lo"])
    finish = chunks[-2].rstrip(b"\n")  # the finish chunk, then the upstream closes cleanly
    fake_upstream.then(Step(kind="stream", chunks=[*chunks[:-2], finish]))
    stream = proxy.client().chat.completions.create(model="gpt-4o", messages=USER, stream=True)
    chunks_seen = list(stream)
    assert text_of(chunks_seen) == "Hello"
    assert chunks_seen[-1].choices[0].finish_reason == "stop"  # the SDK saw the unterminated event
    [row] = exchanges(proxy)
    assert row["error"] is None


def test_plain_stream_done_without_blank_line_is_whole(proxy, fake_upstream):
    chunks = stream_chunks(["ok"])
    fake_upstream.then(Step(kind="stream", chunks=[*chunks[:-1], b"data: [DONE]"]))
    _status, raw = raw_stream(proxy, USER)
    assert raw.endswith(b"data: [DONE]\n\n") and b"error" not in raw
    assert exchanges(proxy)[0]["error"] is None


def test_plain_stream_with_an_upstream_error_event_relays_it(proxy, fake_upstream):
    error = {"error": {"message": "overloaded, try later", "type": "server_error", "code": None,
                       "param": None}}
    fake_upstream.then(*[Step(kind="stream", chunks=[*HEAD, sse(error)])] * 2)
    _got, raised = sdk_stream(proxy, USER)
    assert raised.message == "overloaded, try later"
    _, raw = raw_stream(proxy, USER)
    assert data_events(raw)[-1] == orjson.dumps(error)  # the upstream's own, and nothing after it
    assert exchanges(proxy)[0]["error"] == "upstream sent an error in the stream: overloaded, try later"


def test_plain_stream_after_done_a_broken_connection_adds_nothing(proxy, fake_upstream):
    fake_upstream.then(Step(kind="stream", chunks=stream_chunks(["ok"]), fault=RESET))
    stream = proxy.client().chat.completions.create(model="gpt-4o", messages=USER, stream=True)
    assert text_of(list(stream)) == "ok"


def test_plain_stream_error_status_is_relayed_untouched(proxy, fake_upstream):
    body = b'{"error":{"message":"slow down","type":"rate_limit","code":"rate_limit_exceeded"}}'
    fake_upstream.then(Step(kind="error", status=429, body=body))
    status, raw = raw_stream(proxy, USER)
    assert status == 429 and raw == body


def test_plain_huge_stream_arrives_whole(proxy, fake_upstream):
    size = 4 * 1024 * 1024
    fake_upstream.then(Step(kind="stream", chunks=huge_stream(size)))
    stream = proxy.client().chat.completions.create(model="gpt-4o", messages=USER, stream=True)
    assert text_of(list(stream)) == "x" * size
    assert exchanges(proxy)[0]["error"] is None


# ------------------------------------------------------------------------------- plain, not stream

def test_plain_answer_reset_mid_body_is_an_openai_shaped_502(proxy, fake_upstream):
    body = orjson.dumps({"id": "x", "choices": [{"message": {"role": "assistant", "content": "y" * 5000}}]})
    fake_upstream.then(Step(kind="raw", body=body, fault=RESET, cut_after=1000))
    with pytest.raises(openai.InternalServerError) as raised:
        proxy.client().chat.completions.create(model="gpt-4o", messages=USER)
    assert raised.value.status_code == 502 and raised.value.code == "upstream_stream_broken"
    [row] = exchanges(proxy)
    assert row["status"] == 502 and "broke off its response: ReadError" in row["error"]


def test_plain_answer_closed_mid_body_names_the_cause(proxy, fake_upstream):
    fake_upstream.then(Step(kind="raw", body=b'{"id": "' + b"z" * 4000 + b'"}', fault=CLOSE, cut_after=10))
    response = httpx.post(f"{proxy.url}/v1/chat/completions", json={"model": "gpt-4o", "messages": USER})
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_stream_broken"
    assert "RemoteProtocolError: peer closed connection" in exchanges(proxy)[0]["error"]


def test_plain_answer_stall_mid_body_is_a_504(slow_proxy, fake_upstream):
    fake_upstream.then(Step(kind="stream", chunks=[b'{"id": "chat'], hang_after_chunks=True))
    with pytest.raises(openai.APIStatusError) as raised:
        slow_proxy.client().chat.completions.create(model="gpt-4o", messages=USER)
    assert raised.value.status_code == 504 and raised.value.code == "upstream_timeout"
    assert "ReadTimeout" in exchanges(slow_proxy)[0]["error"]


@pytest.mark.parametrize("stream", [False, True])
def test_stall_before_headers_is_a_504(slow_proxy, fake_upstream, stream):
    fake_upstream.then(Step(kind="hang"))
    response = httpx.post(f"{slow_proxy.url}/v1/chat/completions", timeout=30,
                          json={"model": "gpt-4o", "stream": stream, "messages": USER})
    assert response.status_code == 504 and response.json()["error"]["code"] == "upstream_timeout"
    [row] = exchanges(slow_proxy)
    assert row["status"] == 504 and "timed out" in row["error"]


def test_plain_huge_answer_arrives_whole(proxy, fake_upstream):
    fake_upstream.then(Step(content="y" * (4 * 1024 * 1024)))
    answer = proxy.client().chat.completions.create(model="gpt-4o", messages=USER)
    assert len(answer.choices[0].message.content) == 4 * 1024 * 1024


# --------------------------------------------------------------------------- internal tools, stream

def round_one() -> Step:
    """A first round calling read_tool_result, so a second round follows."""
    return Step(kind="stream", chunks=stream_chunks(["Let me look. "], tool_calls=[internal_call()],
                                                    response_id="chatcmpl-A"))


@pytest.mark.parametrize(("chunks", "fault", "cause"), [
    (HEAD, RESET, "upstream stream broke off: ReadError"),
    (HEAD, CLOSE, "upstream stream broke off: RemoteProtocolError"),
    (HEAD, None, "upstream stream ended without a finish_reason or [DONE]"),
    (stream_chunks([], tool_calls=[internal_call()])[:3], CLOSE, "upstream stream broke off"),
], ids=["reset", "close", "cut-short", "close-inside-held-tool-call"])
def test_rounds_stream_that_breaks_off_ends_with_an_error_event(proxy, fake_upstream, chunks, fault, cause):
    fake_upstream.then(Step(kind="stream", chunks=chunks, fault=fault))
    got, error = sdk_stream(proxy, history(), TOOLS)
    assert error.code == "upstream_stream_broken" and error.message.startswith(cause)
    assert not any(c.choices and c.choices[0].delta.tool_calls for c in got)
    [row] = exchanges(proxy)
    assert row["error"].startswith(cause) and row["upstream_ms"] > 0


def test_rounds_stream_stall_is_a_timeout(make_proxy, fake_upstream):
    proxy = make_proxy({"upstream": {"timeout_s": 0.5}})
    fake_upstream.then(Step(kind="stream", chunks=HEAD, hang_after_chunks=True))
    got, error = sdk_stream(proxy, history(), TOOLS)
    assert text_of(got) == "Hello" and error.code == "upstream_timeout"
    [row] = exchanges(proxy)
    assert row["error"].startswith("upstream stream broke off: ReadTimeout") and row["upstream_ms"] >= 500


@pytest.mark.parametrize("second", [
    Step(kind="stream", chunks=HEAD, fault=RESET),
    Step(kind="stream", chunks=HEAD),
    Step(kind="error", status=500, body=b'{"error":{"message":"model crashed","type":"server_error"}}'),
    Step(kind="error", status=502, body=b"<html>bad gateway</html>"),
    Step(kind="raw", status=500, body=b'{"error": "' + b"e" * 3000 + b'"}', fault=CLOSE, cut_after=20),
], ids=["reset", "cut-short", "500-json", "502-html", "error-body-broken"])
def test_rounds_stream_later_round_failure_ends_with_an_error_event(proxy, fake_upstream, second):
    fake_upstream.then(round_one(), second)
    got, error = sdk_stream(proxy, history(), TOOLS)
    assert text_of(got).startswith("Let me look. ")
    assert error.message
    rows = exchanges(proxy)
    assert len(rows) == 2 and rows[0]["error"] is None and rows[1]["error"]
    assert "client disconnected" not in rows[1]["error"]
    if second.kind == "error":
        assert rows[1]["status"] == second.status and f"HTTP {second.status}" in rows[1]["error"]
    if second.status == 500 and second.kind == "error":
        assert error.message == "model crashed"  # the upstream's own error object


def test_rounds_stream_later_round_stall_before_headers(make_proxy, fake_upstream):
    proxy = make_proxy({"upstream": {"timeout_s": 0.5}})
    fake_upstream.then(round_one(), Step(kind="hang"))
    _status, raw = raw_stream(proxy, history(), TOOLS)
    events = data_events(raw)
    assert b"[DONE]" not in events
    assert orjson.loads(events[-1])["error"]["code"] == "upstream_timeout"
    rows = exchanges(proxy)
    assert len(rows) == 2 and rows[1]["status"] == 504 and "timed out" in rows[1]["error"]


@pytest.mark.parametrize("bad", [
    b"data: [1,2,3]\n\n",
    b'data: {"choices":[null]}\n\n',
    b'data: {"choices":"nope"}\n\n',
    b'data: {"choices":[{"index":0,"delta":"text"}]}\n\n',
    b'data: {"choices":[{"index":0,"delta":{"tool_calls":"x"}}]}\n\n',
    b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":"0","function":{"name":5}}]}}]}\n\n',
    b'data: {"usage":7}\n\n',
    b"data: this is not json\n\n",
], ids=["list", "null-choice", "choices-str", "delta-str", "tool-calls-str", "bad-call", "usage-int",
        "not-json"])
def test_rounds_stream_malformed_events_are_relayed_and_recorded(proxy, fake_upstream, bad):
    chunks = stream_chunks(["Hel", "lo"])
    fake_upstream.then(Step(kind="stream", chunks=[*chunks[:2], bad, *chunks[2:]]))
    status, raw = raw_stream(proxy, history(), TOOLS)
    assert status == 200
    assert bad in raw  # the upstream's content, relayed untouched
    events = data_events(raw)
    assert events[-1] == b"[DONE]"  # and the answer around it ends normally
    [row] = exchanges(proxy)
    assert row["error"].startswith("malformed upstream event relayed untouched")


@pytest.mark.parametrize("round_no", [0, 1])
def test_rounds_stream_upstream_error_event_is_relayed_and_ends_the_stream(proxy, fake_upstream, round_no):
    error = {"error": {"message": "context too long", "type": "invalid_request_error", "code": None,
                       "param": None}}
    failing = Step(kind="stream", chunks=[*HEAD, sse(error), *stream_chunks(["more"])])
    fake_upstream.then(*([round_one()] if round_no else []), failing)
    got, raised = sdk_stream(proxy, history(), TOOLS)
    assert raised.message == "context too long"
    assert "more" not in text_of(got)
    rows = exchanges(proxy)
    assert rows[-1]["error"] == "upstream sent an error in the stream: context too long"


def test_rounds_stream_last_event_without_blank_line_still_counts(proxy, fake_upstream):
    chunks = stream_chunks([], tool_calls=[internal_call()])
    fake_upstream.then(Step(kind="stream", chunks=[*chunks[:-2], chunks[-2].rstrip(b"\n")]),
                       Step(kind="stream", chunks=stream_chunks(["done"])))
    stream = proxy.client().chat.completions.create(model="gpt-4o", messages=history(), tools=TOOLS,
                                                     stream=True)
    assert text_of(list(stream)) == "done"
    assert [r["error"] for r in exchanges(proxy)] == [None, None]


def test_rounds_huge_stream_arrives_whole(proxy, fake_upstream):
    size = 4 * 1024 * 1024
    fake_upstream.then(round_one(), Step(kind="stream", chunks=huge_stream(size)))
    stream = proxy.client().chat.completions.create(model="gpt-4o", messages=history(), tools=TOOLS,
                                                     stream=True)
    assert text_of(list(stream)) == "Let me look. " + "x" * size


def test_rounds_stream_client_disconnect_cancels_upstream_and_says_so(proxy, fake_upstream):
    fake_upstream.then(Step(kind="stream", chunks=stream_chunks(["first"])[:2], hang_after_chunks=True))
    body = orjson.dumps({"model": "gpt-4o", "stream": True, "messages": history(), "tools": TOOLS})
    sock = socket.create_connection(("127.0.0.1", proxy.server.port))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                 b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    received = b""
    while b"first" not in received:
        received += sock.recv(65536)
    sock.close()
    assert fake_upstream.saw_disconnect.wait(10)
    deadline = time.monotonic() + 10
    while not (rows := exchanges(proxy)) and time.monotonic() < deadline:  # archived as the stream ends
        time.sleep(0.02)
    assert rows and "client disconnected" in rows[0]["error"]


# ----------------------------------------------------------------------- internal tools, not stream

@pytest.mark.parametrize("body", [
    b"not json at all",
    b"[1,2,3]",
    b'{"choices":[null]}',
    b'{"choices":"x"}',
    b'{"choices":[{"message":null}]}',
    b'{"choices":[{"message":{"role":"assistant","tool_calls":"x"}}]}',
    b'{"choices":[{"message":{"role":"assistant","tool_calls":[null]}}]}',
    b'{"error":{"message":"odd but 200"}}',
], ids=["text", "list", "null-choice", "choices-str", "null-message", "tool-calls-str", "null-call",
        "error-200"])
def test_rounds_malformed_answer_is_relayed_untouched(proxy, fake_upstream, body):
    fake_upstream.then(Step(kind="raw", body=body, headers={"content-type": "application/json"}))
    response = httpx.post(f"{proxy.url}/v1/chat/completions",
                          json={"model": "gpt-4o", "messages": history(), "tools": TOOLS})
    assert response.status_code == 200 and response.content == body
    [row] = exchanges(proxy)
    assert row["error"].startswith("upstream answer is not a chat completion")


def test_rounds_malformed_later_answer_is_relayed_untouched(proxy, fake_upstream):
    fake_upstream.then(Step(tool_calls=[internal_call()]), Step(kind="raw", body=b'{"choices": 5}'))
    response = httpx.post(f"{proxy.url}/v1/chat/completions",
                          json={"model": "gpt-4o", "messages": history(), "tools": TOOLS})
    assert response.status_code == 200 and response.content == b'{"choices": 5}'
    rows = exchanges(proxy)
    assert rows[0]["error"] is None and "not a chat completion" in rows[1]["error"]


@pytest.mark.parametrize(("second", "status", "code", "cause"), [
    (Step(kind="error", status=500, body=b'{"error":{"message":"model crashed"}}'), 500, None, "HTTP 500"),
    (Step(kind="raw", body=b'{"id": "' + b"q" * 5000 + b'"}', fault=RESET, cut_after=100), 502,
     "upstream_stream_broken", "ReadError"),
    (Step(kind="hang"), 504, "upstream_timeout", "timed out"),
], ids=["500", "reset", "stall"])
def test_rounds_later_round_failure_is_an_openai_shaped_error(make_proxy, fake_upstream, second, status,
                                                              code, cause):
    proxy = make_proxy({"upstream": {"timeout_s": 0.5}})
    fake_upstream.then(Step(tool_calls=[internal_call()]), second)
    with pytest.raises(openai.APIStatusError) as raised:
        proxy.client().chat.completions.create(model="gpt-4o", messages=history(), tools=TOOLS)
    assert raised.value.status_code == status
    if code:
        assert raised.value.code == code
    rows = exchanges(proxy)
    assert len(rows) == 2 and rows[0]["error"] is None
    assert rows[1]["status"] == status and cause in rows[1]["error"]


def test_rounds_answer_with_wrong_usage_still_works(proxy, fake_upstream):
    first = orjson.dumps({"id": "a", "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": None, "tool_calls": [internal_call()]}}], "usage": "lots"})
    fake_upstream.then(Step(kind="raw", body=first), Step(content="fine"))
    answer = proxy.client().chat.completions.create(model="gpt-4o", messages=history(), tools=TOOLS)
    assert answer.choices[0].message.content == "fine"
    assert fake_upstream.chat_requests[1].json()["messages"][-1]["content"] == BIG
