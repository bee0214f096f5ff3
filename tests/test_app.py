"""The proxy core through a real uvicorn socket, with the official openai SDK as the client."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import httpx
import openai
import orjson
import pytest

from tests.anthropic_upstream import message_stream, text
from tests.responses_upstream import message_item, response_stream
from tests.servers import Step, stream_chunks


def test_non_streaming_completion_round_trip(proxy, fake_upstream):
    client = proxy.client()
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hello there"}])
    result = raw.parse()
    assert result.choices[0].message.content == "echo: hello there"
    assert result.usage.prompt_tokens_details.cached_tokens == 5
    assert raw.headers["x-ctxproxy-policy"] == "default"
    assert raw.headers["x-ctxproxy-gate"] == "pass"
    assert raw.headers["x-ctxproxy-session"].startswith("fp-")
    assert int(raw.headers["x-ctxproxy-tokens-before"]) > 0
    assert raw.headers["x-upstream"] == "fake"  # upstream headers are relayed
    assert fake_upstream.chat_requests[0].headers["authorization"] == "Bearer sk-test-key"


def test_streaming_completion_with_multibyte_split_across_chunks(proxy, fake_upstream):
    chunks = stream_chunks(["Grüße ", "aus ", "東京 🚀"])
    # Cut every chunk in the middle of its bytes, including inside multi-byte characters.
    blob = b"".join(chunks)
    pieces = [blob[i:i + 7] for i in range(0, len(blob), 7)]
    broken = 0
    for piece in pieces:
        try:
            piece.decode("utf-8")
        except UnicodeDecodeError:
            broken += 1
    assert broken > 0, "the fixture must split a multi-byte character"
    fake_upstream.then(Step(kind="stream", chunks=pieces))
    stream = proxy.client().chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "greet"}], stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == "Grüße aus 東京 🚀"


def test_stream_bytes_are_relayed_unchanged(proxy, fake_upstream):
    chunks = [*stream_chunks(["a", "b"]), b": keepalive comment\n\n"]
    fake_upstream.then(Step(kind="stream", chunks=chunks))
    with httpx.stream("POST", f"{proxy.url}/v1/chat/completions", json={
            "model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "x"}]}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-ctxproxy-gate"] == "pass"
        received = b"".join(response.iter_raw())
    assert received == b"".join(chunks)


def test_stream_chunks_are_not_buffered(proxy, fake_upstream):
    """The upstream sends its second chunk only after the client received the first."""
    released = threading.Event()
    chunks = stream_chunks(["first", "second"])
    fake_upstream.then(Step(kind="stream", chunks=chunks, hold_after_first=released))
    with httpx.stream("POST", f"{proxy.url}/v1/chat/completions", timeout=10, json={
            "model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "x"}]}) as response:
        pieces = response.iter_raw()
        received = next(pieces)
        assert received == chunks[0]  # arrived while the upstream was still holding the rest
        released.set()
        received += b"".join(pieces)
    assert received == b"".join(chunks)


def test_upstream_timeouts_follow_the_config():
    from proxy.config import UpstreamConfig
    from proxy.upstream import Upstream

    upstream = Upstream(UpstreamConfig(timeout_s=321), None)
    assert upstream.timeout.sock_read == 321 and upstream.timeout.sock_connect == 10

    async def pools() -> tuple[bool, bool]:
        reusing = Upstream(UpstreamConfig(), None)
        closing = Upstream(UpstreamConfig(max_keepalive_connections=0), None)
        try:
            return reusing.session().connector.force_close, closing.session().connector.force_close
        finally:
            await reusing.aclose()
            await closing.aclose()

    assert asyncio.run(pools()) == (False, True)  # max_keepalive_connections: 0 is a connection per call


def test_unchanged_request_reaches_upstream_byte_for_byte(proxy, fake_upstream):
    body = (b'{ "zeta": 1.50, "model":"gpt-4o" ,"messages":[{"role":"user","content":"caf\\u00e9 \xc3\xa9",'
            b'"x_unknown":{"n":1e2}}], "temperature":0.70,"alpha":[3,2,1]}')
    response = httpx.post(f"{proxy.url}/v1/chat/completions", content=body,
                          headers={"content-type": "application/json", "authorization": "Bearer k"})
    assert response.status_code == 200
    assert fake_upstream.chat_requests[-1].body == body


def test_upstream_errors_reach_the_client_unchanged(proxy, fake_upstream):
    error = b'{"error":{"message":"slow down","type":"rate_limit_error","code":"rate_limit"}}'
    fake_upstream.then(Step(kind="error", status=429, body=error, headers={"retry-after": "7"}))
    response = httpx.post(f"{proxy.url}/v1/chat/completions",
                          json={"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]})
    assert response.status_code == 429
    assert response.content == error
    assert response.headers["retry-after"] == "7"
    fake_upstream.then(Step(kind="error", status=500, body=b'{"error":{"message":"boom"}}'))
    with pytest.raises(openai.InternalServerError):
        proxy.client().chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])


def test_unreachable_upstream_is_a_502_naming_it(make_proxy, fake_upstream):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]
    proxy = make_proxy({"upstream": {"base_url": f"http://127.0.0.1:{dead_port}/v1"}})
    response = httpx.post(f"{proxy.url}/v1/chat/completions",
                          json={"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]})
    assert response.status_code == 502
    error = response.json()["error"]
    assert f"127.0.0.1:{dead_port}" in error["message"]
    assert error["code"] == "upstream_unreachable"


@pytest.mark.parametrize(("body", "code"), [
    (b"{not json", "invalid_json"),
    (b"[1, 2]", "invalid_json"),
    (b'{"model": "gpt-4o"}', "missing_messages"),
    (b'{"model": "gpt-4o", "messages": []}', "missing_messages"),
    (b'{"model": "gpt-4o", "messages": ["hi"]}', "invalid_message"),
    (b'{"model": "gpt-4o", "messages": [{"role":"user","content":"x"}], "tools": {}}', "invalid_tools"),
])
def test_client_mistakes_are_openai_shaped_400s(proxy, fake_upstream, body, code):
    response = httpx.post(f"{proxy.url}/v1/chat/completions", content=body,
                          headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert response.json()["error"]["code"] == code
    assert fake_upstream.chat_requests == []


def test_oversized_body_is_a_413(make_proxy, fake_upstream):
    proxy = make_proxy({"server": {"max_body_bytes": 1000}})
    response = httpx.post(f"{proxy.url}/v1/chat/completions", json={
        "model": "gpt-4o", "messages": [{"role": "user", "content": "x" * 2000}]})
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
    assert fake_upstream.chat_requests == []


def test_other_routes_pass_through_byte_for_byte(proxy, fake_upstream):
    client = proxy.client()
    assert [m.id for m in client.models.list()] == ["gpt-4o"]
    body = b'{"input": "caf\xc3\xa9", "model":"text-embedding-3-small",  "extra": 1.0}'
    response = httpx.post(f"{proxy.url}/p/passthrough/v1/embeddings?x=1", content=body,
                          headers={"content-type": "application/json", "authorization": "Bearer k2"})
    assert response.status_code == 200
    assert response.content == body
    seen = fake_upstream.seen[-1]
    assert seen.body == body and seen.path == "/v1/embeddings?x=1"
    assert seen.headers["authorization"] == "Bearer k2"
    deleted = httpx.delete(f"{proxy.url}/v1/files/file-123")
    assert deleted.headers["x-echo-method"] == "DELETE"


def test_fallback_key_only_when_client_sends_none(make_proxy, fake_upstream, monkeypatch):
    monkeypatch.setenv("CTXPROXY_TEST_KEY", "sk-from-env")
    proxy = make_proxy({"upstream": {"api_key_env": "CTXPROXY_TEST_KEY"}})
    payload = {"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]}
    httpx.post(f"{proxy.url}/v1/chat/completions", json=payload)
    httpx.post(f"{proxy.url}/v1/chat/completions", json=payload, headers={"authorization": "Bearer mine"})
    first, second = fake_upstream.chat_requests
    assert first.headers["authorization"] == "Bearer sk-from-env"
    assert second.headers["authorization"] == "Bearer mine"


def test_policy_selected_by_url_then_header_then_default(proxy, fake_upstream):
    payload = {"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]}
    by_url = httpx.post(f"{proxy.url}/p/passthrough/v1/chat/completions", json=payload)
    by_header = httpx.post(f"{proxy.url}/v1/chat/completions", json=payload,
                           headers={"x-ctxproxy-policy": "passthrough"})
    fallback = httpx.post(f"{proxy.url}/v1/chat/completions", json=payload)
    assert by_url.headers["x-ctxproxy-policy"] == "passthrough"
    assert by_header.headers["x-ctxproxy-policy"] == "passthrough"
    assert fallback.headers["x-ctxproxy-policy"] == "default"
    assert "x-ctxproxy-policy" not in fake_upstream.chat_requests[1].headers  # ours stay here
    unknown = httpx.post(f"{proxy.url}/p/nope/v1/chat/completions", json=payload)
    assert unknown.status_code == 404 and "nope" in unknown.json()["error"]["message"]
    bad = httpx.post(f"{proxy.url}/v1/chat/completions", json=payload,
                     headers={"x-ctxproxy-policy": "../etc/passwd"})
    assert bad.status_code == 400


def test_openai_sdk_with_policy_base_url(proxy, fake_upstream):
    client = openai.OpenAI(base_url=f"{proxy.url}/p/passthrough/v1", api_key="k", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert raw.headers["x-ctxproxy-policy"] == "passthrough"


def test_tool_calls_pass_through_streaming_and_not(proxy, fake_upstream):
    call = {"id": "call_1", "type": "function", "function": {"name": "read_file",
                                                              "arguments": '{"path": "a.py"}'}}
    fake_upstream.then(Step(content=None, tool_calls=[call]),
                       Step(kind="stream", chunks=stream_chunks([], tool_calls=[call])))
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
    client = proxy.client()
    message = client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "read a.py"}], tools=tools).choices[0].message
    assert message.tool_calls[0].function.arguments == '{"path": "a.py"}'
    stream = client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "read a.py"}], tools=tools, stream=True)
    arguments = "".join(c.choices[0].delta.tool_calls[0].function.arguments or ""
                        for c in stream if c.choices and c.choices[0].delta.tool_calls)
    assert arguments == '{"path": "a.py"}'
    assert orjson.loads(fake_upstream.chat_requests[0].body)["tools"] == tools


def _raw_request(port: int, body: bytes, path: str = "/v1/chat/completions") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                 b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    return sock


@pytest.mark.parametrize("stream", [False, True])
def test_disconnect_before_upstream_headers_cancels_upstream(proxy, fake_upstream, stream):
    fake_upstream.then(Step(kind="hang"))
    body = orjson.dumps({"model": "gpt-4o", "stream": stream, "messages": [{"role": "user", "content": "x"}]})
    sock = _raw_request(proxy.server.port, body)
    assert fake_upstream.got_request.wait(10)
    sock.close()
    assert fake_upstream.saw_disconnect.wait(10), "the upstream call was not cancelled"
    row = archived_exchange(proxy)  # archived just after the cancel: wait for it, bounded
    assert row["status"] == 499 and "disconnect" in row["error"]


def archived_exchange(proxy, deadline_s: float = 10.0) -> dict:
    deadline = time.monotonic() + deadline_s
    while True:
        proxy.flush()
        row = next(proxy.query("select status, error from exchanges"), None)
        if row is not None or time.monotonic() > deadline:
            assert row is not None, "the exchange was never archived"
            return row


def test_disconnect_mid_stream_cancels_upstream(proxy, fake_upstream):
    fake_upstream.then(Step(kind="stream", chunks=stream_chunks(["first"])[:2], hang_after_chunks=True))
    body = orjson.dumps({"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "x"}]})
    sock = _raw_request(proxy.server.port, body)
    received = b""
    while b"first" not in received:
        received += sock.recv(65536)
    sock.close()
    assert fake_upstream.saw_disconnect.wait(10)
    # The connection left mid-body is not reused: the next call gets its own answer, whole.
    after = httpx.post(f"{proxy.url}/v1/chat/completions", timeout=30,
                       json={"model": "gpt-4o", "messages": [{"role": "user", "content": "next"}]})
    assert after.status_code == 200 and after.json()["object"] == "chat.completion"


# A Claude client and a Codex client leaving mid-answer: the same relay (proxy/stream_response.py's watcher).
LEAVING = {
    "/v1/messages": (lambda: message_stream([text("first words")])[:4], b"content_block_delta",
                     {"model": "claude-sonnet-4-5", "max_tokens": 64, "stream": True,
                      "messages": [{"role": "user", "content": "x"}]}),
    "/v1/responses": (lambda: response_stream([message_item("first words")])[:5], b"output_text.delta",
                      {"model": "gpt-4o", "stream": True, "store": False, "input": "x"}),
}


@pytest.mark.parametrize("path", sorted(LEAVING))
def test_a_client_leaving_mid_stream_cancels_upstream_and_is_archived_as_such(proxy, fake_upstream, path):
    events, delta, request = LEAVING[path]
    fake_upstream.then(Step(kind="stream", chunks=events(), hang_after_chunks=True))
    sock = _raw_request(proxy.server.port, orjson.dumps(request), path)
    received = b""
    while delta not in received:  # the answer has begun
        received += sock.recv(65536)
    sock.close()
    assert fake_upstream.saw_disconnect.wait(10), "the upstream stream was not given up"
    row = archived_exchange(proxy)  # archived as the relay ends: wait for it, bounded
    assert "client disconnected during the stream" in (row["error"] or "")


def test_healthz_and_metrics(proxy, fake_upstream):
    assert httpx.get(f"{proxy.url}/healthz").json() == {"status": "ok", "database": proxy.backend}
    httpx.post(f"{proxy.url}/v1/chat/completions",
               json={"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]})
    text = httpx.get(f"{proxy.url}/metrics").text
    assert 'ctxproxy_requests_total{policy="default",route="chat/completions",status="200"} 1.0' in text
    assert "ctxproxy_added_seconds_bucket" in text
    assert "ctxproxy_upstream_seconds_bucket" in text


# ------------------------------------------------------------------------- client mistakes are 4xx (issue 8)

def _openai_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    return error


def test_client_shape_mistakes_name_the_field(proxy, fake_upstream):
    call = {"id": "c1", "type": "function", "function": {"name": "run", "arguments": {"x": 1}}}
    body = {"model": "gpt-4o", "messages": [
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": None, "tool_calls": [call]}]}
    error = _openai_error(httpx.post(f"{proxy.url}/v1/chat/completions", json=body), 400)
    assert error["param"] == "messages[3].tool_calls[0].function.arguments"
    assert error["type"] == "invalid_request_error"
    surrogate = b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi \\ud800"}]}'
    error = _openai_error(httpx.post(f"{proxy.url}/v1/chat/completions", content=surrogate), 400)
    assert error["param"] == "messages[0].content" and error["code"] == "invalid_unicode"
    deep = b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}], "x": ' + b"[" * 5000 + \
        b"]" * 5000 + b"}"
    _openai_error(httpx.post(f"{proxy.url}/v1/chat/completions", content=deep), 400)
    assert fake_upstream.chat_requests == []


@pytest.mark.parametrize("path", ["/nope", "/v2/chat/completions", "/p/passthrough/v2/models", "/p/x"])
def test_unknown_routes_are_openai_shaped_404s(proxy, fake_upstream, path):
    error = _openai_error(httpx.get(f"{proxy.url}{path}"), 404)
    assert error["type"] == "invalid_request_error" and error["code"] == "unknown_route"
    assert path in error["message"]
    assert "must end in /v1" not in error["message"]
    assert fake_upstream.seen == []


@pytest.mark.parametrize(("path", "base"), [
    ("/chat/completions", "/v1"), ("/p/passthrough/chat/completions", "/p/passthrough/v1"),
    ("/messages", "/v1"), ("/responses", "/v1"), ("/models", "/v1"), ("/embeddings", "/v1"),
])
def test_api_calls_without_v1_hint_at_the_base_url(proxy, fake_upstream, path, base):
    error = _openai_error(httpx.post(f"{proxy.url}{path}", json={"model": "gpt-4o"}), 404)
    assert "must end in /v1" in error["message"]
    assert f"OPENAI_BASE_URL={proxy.url}{base}" in error["message"]
    assert fake_upstream.seen == []


def test_the_sdk_without_v1_gets_the_hint(proxy, fake_upstream):
    client = proxy.client(base_url=proxy.url)
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    assert f"OPENAI_BASE_URL={proxy.url}/v1" in caught.value.message


@pytest.mark.parametrize("raw_path", [
    b"/p/%2e%2e/v1/chat/completions", b"/p/%2E%2E/v1/models", b"/v1/./models", b"/v1/%2e%2e/admin",
    b"/v1/files/%2e%2e/%2e%2e/secret"])
def test_dot_segments_are_404s_and_never_forwarded(proxy, fake_upstream, raw_path):
    with socket.create_connection(("127.0.0.1", proxy.server.port)) as sock:
        body = b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]}'
        sock.sendall(b"POST " + raw_path + b" HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"connection: close\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    head, _, payload = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 404"), head
    assert orjson.loads(payload)["error"]["type"] == "invalid_request_error"
    assert fake_upstream.seen == []


def test_unknown_policy_in_the_url_is_a_404_naming_it(proxy, fake_upstream):
    payload = {"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]}
    for url in (f"{proxy.url}/p/nope/v1/chat/completions", f"{proxy.url}/p/nope/v1/models"):
        error = _openai_error(httpx.post(url, json=payload), 404)
        assert "'nope'" in error["message"] and error["code"] == "unknown_policy"


@pytest.mark.parametrize(("method", "path", "allowed"), [
    ("POST", "/healthz", "GET"), ("DELETE", "/metrics", "GET"), ("PUT", "/ctxproxy/pins", "GET"),
    ("GET", "/ctxproxy/pins/pin-1", "DELETE"), ("TRACE", "/v1/chat/completions", "POST"),
])
def test_wrong_method_on_our_routes_is_an_openai_shaped_405(proxy, fake_upstream, method, path, allowed):
    response = httpx.request(method, f"{proxy.url}{path}")
    error = _openai_error(response, 405)
    assert error["code"] == "method_not_allowed" and method in error["message"]
    assert allowed in response.headers["allow"]


def test_listing_stored_chat_completions_is_passed_through(proxy, fake_upstream):
    """GET /v1/chat/completions is OpenAI's list of stored completions (client.chat.completions.list())."""
    for base in ("/v1", "/p/passthrough/v1"):
        response = httpx.get(f"{proxy.url}{base}/chat/completions?limit=2",
                             headers={"authorization": "Bearer k"})
        assert response.status_code == 200
        assert response.headers["x-echo-method"] == "GET"
        seen = fake_upstream.seen[-1]
        assert (seen.method, seen.path) == ("GET", "/v1/chat/completions?limit=2")
        assert seen.headers["authorization"] == "Bearer k"


def test_admin_token_must_be_sent_as_bearer(make_proxy, fake_upstream, monkeypatch):
    monkeypatch.setenv("CTXPROXY_ADMIN", "s3cret")
    proxy = make_proxy({"admin": {"token_env": "CTXPROXY_ADMIN"}})
    url = f"{proxy.url}/ctxproxy/pins"
    for header in ("s3cret", "Basic s3cret", "Bearer", "Bearer s3cret2", "Token s3cret", "bearers3cret"):
        response = httpx.get(url, headers={"authorization": header})
        error = _openai_error(response, 401)
        assert error["code"] == "unauthorized" and "Bearer" in error["message"]
        assert response.headers["www-authenticate"] == "Bearer"
    for header in ("Bearer s3cret", "bearer s3cret", "Bearer  s3cret"):
        assert httpx.get(url, headers={"authorization": header}).status_code == 200
