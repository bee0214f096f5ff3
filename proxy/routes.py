"""Every route but the managed ones (app.converse), and the HTTP plumbing they share: byte passthrough,
reading a body, health, metrics, the admin search API, error pages.

Every error here is JSON in the shape the client reads: Anthropic's on its routes, else OpenAI's — Starlette's
own 404 and 405 included (see handle_http_exception).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import anyio
import orjson
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from proxy.config import ServerConfig
from proxy.errors import BadRequest, CtxProxyError, NotFound, PayloadTooLarge, RequestTimeout
from proxy.policy import POLICY_NAME, LoadedPolicy, PolicyStore
from proxy.stream_response import StreamedResponse
from proxy.upstream import response_headers

if TYPE_CHECKING:
    from proxy.app import ProxyState
    from proxy.reader import SearchHits

log = logging.getLogger("ctxproxy")

POLICY_HEADER = "x-ctxproxy-policy"
LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})


# First path segments of API calls (OpenAI's, and Anthropic's /messages): without /v1 before them, the
# client's base URL is missing its /v1.
API_RESOURCES = frozenset({
    "chat", "completions", "responses", "messages", "embeddings", "models", "moderations", "images", "audio",
    "files", "uploads", "batches", "fine_tuning", "assistants", "threads", "vector_stores", "realtime",
    "conversations", "containers", "evals",
})


def speaks_anthropic(request: Request) -> bool:
    """A Messages route, or any route called by an Anthropic client (it always sends anthropic-version):
    answered in Anthropic's error shape and passed through to the Anthropic upstream."""
    path = request.url.path
    if path.startswith("/p/"):
        path = "/" + path.split("/", 3)[-1]
    if path.startswith("/v1/messages"):
        return True
    if path.startswith(("/v1/chat/completions", "/v1/responses")):
        return False  # OpenAI's own routes answer in OpenAI's shape, whatever headers came along
    return "anthropic-version" in request.headers


def select_policy(request: Request, store: PolicyStore) -> LoadedPolicy:
    """URL prefix `/p/{policy}/v1` first, then the header, then `default`."""
    in_url = request.path_params.get("policy")
    if in_url is not None and not POLICY_NAME.match(in_url):
        # No such route, as for any other URL that names no policy ("/p/%2e%2e/v1/..." included).
        raise NotFound(f"unknown policy {in_url!r} in the URL /p/<policy>/v1", code="unknown_policy")
    return store.get(in_url or request.headers.get(POLICY_HEADER) or "default")


async def passthrough(request: Request) -> Response:
    """Any other /v1 route: bytes in, bytes out, headers minus hop-by-hop."""
    state: ProxyState = request.app.state.proxy
    if "policy" in request.path_params:
        select_policy(request, state.policies)  # an unknown policy in the URL is still a 404
    path = "/" + request.path_params["path"]
    if any(segment in (".", "..") for segment in path.split("/")):
        # the HTTP client would resolve them against the upstream base URL, leaving its /v1
        raise NotFound(f"Invalid URL ({request.method} {request.url.path}): dot segments are not forwarded",
                       code="unknown_route")
    upstream = state.upstreams["messages" if speaks_anthropic(request) else "chat"]
    if upstream.anthropic:
        path = "/v1" + path  # ANTHROPIC_BASE_URL has no /v1; OpenAI's base URL ends in it
    headers = upstream.request_headers(request.headers, identity=False)
    if request.headers.get("content-length"):
        headers["content-length"] = request.headers["content-length"]
    has_body = request.method not in ("GET", "HEAD", "DELETE", "OPTIONS") or bool(
        request.headers.get("content-length") or request.headers.get("transfer-encoding"))
    content = request.stream() if has_body else None
    started = time.perf_counter()
    try:
        query = request.scope.get("query_string", b"")  # (the raw bytes: no URL object built)
        response = await upstream.open(request.method, path, query, headers, content)
    except ClientDisconnect:
        return Response(status_code=499)
    except CtxProxyError as exc:
        state.metrics.requests.labels("passthrough", str(exc.status), "-").inc()
        return error_response(exc, request=request)
    state.metrics.upstream_seconds.labels("passthrough").observe(time.perf_counter() - started)
    state.metrics.requests.labels("passthrough", str(response.status_code), "-").inc()

    async def body() -> AsyncIterator[bytes]:
        try:
            async for chunk in response.aiter_raw():
                yield chunk
        finally:
            await response.aclose()  # (never suspends: no cancellation can cut it short)

    return StreamedResponse(body(), status_code=response.status_code,
                             headers=response_headers(response.headers, keep_length=True))


async def read_body(request: Request, server: ServerConfig) -> bytes:
    """The whole request body, within server.max_body_bytes and server.body_timeout_s."""
    limit = server.max_body_bytes
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body of {declared} bytes exceeds the limit of {limit} bytes "
                              "(server.max_body_bytes)")
    chunks, size = [], 0
    try:
        # (asyncio's timeout: anyio's costs twice as much, on every request)
        async with asyncio.timeout(server.body_timeout_s):  # a body shorter than its Content-Length
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes "
                                          "(server.max_body_bytes)")
                chunks.append(chunk)
    except TimeoutError:
        raise RequestTimeout(f"the request body did not arrive within {server.body_timeout_s:g} s "
                             f"({size} bytes received; server.body_timeout_s)") from None
    return b"".join(chunks)


async def healthz(request: Request) -> Response:
    """ok when the archive database answers (a load balancer takes a replica whose database is gone
    out of rotation: its sessions' state lives there)."""
    state: ProxyState = request.app.state.proxy
    problem: str | None = "no answer within 5 s"
    with anyio.move_on_after(5):
        problem = await anyio.to_thread.run_sync(state.storage.health, abandon_on_cancel=True)
    if problem is not None:
        return JSONResponse({"status": "unavailable", "database": state.storage.kind, "problem": problem},
                            status_code=503)
    return JSONResponse({"status": "ok", "database": state.storage.kind})


async def metrics(request: Request) -> Response:
    state: ProxyState = request.app.state.proxy
    return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")


def error_response(exc: CtxProxyError, headers: dict[str, str] | None = None,
                   status: int | None = None, request: Request | None = None) -> Response:
    """The error in the shape the client's SDK reads: Anthropic's on its routes, else OpenAI's."""
    if request is not None and speaks_anthropic(request):
        from proxy.wire.messages_format import MESSAGES

        body = MESSAGES.error_body(exc)
    else:
        body = exc.body_bytes()
    return Response(body, status_code=status or exc.status, headers=headers, media_type="application/json")


async def handle_proxy_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, CtxProxyError)
    if exc.status >= 500:
        log.error("%s %s: %s", request.method, request.url.path, exc.message)
    return error_response(exc, request=request)


async def handle_unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    return error_response(CtxProxyError(f"internal error in ctxproxy ({type(exc).__name__}); see the log"),
                          request=request)


async def handle_client_disconnect(request: Request, exc: Exception) -> Response:
    return Response(status_code=499)


async def handle_http_exception(request: Request, exc: Exception) -> Response:
    """Starlette's routing errors (no route: 404, wrong method: 405) as OpenAI-shaped JSON, not plain text."""
    assert isinstance(exc, HTTPException)
    headers = dict(exc.headers or {})
    where = f"{request.method} {request.url.path}"
    if exc.status_code == 404:
        hint = missing_v1_hint(request)
        error: CtxProxyError = NotFound(f"Invalid URL ({where}): ctxproxy serves the OpenAI and Anthropic "
                                        f"APIs under /v1 and /p/<policy>/v1.{hint}", code="unknown_route")
    elif exc.status_code == 405:
        allowed = headers.get("Allow") or headers.get("allow") or ""
        error = BadRequest(f"Method {request.method} is not allowed for {request.url.path}"
                           + (f" (allowed: {allowed})" if allowed else ""), code="method_not_allowed")
    elif exc.status_code < 500:
        error = BadRequest(str(exc.detail), code="invalid_request")
    else:
        error = CtxProxyError(str(exc.detail))
    return error_response(error, headers, status=exc.status_code, request=request)


def missing_v1_hint(request: Request) -> str:
    """A path that looks like an API call without /v1 (/chat/completions, /p/x/responses): name the fix."""
    segments = [s for s in request.url.path.split("/") if s]
    prefix = ""
    if len(segments) >= 2 and segments[0] == "p" and POLICY_NAME.match(segments[1]):
        prefix, segments = f"/p/{segments[1]}", segments[2:]
    if not segments or segments[0] not in API_RESOURCES:
        return ""
    base = str(request.base_url).rstrip("/") + prefix + "/v1"
    return (f" This looks like an API call without /v1: the client's base URL must end in /v1, "
            f"e.g. OPENAI_BASE_URL={base}")


def admin_denied(request: Request) -> Response | None:
    """The admin API needs its token, and a loopback client unless admin.allow_remote."""
    state: ProxyState = request.app.state.proxy
    admin = state.config.admin
    token = state.config.admin_token()
    if token is None:
        raise NotFound("the admin API is off: set admin.token_env to the name of an environment variable "
                       "holding the admin token", code="admin_disabled")
    client = request.client.host if request.client else ""
    if not admin.allow_remote and client not in LOOPBACK:
        return error_response(CtxProxyError("the admin API answers loopback clients only "
                                            "(admin.allow_remote)", code="forbidden"), status=403)
    scheme, _, offered = request.headers.get("authorization", "").strip().partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(offered.strip().encode(), token.encode()):
        return error_response(CtxProxyError("missing or wrong admin token: send it as "
                                            "'Authorization: Bearer <token>'", code="unauthorized"),
                              {"www-authenticate": "Bearer"}, status=401)
    return None


async def admin_search(request: Request) -> Response:
    """`GET /ctxproxy/search?q=...[&session=...&limit=...]` over the whole archive, for operators."""
    state: ProxyState = request.app.state.proxy
    if (denied := admin_denied(request)) is not None:
        return denied
    query = request.query_params.get("q", "").strip()
    if not query:
        raise BadRequest("the query parameter q is required", param="q", code="missing_query")
    try:
        limit = max(1, min(100, int(request.query_params.get("limit", "20"))))
    except ValueError:
        raise BadRequest("limit must be an integer", param="limit", code="invalid_limit") from None
    def search() -> SearchHits:
        state.reader.wait_for_writer()  # (what was answered a moment ago is found)
        return state.reader.search(query, session_id=request.query_params.get("session"), limit=limit)

    hits = await anyio.to_thread.run_sync(search)
    for hit in hits:
        hit.pop("body", None)
    return JSONResponse({"query": query, "hits": hits})


async def admin_pins(request: Request) -> Response:
    """`GET|POST /ctxproxy/pins?policy=P` and `DELETE /ctxproxy/pins/{id}?policy=P`: project-wide pins."""
    state: ProxyState = request.app.state.proxy
    if (denied := admin_denied(request)) is not None:
        return denied
    policy = state.policies.get(request.query_params.get("policy", "default"))
    if request.method == "DELETE":
        await anyio.to_thread.run_sync(state.pins.remove, policy.name, request.path_params["pin_id"])
        return JSONResponse({"deleted": request.path_params["pin_id"]})
    if request.method == "POST":
        try:
            payload = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            payload = None
        if not isinstance(payload, dict) or not isinstance(payload.get("text"), str):
            raise BadRequest('body must be a JSON object {"text": ..., "name": ...}', param="text",
                             code="missing_text")
        pin = await anyio.to_thread.run_sync(
            lambda: state.pins.add(policy, payload["text"], name=str(payload.get("name") or "note")))
        return JSONResponse({"id": pin.id, "tokens": pin.tokens}, status_code=201)
    pins = await anyio.to_thread.run_sync(state.pins.list, policy.name)
    return JSONResponse({"policy": policy.name, "pins": [
        {"id": p.id, "name": p.name, "tokens": p.tokens, "content": p.content} for p in pins]})
