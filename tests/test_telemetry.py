"""OpenTelemetry traces: spans per exchange, exported over OTLP/HTTP to a collector on loopback (a real
uvicorn server decoding ExportTraceServiceRequest), through the real proxy and the official SDKs."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from proxy.config import Config, load_config
from proxy.errors import ConfigError
from proxy.telemetry import traces_url
from tests.servers import Seen, ServerThread, Step, stream_chunks

SECRET_TEXT = "the-user-wrote-this-7f3a"
KEY = "sk-test-telemetry-secret-key"
SERVER, CLIENT, INTERNAL = 2, 3, 1  # opentelemetry.proto Span.SpanKind
BIG = "\n".join(f"line {i}: value={i * 7} path=src/mod_{i % 13}.py" for i in range(500))  # summarized
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]


def history() -> list[dict[str, Any]]:
    """A big tool result: the default policy summarizes it and offers read_tool_result."""
    return [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Summarize big.log"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_read", "type": "function",
            "function": {"name": "read_file", "arguments": '{"path": "big.log"}'}}]},
        {"role": "tool", "tool_call_id": "call_read", "content": BIG},
    ]


def internal_call() -> dict[str, Any]:
    return {"id": "int_1", "type": "function",
            "function": {"name": "read_tool_result", "arguments": '{"call_id": "call_read"}'}}


def check_second_round(seen: Seen) -> Step:
    assert seen.json()["messages"][-1]["content"] == BIG  # the proxy answered its own tool call
    return Step(content="The log has 1500 lines.")


@dataclass
class Span:
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_id: str
    start: int
    end: int
    attributes: dict[str, Any]
    resource: dict[str, Any]
    error: bool


def value(any_value: AnyValue) -> Any:
    field = any_value.WhichOneof("value")
    if field == "array_value":
        return [value(v) for v in any_value.array_value.values]
    return getattr(any_value, field) if field else None


class Collector:
    """An OTLP/HTTP trace receiver: POST /v1/traces, protobuf in, spans kept in arrival order."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.spans: list[Span] = []
        self.lock = threading.Lock()
        self.app = Starlette(routes=[Route("/v1/traces", self.traces, methods=["POST"])])

    def reset(self) -> None:
        with self.lock:
            self.bodies.clear()
            self.spans.clear()

    async def traces(self, request: Request) -> Response:
        assert request.headers["content-type"] == "application/x-protobuf"
        body = await request.body()
        export = ExportTraceServiceRequest()
        export.ParseFromString(body)
        with self.lock:
            self.bodies.append(body)
            for resource_spans in export.resource_spans:
                resource = {a.key: value(a.value) for a in resource_spans.resource.attributes}
                for scope in resource_spans.scope_spans:
                    self.spans.extend(Span(
                        s.name, s.kind, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(),
                        s.start_time_unix_nano, s.end_time_unix_nano,
                        {a.key: value(a.value) for a in s.attributes}, resource,
                        s.status.code == 2) for s in scope.spans)
        return Response(ExportTraceServiceResponse().SerializeToString(), media_type="application/x-protobuf")

    def named(self, name: str) -> list[Span]:
        return [s for s in self.spans if s.name == name]

    def one(self, name: str, kind: int | None = None) -> Span:
        found = [s for s in self.named(name) if kind is None or s.kind == kind]
        assert len(found) == 1, (name, [(s.name, s.kind) for s in self.spans])
        return found[0]

    def children(self, parent: Span) -> list[Span]:
        return [s for s in self.spans if s.parent_id == parent.span_id]


@pytest.fixture(scope="module")
def collector_server():
    collector = Collector()
    with ServerThread(collector.app) as server:
        yield collector, server


@pytest.fixture
def collector(collector_server) -> Collector:
    collector, _ = collector_server
    collector.reset()
    return collector


@pytest.fixture
def traced_proxy(make_proxy, fake_upstream, collector_server):
    _, server = collector_server
    return make_proxy({"telemetry": {"otlp_endpoint": server.url, "service_name": "ctxproxy-test"}})


def flush(proxy) -> None:
    """The hook the app exposes: export every span of the exchanges that ended (no sleeping)."""
    assert proxy.server.server.config.app.state.telemetry.force_flush(10)


def assert_no_content(collector: Collector, *texts: str) -> None:
    """Nothing the client sent (message text, key) anywhere in what was exported: names, attributes."""
    assert collector.bodies
    for body in collector.bodies:
        for text in texts:
            assert text.encode() not in body


def user_messages() -> list[dict[str, Any]]:
    return [{"role": "system", "content": "You are terse."}, {"role": "user", "content": SECRET_TEXT}]


def test_a_plain_request_is_one_server_span_with_pipeline_and_upstream_children(traced_proxy, collector,
                                                                                upstream_server):
    raw = traced_proxy.client(api_key=KEY).chat.completions.with_raw_response.create(
        model="gpt-4o", messages=user_messages())
    assert raw.parse().choices[0].message.content == f"echo: {SECRET_TEXT}"
    flush(traced_proxy)

    server = collector.one("chat gpt-4o", SERVER)
    assert server.resource["service.name"] == "ctxproxy-test"
    a = server.attributes
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.provider.name"] == a["gen_ai.system"] == "openai"
    assert a["gen_ai.request.model"] == a["gen_ai.response.model"] == "gpt-4o"
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (11, 3)
    assert a["gen_ai.usage.cache_read.input_tokens"] == 5
    assert a["gen_ai.response.finish_reasons"] == ["stop"]
    assert a["ctxproxy.session"] == raw.headers["x-ctxproxy-session"]
    assert a["ctxproxy.policy"] == "default" and a["ctxproxy.gate"] == "pass"
    assert a["ctxproxy.tokens_before"] == int(raw.headers["x-ctxproxy-tokens-before"]) > 0
    assert a["ctxproxy.tokens_after"] == int(raw.headers["x-ctxproxy-tokens-after"])
    assert a["ctxproxy.route"] == "chat/completions" and a["ctxproxy.upstream_calls"] == 1
    assert a["http.response.status_code"] == 200 and not server.error
    assert server.parent_id == ""  # no traceparent from the client: a root

    children = {s.name: s for s in collector.children(server)}
    assert set(children) == {"ctxproxy.pipeline", "chat gpt-4o"}
    pipeline = children["ctxproxy.pipeline"]
    assert pipeline.kind == INTERNAL and pipeline.attributes["ctxproxy.gate"] == "pass"
    layers = {s.name for s in collector.children(pipeline)}
    assert {"ctxproxy.tool_results", "ctxproxy.blocks", "ctxproxy.budget"} <= layers
    upstream = children["chat gpt-4o"]
    u = upstream.attributes
    assert upstream.kind == CLIENT and u["http.response.status_code"] == 200 and u["ctxproxy.round"] == 0
    assert (u["server.address"], u["server.port"]) == ("127.0.0.1", upstream_server[1].port)
    assert u["gen_ai.request.model"] == u["gen_ai.response.model"] == "gpt-4o"
    assert u["gen_ai.response.id"] == "chatcmpl-fake"
    assert (u["gen_ai.usage.input_tokens"], u["gen_ai.usage.output_tokens"]) == (11, 3)
    assert {s.trace_id for s in collector.spans} == {server.trace_id}
    assert server.start <= pipeline.start <= upstream.start <= upstream.end <= server.end
    assert_no_content(collector, SECRET_TEXT, KEY, "You are terse")


def test_a_stream_through_the_openai_sdk_is_traced_to_its_end(traced_proxy, collector):
    stream = traced_proxy.client(api_key=KEY).chat.completions.create(
        model="gpt-4o", messages=user_messages(), stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == f"echo: {SECRET_TEXT}"
    flush(traced_proxy)  # the exchange ended before the stream's last event reached the client

    server = collector.one("chat gpt-4o", SERVER)
    upstream = collector.one("chat gpt-4o", CLIENT)
    assert upstream.parent_id == server.span_id
    assert upstream.attributes["gen_ai.response.model"] == "gpt-4o"
    assert upstream.attributes["gen_ai.response.id"] == "chatcmpl-stream"
    assert server.attributes["gen_ai.response.finish_reasons"] == ["stop"]
    assert server.attributes["http.response.status_code"] == 200
    assert upstream.end <= server.end
    assert_no_content(collector, SECRET_TEXT, KEY)


def test_internal_rounds_are_upstream_spans_and_tool_calls_under_the_exchange(traced_proxy, fake_upstream,
                                                                              collector):
    fake_upstream.then(Step(tool_calls=[internal_call()]), check_second_round)
    result = traced_proxy.client(api_key=KEY).chat.completions.create(
        model="gpt-4o", messages=history(), tools=TOOLS)
    assert result.choices[0].message.content == "The log has 1500 lines."
    flush(traced_proxy)

    server = collector.one("chat gpt-4o", SERVER)
    calls = sorted((s for s in collector.named("chat gpt-4o") if s.kind == CLIENT),
                   key=lambda s: s.attributes["ctxproxy.round"])
    assert [c.attributes["ctxproxy.round"] for c in calls] == [0, 1]
    assert all(c.parent_id == server.span_id for c in calls)
    assert calls[0].attributes["gen_ai.response.finish_reasons"] == ["tool_calls"]
    assert calls[0].end <= calls[1].start
    tool = collector.one("execute_tool read_tool_result")
    assert tool.parent_id == server.span_id and calls[0].end <= tool.start <= calls[1].start
    assert tool.attributes["gen_ai.tool.call.id"] == "int_1"
    assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
    assert server.attributes["ctxproxy.upstream_calls"] == 2
    assert server.attributes["gen_ai.usage.input_tokens"] == 22  # every round, as the client is billed
    assert server.attributes["ctxproxy.tokens_after"] < server.attributes["ctxproxy.tokens_before"]
    assert_no_content(collector, KEY, "line 7: value=49", "big.log")


def test_streamed_internal_rounds_keep_their_parent(traced_proxy, fake_upstream, collector):
    fake_upstream.then(
        Step(kind="stream", chunks=stream_chunks(["Let me look. "], tool_calls=[internal_call()])),
        lambda seen: (check_second_round(seen), Step(kind="stream", chunks=stream_chunks(["Done."])))[1])
    with httpx.stream("POST", f"{traced_proxy.url}/v1/chat/completions", json={
            "model": "gpt-4o", "stream": True, "messages": history(), "tools": TOOLS},
            headers={"authorization": f"Bearer {KEY}"}) as response:
        assert b"[DONE]" in b"".join(response.iter_bytes())
    flush(traced_proxy)

    server = collector.one("chat gpt-4o", SERVER)
    calls = [s for s in collector.named("chat gpt-4o") if s.kind == CLIENT]
    assert sorted(c.attributes["ctxproxy.round"] for c in calls) == [0, 1]
    assert all(c.parent_id == server.span_id for c in calls)  # round 1 opens while the body streams
    assert collector.one("execute_tool read_tool_result").parent_id == server.span_id
    assert_no_content(collector, KEY, "line 7: value=49")


def test_anthropic_route_names_its_provider_and_usage(traced_proxy, collector):
    client = traced_proxy.anthropic(api_key=KEY)
    with client.messages.stream(model="claude-sonnet-4-5", max_tokens=64,
                                messages=[{"role": "user", "content": SECRET_TEXT}]) as stream:
        assert stream.get_final_text() == f"echo: {SECRET_TEXT}"
    flush(traced_proxy)

    server = collector.one("chat claude-sonnet-4-5", SERVER)
    upstream = collector.one("chat claude-sonnet-4-5", CLIENT)
    assert server.attributes["gen_ai.provider.name"] == server.attributes["gen_ai.system"] == "anthropic"
    assert server.attributes["ctxproxy.route"] == "messages"
    assert upstream.attributes["gen_ai.response.model"] == "claude-sonnet-4-5"
    u = upstream.attributes
    assert (u["gen_ai.usage.input_tokens"], u["gen_ai.usage.output_tokens"]) == (25, 12)
    assert_no_content(collector, SECRET_TEXT, KEY)


def test_an_upstream_error_and_a_client_traceparent(traced_proxy, fake_upstream, collector):
    fake_upstream.then(Step(kind="error", status=503, body=b'{"error": {"message": "overloaded"}}'))
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    response = httpx.post(f"{traced_proxy.url}/v1/chat/completions",
                          json={"model": "gpt-4o", "messages": user_messages()},
                          headers={"authorization": f"Bearer {KEY}",
                                   "traceparent": f"00-{trace_id}-{parent_id}-01"})
    assert response.status_code == 503
    flush(traced_proxy)

    server = collector.one("chat gpt-4o", SERVER)
    upstream = collector.one("chat gpt-4o", CLIENT)
    assert (server.trace_id, server.parent_id) == (trace_id, parent_id)  # joins the agent's trace
    assert upstream.error and upstream.attributes["error.type"] == "503"
    assert server.error and server.attributes["http.response.status_code"] == 503
    assert_no_content(collector, SECRET_TEXT, KEY)


def test_shutdown_flushes_what_was_not_exported(traced_proxy, collector):
    traced_proxy.client(api_key=KEY).chat.completions.create(model="gpt-4o", messages=user_messages())
    traced_proxy.server.__exit__()  # lifespan exit: the batch processor is shut down, hence flushed
    assert collector.one("chat gpt-4o", SERVER).attributes["gen_ai.usage.output_tokens"] == 3


def test_without_an_endpoint_nothing_is_created_or_sent(make_proxy, fake_upstream, collector, monkeypatch):
    from opentelemetry.exporter.otlp.proto.http import trace_exporter

    def no_exporter(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("an exporter was created without telemetry.otlp_endpoint")

    monkeypatch.setattr(trace_exporter.OTLPSpanExporter, "__init__", no_exporter)
    proxy = make_proxy()
    assert proxy.server.server.config.app.state.telemetry is None
    proxy.client(api_key=KEY).chat.completions.create(model="gpt-4o", messages=user_messages())
    stream = proxy.client(api_key=KEY).chat.completions.create(model="gpt-4o", messages=user_messages(),
                                                             stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    proxy.server.__exit__()
    assert collector.bodies == [] and collector.spans == []


def test_config_section_is_strict_and_the_traces_path_is_added(tmp_path):
    config = Config.model_validate({"telemetry": {"otlp_endpoint": "http://otel:4318"}})
    assert config.telemetry.service_name == "ctxproxy" and config.telemetry.headers == {}
    assert Config().telemetry.otlp_endpoint is None
    path = tmp_path / "config.yaml"
    for bad, problem in (("otlp_endpint: http://x", "telemetry.otlp_endpint: unknown key"),
                         ("otlp_endpoint: otel:4318", "telemetry.otlp_endpoint: String should match")):
        path.write_text(f"telemetry:\n  {bad}\n")
        with pytest.raises(ConfigError, match=problem):
            load_config(path)
    assert traces_url("http://otel:4318") == "http://otel:4318/v1/traces"
    assert traces_url("http://otel:4318/") == "http://otel:4318/v1/traces"
    assert traces_url("https://gw.example/otlp/v1/traces") == "https://gw.example/otlp/v1/traces"


def test_without_an_endpoint_the_sdk_is_not_even_imported():
    code = ("import sys\n"
            "from proxy import exchange_end, pipeline, relay, round_stream, rounds, telemetry\n"
            "from proxy.config import Config\n"
            "assert telemetry.start(Config().telemetry) is None\n"
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=os.environ | {"LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
