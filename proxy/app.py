"""The HTTP surface. The chat request path reads top to bottom in `chat_completions`."""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import orjson
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from proxy import pipeline
from proxy.archive import ArchiveWriter, ExchangeRecord, utc_now
from proxy.config import Config
from proxy.errors import BadRequest, CtxProxyError, PayloadTooLarge
from proxy.metrics import Metrics
from proxy.policy import LoadedPolicy, PolicyStore
from proxy.session import Session, resolve_session, tenant_of
from proxy.tokens import TokenCounter
from proxy.upstream import ClientDisconnected, Upstream, response_headers, unless_disconnected

log = logging.getLogger("ctxproxy")

POLICY_HEADER = "x-ctxproxy-policy"
CHAT_ROUTE = "chat/completions"


@dataclass
class ProxyState:
    config: Config
    policies: PolicyStore
    upstream: Upstream
    archive: ArchiveWriter
    tokens: TokenCounter
    metrics: Metrics


# ------------------------------------------------------------------------------------ chat path

async def chat_completions(request: Request) -> Response:
    started = time.perf_counter()
    state: ProxyState = request.app.state.proxy
    policy = select_policy(request, state.policies)
    raw = await read_body(request, state.config.server.max_body_bytes)
    body = parse_chat_request(raw)
    tenant = tenant_of(request.headers)
    session = resolve_session(request.headers, body, tenant)

    conversation = pipeline.Conversation(str(body.get("model") or ""), body["messages"], body.get("tools"))
    outcome = pipeline.run(conversation, pipeline.PipelineContext(policy, session, tenant, state.tokens))
    content = raw if not outcome.changed else rewritten_body(body, outcome)

    record = new_record(request, body, policy, session, tenant, outcome)
    ours = ctxproxy_headers(session, policy, outcome)
    state.metrics.gate.labels(policy.name, outcome.gate).inc()
    headers = state.upstream.request_headers(request.headers, identity=True)
    upstream_started = time.perf_counter()
    try:
        if record.stream:
            response = await unless_disconnected(
                state.upstream.open("POST", "/" + CHAT_ROUTE, request.url.query.encode(), headers, content),
                request.receive)
        else:
            response, payload = await unless_disconnected(
                open_and_read(state.upstream, headers, content, request.url.query.encode()), request.receive)
    except (CtxProxyError, ClientDisconnected) as exc:
        record.status = exc.status if isinstance(exc, CtxProxyError) else 499
        record.error = exc.message if isinstance(exc, CtxProxyError) else "client disconnected"
        finish(state, record, started, upstream_started, policy.name)
        if isinstance(exc, ClientDisconnected):
            return Response(status_code=499)
        return error_response(exc, ours)
    upstream_elapsed = time.perf_counter() - upstream_started
    record.status = response.status_code
    record.upstream_ms = upstream_elapsed * 1000

    if record.stream:
        state.metrics.added_seconds.labels(CHAT_ROUTE).observe(upstream_started - started)
        relay = relay_stream(response, record, lambda: finish(state, record, started, upstream_started,
                                                                policy.name, streamed=True))
        return StreamingResponse(relay, status_code=response.status_code,
                                 headers=response_headers(response.headers, keep_length=False) | ours)
    record.response_body = payload
    finish(state, record, started, upstream_started, policy.name)
    return Response(payload, status_code=response.status_code,
                    headers=response_headers(response.headers, keep_length=False) | ours)


def select_policy(request: Request, store: PolicyStore) -> LoadedPolicy:
    """URL prefix `/p/{policy}/v1` first, then the header, then `default`."""
    name = request.path_params.get("policy") or request.headers.get(POLICY_HEADER) or "default"
    return store.get(name)


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body of {declared} bytes exceeds the limit of {limit} bytes "
                              "(server.max_body_bytes)")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes (server.max_body_bytes)")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_chat_request(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        try:  # orjson refuses integers beyond 64 bits; the stdlib does not
            body = json.loads(raw)
        except ValueError as exc:
            raise BadRequest(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object", code="invalid_json")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' is required and must be a non-empty array", param="messages",
                         code="missing_messages")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest(f"messages[{index}] must be an object with a string 'role'",
                             param=f"messages[{index}]", code="invalid_message")
    if "tools" in body and body["tools"] is not None and not isinstance(body["tools"], list):
        raise BadRequest("'tools' must be an array", param="tools", code="invalid_tools")
    return body


def rewritten_body(body: dict[str, Any], outcome: pipeline.Outcome) -> bytes:
    """Re-serialize with the new messages/tools; key order and unknown fields are kept."""
    updated = dict(body)
    updated["messages"] = outcome.messages
    if outcome.tools is not None:
        updated["tools"] = outcome.tools
    return orjson.dumps(updated)


def new_record(request: Request, body: dict[str, Any], policy: LoadedPolicy, session: Session,
               tenant: str, outcome: pipeline.Outcome) -> ExchangeRecord:
    return ExchangeRecord(
        id=uuid.uuid4().hex, created_at=utc_now(), session_id=session.id, session_source=session.source,
        tenant=tenant, policy=policy.name, route=CHAT_ROUTE, model=body.get("model"),
        stream=body.get("stream") is True, request_messages=body["messages"],
        params={k: v for k, v in body.items() if k != "messages"},
        forwarded_messages=outcome.messages if outcome.changed else None,
        tokens_before=outcome.tokens_before, tokens_after=outcome.tokens_after, gate=outcome.gate)


def ctxproxy_headers(session: Session, policy: LoadedPolicy, outcome: pipeline.Outcome) -> dict[str, str]:
    return {
        "x-ctxproxy-session": session.id,
        "x-ctxproxy-policy": policy.name,
        "x-ctxproxy-gate": outcome.gate,
        "x-ctxproxy-tokens-before": str(outcome.tokens_before),
        "x-ctxproxy-tokens-after": str(outcome.tokens_after),
    }


async def open_and_read(upstream: Upstream, headers: dict[str, str], content: bytes,
                        query: bytes) -> tuple[httpx.Response, bytes]:
    response = await upstream.open("POST", "/" + CHAT_ROUTE, query, headers, content)
    return response, await Upstream.read(response, upstream.base_url)


async def relay_stream(response: httpx.Response, record: ExchangeRecord, on_done) -> AsyncIterator[bytes]:
    """Relay upstream bytes as they arrive; keep a copy for the archive; always close upstream."""
    try:
        async for chunk in response.aiter_raw():
            record.response_chunks.append(chunk)
            yield chunk
    except httpx.HTTPError as exc:
        record.error = f"upstream stream broke off: {exc or type(exc).__name__}"
    except BaseException:
        record.error = "client disconnected during the stream"
        raise
    finally:
        with anyio.CancelScope(shield=True):
            await response.aclose()
        on_done()


def finish(state: ProxyState, record: ExchangeRecord, started: float, upstream_started: float,
           policy: str, *, streamed: bool = False) -> None:
    """Account for the exchange and hand it to the archive writer (never blocks)."""
    now = time.perf_counter()
    record.latency_ms = (now - started) * 1000
    if not streamed:
        upstream_s = record.upstream_ms / 1000
        state.metrics.added_seconds.labels(CHAT_ROUTE).observe(max(0.0, now - started - upstream_s))
    state.metrics.upstream_seconds.labels(CHAT_ROUTE).observe(record.upstream_ms / 1000)
    state.metrics.requests.labels(CHAT_ROUTE, str(record.status), policy).inc()
    if record.tokens_before is not None:
        state.metrics.tokens_before.labels(policy).inc(record.tokens_before)
        state.metrics.tokens_after.labels(policy).inc(record.tokens_after or 0)
    state.archive.submit(record)


# ------------------------------------------------------------------------------- other routes

async def passthrough(request: Request) -> Response:
    """Any other /v1 route: bytes in, bytes out, headers minus hop-by-hop."""
    state: ProxyState = request.app.state.proxy
    if "policy" in request.path_params:
        select_policy(request, state.policies)  # an unknown policy in the URL is still a 404
    path = "/" + request.path_params["path"]
    headers = state.upstream.request_headers(request.headers, identity=False)
    if request.headers.get("content-length"):
        headers["content-length"] = request.headers["content-length"]
    has_body = request.method not in ("GET", "HEAD", "DELETE", "OPTIONS") or bool(
        request.headers.get("content-length") or request.headers.get("transfer-encoding"))
    content = request.stream() if has_body else None
    started = time.perf_counter()
    try:
        response = await state.upstream.open(request.method, path, request.url.query.encode(), headers,
                                             content)
    except ClientDisconnect:
        return Response(status_code=499)
    except CtxProxyError as exc:
        state.metrics.requests.labels("passthrough", str(exc.status), "-").inc()
        return error_response(exc)
    state.metrics.upstream_seconds.labels("passthrough").observe(time.perf_counter() - started)
    state.metrics.requests.labels("passthrough", str(response.status_code), "-").inc()

    async def body() -> AsyncIterator[bytes]:
        try:
            async for chunk in response.aiter_raw():
                yield chunk
        finally:
            with anyio.CancelScope(shield=True):
                await response.aclose()

    return StreamingResponse(body(), status_code=response.status_code,
                             headers=response_headers(response.headers, keep_length=True))


# ------------------------------------------------------------------------------------- service

async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def metrics(request: Request) -> Response:
    state: ProxyState = request.app.state.proxy
    return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")


def error_response(exc: CtxProxyError, headers: dict[str, str] | None = None) -> Response:
    return Response(exc.body_bytes(), status_code=exc.status, headers=headers,
                    media_type="application/json")


async def handle_proxy_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, CtxProxyError)
    if exc.status >= 500:
        log.error("%s %s: %s", request.method, request.url.path, exc.message)
    return error_response(exc)


async def handle_unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    return error_response(CtxProxyError(f"internal error in ctxproxy ({type(exc).__name__}); see the log"))


async def handle_client_disconnect(request: Request, exc: Exception) -> Response:
    return Response(status_code=499)


def build_app(config: Config, *, transport: httpx.AsyncBaseTransport | None = None) -> Starlette:
    """Create the ASGI app. `transport` is the test seam for the upstream (as in httpx)."""
    policies = PolicyStore(config.policies_dir)
    problems = policies.check_all()
    if problems:
        raise CtxProxyError("invalid policies:\n" + "\n".join(problems))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        tokens = TokenCounter()
        tokens.warm()
        app.state.proxy = ProxyState(
            config=config, policies=policies,
            upstream=Upstream(config.upstream, config.upstream_api_key(), transport=transport),
            archive=ArchiveWriter(config.data_dir / "archive.db"), tokens=tokens, metrics=Metrics())
        try:
            yield
        finally:
            await app.state.proxy.upstream.aclose()
            app.state.proxy.archive.close()

    chat_methods = ["POST"]
    any_method = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
    routes = [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=chat_methods),
        Route("/p/{policy}/v1/chat/completions", chat_completions, methods=chat_methods),
        Route("/v1/{path:path}", passthrough, methods=any_method),
        Route("/p/{policy}/v1/{path:path}", passthrough, methods=any_method),
    ]
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers={
        CtxProxyError: handle_proxy_error,
        ClientDisconnect: handle_client_disconnect,
        Exception: handle_unexpected,
    })
