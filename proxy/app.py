"""The HTTP surface. The chat request path reads top to bottom in `chat_completions`."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from proxy import collector, commands, heavy, model_summary, pipeline, rounds, telemetry
from proxy.accounting import Pricing
from proxy.archive import ArchiveWriter, ExchangeRecord
from proxy.config import Config
from proxy.errors import ContextLengthExceeded, CtxProxyError
from proxy.exchange_end import (
    ctxproxy_headers,
    exchange_record,
    finish,
    finish_soon,
    on_archived,
    overhead,
    spend_recorder,
)
from proxy.internal_tools import ToolContext
from proxy.kept_counts import keep_at_shutdown
from proxy.metrics import Metrics
from proxy.offload import INLINE_BYTES, INLINE_FRESH_BYTES, off_loop_if_large
from proxy.pins import PinStore
from proxy.policy import LoadedPolicy, PolicyStore
from proxy.relay import archived, open_and_read, relay_rest, relay_stream
from proxy.routes import (
    admin_pins,
    admin_search,
    handle_client_disconnect,
    handle_http_exception,
    handle_proxy_error,
    handle_unexpected,
    healthz,
    metrics,
    passthrough,
    read_body,
    select_policy,
)
from proxy.session import Session, identify
from proxy.session_state import SessionState
from proxy.state import StateStore, WouldBlock
from proxy.store.storage import ArchiveQueries, Storage, open_storage
from proxy.stream_response import StreamedResponse
from proxy.tokens import TokenCounter, server_counter, warm_up
from proxy.ui import routes as ui_routes
from proxy.upstream import ClientDisconnected, Upstream, response_headers, unless_disconnected
from proxy.wire import Decoded, WireFormat, resent
from proxy.wire.chat import CHAT
from proxy.wire.messages_format import MESSAGES
from proxy.wire.responses_format import RESPONSES

log = logging.getLogger("ctxproxy")
T = TypeVar("T")

@dataclass
class ProxyState:
    config: Config
    policies: PolicyStore
    upstreams: dict[str, Upstream]  # by wire format: chat (OpenAI-compatible), messages (Anthropic)
    archive: ArchiveWriter
    tokens: TokenCounter
    metrics: Metrics
    store: StateStore
    reader: ArchiveQueries
    pins: PinStore
    storage: Storage
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def upstream(self) -> Upstream:
        """The OpenAI-compatible upstream (summarizer and folding models are called there)."""
        return self.upstreams[CHAT.name]

    def background(self, work: Coroutine[Any, Any, None]) -> None:
        """Fire and forget, but keep a reference (and cancel leftovers at shutdown)."""
        task = asyncio.get_running_loop().create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


# ------------------------------------------------------------------------------ the request path

async def chat_completions(request: Request) -> Response:
    return await converse(request, CHAT)


async def messages(request: Request) -> Response:
    return await converse(request, MESSAGES)


async def responses(request: Request) -> Response:
    return await converse(request, RESPONSES)


@telemetry.exchange  # one trace span per client request when telemetry.otlp_endpoint is set
async def converse(request: Request, wire: WireFormat) -> Response:
    """One client request in any wire format: decode, rewrite, forward (answering our tools), archive."""
    started = time.perf_counter()
    state: ProxyState = request.app.state.proxy
    policy = select_policy(request, state.policies)
    raw = await read_body(request, state.config.server)
    fresh = wire.fresh_bytes(raw)  # (past what an earlier body repeats: a resent history's new part)
    decoded = await off_loop_if_large(fresh, wire.decode, raw)
    tenant, session = identify(request.headers, decoded.session_body)  # keyless: a tenant per session
    upstream = state.upstreams[wire.name]
    if (window := wire.window(request.headers)) is not None:
        policy = policy.with_window(window)
    if wire.name == MESSAGES.name:  # summarizer models are called on the OpenAI-compatible upstream with
        policy = policy.without_models()  # the client's key: an Anthropic key never goes to another provider
    if decoded.native_state:  # the provider holds the history (previous_response_id): never break a chain
        policy = policy.leaving_context_to_provider()
    elif decoded.native_context:  # never both managing one span: the policy says whose it is
        if policy.policy.window.native == "provider":
            policy = policy.leaving_context_to_provider()
        else:
            decoded.take_over_context()

    command = commands.parse({"messages": decoded.messages}, policy.policy.commands)
    if command is not None:
        return await answer_command(state, wire, decoded, policy, session, tenant, command, started)

    conversation = pipeline.Conversation(decoded.model, decoded.messages, decoded.tools)
    context = pipeline.PipelineContext(policy, session, tenant, state.tokens, state.store,
                                       state.config.data_dir / "checkpoints",
                                       pins=lambda: state.pins.list(policy.name, tenant, session.id))
    model_summary.SPEND.set(spend_recorder(state, policy, session, tenant))  # our model calls are spend
    if policy.policy.tool_results.summarizer_model:  # model summaries are fetched before the pipeline
        pending = await anyio.to_thread.run_sync(pipeline.needs_model_summaries, conversation, context)
        if pending:
            layer1 = policy.policy.tool_results
            context.prepared = await model_summary.prepare(
                state.upstreams[CHAT.name], state.upstream.request_headers(request.headers, identity=True),
                str(layer1.summarizer_model), pending, layer1.summarizer_timeout_s)
    try:
        outcome, content, session_state = await rewrite_soon(state, conversation, context, decoded, len(raw),
                                                             fresh)
    except ContextLengthExceeded as refusal:
        return await refused(state, wire, decoded, policy, session, tenant, refusal, started)
    if outcome.evicted:  # model-written headlines and episodes never block a request
        model_summary.after_eviction(state.background, state.upstream,
                                     state.upstream.request_headers(request.headers, identity=True),
                                     policy.policy, outcome.evicted, session_state, state.store)
    state.metrics.observe_blocks(policy.name, outcome.blocks)
    state.metrics.gate.labels(policy.name, outcome.gate).inc()
    ours = ctxproxy_headers(session, policy, outcome)
    if decoded.native_state:
        ours["x-ctxproxy-state"] = "provider"  # history held upstream: recorded, not rewritten
    headers = upstream.request_headers(request.headers, identity=True)
    query = request.scope.get("query_string", b"")
    rc = rounds_context(state, request, wire, decoded, outcome, context, headers, content)

    sent_at: float | None = None  # a plain stream: when it was sent (its record is made once it answers)
    headers_ms = 0.0

    def done() -> Awaitable[None] | None:  # the end of a stream (relay.archived calls it however the stream
        if sent_at is not None and rc.records and not rc.records[-1].upstream_ms:  # ends)
            rc.records[-1].upstream_ms = (time.perf_counter() - sent_at) * 1000  # to the last byte
        return finish_soon(state, wire, rc.records, started, policy.name, outcome, rc.calls)

    try:
        if decoded.stream:
            sent_at = time.perf_counter()
            response = await unless_disconnected(telemetry.upstream_call(
                rc, upstream.open("POST", wire.upstream_path, query, headers, content)), request.receive)
            headers_ms = response.headers_ms  # (from the send, as the upstream's time to its last byte)
        elif outcome.internal_tools:
            response, payload, rest = await unless_disconnected(rounds.complete(rc), request.receive)
        else:
            response, payload, rest = await unless_disconnected(
                open_and_read(upstream, headers, content, query, rc), request.receive)
    except (CtxProxyError, ClientDisconnected) as exc:
        failed = rc.records[-1] if rc.records else rc.new_record(outcome.messages, None)
        failed.status = exc.status if isinstance(exc, CtxProxyError) else 499
        failed.error = exc.message if isinstance(exc, CtxProxyError) else "client disconnected"
        rc.records[-1:] = [failed]
        await finish(state, wire, rc.records, started, policy.name, outcome, rc.calls)
        if isinstance(exc, ClientDisconnected):
            return Response(status_code=499)
        return Response(wire.error_body(exc), status_code=exc.status, media_type="application/json",
                        headers=ours | overhead(started, sum(r.upstream_ms for r in rc.records)))

    waited = headers_ms if decoded.stream else sum(r.upstream_ms for r in rc.records)
    relayed = response_headers(response.headers, keep_length=False) | ours | overhead(started, waited)
    if not decoded.stream and rest is not None:  # over upstream.max_response_bytes: relayed, never held
        return StreamedResponse(relay_rest(payload, rest, rc.records[-1], done),
                                 status_code=response.status_code, headers=relayed)
    if not decoded.stream:
        await finish(state, wire, rc.records, started, policy.name, outcome, rc.calls)
        return Response(payload, status_code=response.status_code, headers=relayed)
    state.metrics.added_seconds.labels(wire.route).observe(time.perf_counter() - started)
    if outcome.internal_tools and response.status_code == 200:
        rc.first_headers_ms = headers_ms
        events = wire.stream_rounds(rc, response)
    else:
        rc.records.append(rc.new_record(outcome.messages, None))
        rc.records[-1].status, rc.records[-1].upstream_headers_ms = response.status_code, headers_ms
        events = relay_stream(response, rc.records[-1], upstream.max_response_bytes, wire.watch(),
                              wire.error_event)
    return StreamedResponse(archived(events, rc.records, done, wire.done_markers, wire.error_event),
                             status_code=response.status_code, headers=relayed)


async def rewrite_soon(state: ProxyState, conversation: pipeline.Conversation,
                       context: pipeline.PipelineContext, decoded: Decoded, size: int,
                       fresh: int) -> tuple[pipeline.Outcome, bytes, SessionState]:
    """`rewrite` right here when that is cheaper than a thread hop (a small request, or a resent history
    whose new part is small and whose session is far from a batch; its session in memory and free, the
    archive far from full: nothing to wait for); else in a worker thread, as anything that may wait on a
    lock, a database or the disk must be, and input-sized work (token counting, summaries, batches)."""
    if (size <= INLINE_BYTES or fresh <= INLINE_FRESH_BYTES) and state.archive.has_room:
        context.wait, context.fresh_bytes = False, None if size <= INLINE_BYTES else fresh
        try:
            return rewrite(conversation, context, decoded)
        except WouldBlock:
            pass  # nothing was done: the same work, in a thread
        finally:
            context.wait, context.fresh_bytes = True, None
    return await anyio.to_thread.run_sync(rewrite, conversation, context, decoded)


def rewrite(conversation: pipeline.Conversation, context: pipeline.PipelineContext,
            decoded: Decoded) -> tuple[pipeline.Outcome, bytes, SessionState]:
    """The pipeline and the bytes to forward (worker thread). Unchanged requests go out byte for byte."""
    outcome = pipeline.run(conversation, context)
    if not outcome.changed:
        return outcome, decoded.raw, context.store.get(context.tenant, context.session.id)
    content = decoded.encode(outcome.messages, outcome.original or conversation.messages, outcome.tools)
    if content is decoded.raw:  # the codec refused a rewrite the provider would reject: say what went
        outcome = dataclasses.replace(outcome, messages=conversation.messages, original=None,
                                      tools=conversation.tools, changed=False, internal_tools=False,
                                      tokens_after=outcome.tokens_before, unrewritten=True)
    return outcome, content, context.store.get(context.tenant, context.session.id)


def rounds_context(state: ProxyState, request: Request, wire: WireFormat, decoded: Decoded,
                   outcome: pipeline.Outcome, context: pipeline.PipelineContext, headers: dict[str, str],
                   content: bytes) -> rounds.RoundsContext:
    """Everything an exchange needs past the pipeline: upstream call(s) and their archive records."""
    model, tokens = decoded.model, state.tokens
    layer1 = context.policy.policy.tool_results

    def new_record(forwarded: list[dict[str, Any]], _gate: Any) -> ExchangeRecord:
        # (a round's snapshot of the messages is a copy: the same message objects are the same messages)
        return exchange_record(
            wire, decoded, context.policy, context.session, context.tenant,
            forwarded_messages=None if rounds.same_messages(forwarded, decoded.messages) else forwarded,
            tokens_before=outcome.tokens_before, gate=outcome.gate,
            tokens_after=outcome.tokens_after if rounds.same_messages(forwarded, outcome.messages)
            else tokens.request(forwarded, outcome.tools, model))

    return rounds.RoundsContext(
        upstream=state.upstreams[wire.name], wire=wire, decoded=decoded, path=wire.upstream_path,
        query=request.scope.get("query_string", b""), headers=headers,
        original=outcome.original or decoded.messages, forwarded=outcome.messages, tools=outcome.tools,
        first_content=content,
        tool_context=ToolContext(state.store, context.tenant, context.session.id, layer1.read_page_chars,
                                 search=state.reader.recall, policy=context.policy.name,
                                 recall_results=context.policy.policy.window.recall_results),
        max_rounds=layer1.max_internal_rounds, window=outcome.window or 10**9,
        pad_pct=context.policy.policy.budget.pad_pct,
        gate=lambda original, forwarded, protected: pipeline.gate_round(
            original, forwarded, outcome.tools, model, context, protected),
        count=lambda messages, tools: tokens.request(messages, tools, model),
        new_record=new_record)


async def answer_command(state: ProxyState, wire: WireFormat, decoded: Decoded, policy: LoadedPolicy,
                         session: Session, tenant: str, command: tuple[str, str], started: float) -> Response:
    """A slash command, answered as the assistant without calling the model."""
    name, argument = command
    try:
        text = await anyio.to_thread.run_sync(
            commands.run, name, argument, state.reader, state.pins, policy, tenant, session.id)
    except CtxProxyError as exc:
        text = f"{name} failed: {exc.message}"
    model = decoded.model or "ctxproxy"
    record = exchange_record(wire, decoded, policy, session, tenant, status=200, gate="command")
    headers = {"x-ctxproxy-session": session.id, "x-ctxproxy-policy": policy.name, "x-ctxproxy-gate": "pass",
               "x-ctxproxy-command": name} | overhead(started, 0.0)
    if record.stream:
        record.response_chunks = wire.command_stream(text, model)
        await finish(state, wire, [record], started, policy.name)
        return StreamedResponse(iter(record.response_chunks), headers=headers,
                                 media_type="text/event-stream")
    record.response_body = wire.command_answer(text, model)
    await finish(state, wire, [record], started, policy.name)
    return Response(record.response_body, headers=headers, media_type="application/json")


async def refused(state: ProxyState, wire: WireFormat, decoded: Decoded, policy: LoadedPolicy,
                  session: Session, tenant: str, refusal: ContextLengthExceeded, started: float) -> Response:
    """The gate refused: archive the attempt and answer like the provider would (400)."""
    record = exchange_record(wire, decoded, policy, session, tenant, status=refusal.status, gate="refuse",
                             tokens_before=refusal.extra.get("estimated_tokens"), error=refusal.message)
    state.metrics.gate.labels(policy.name, "refuse").inc()
    await finish(state, wire, [record], started, policy.name)
    headers = {"x-ctxproxy-session": session.id, "x-ctxproxy-policy": policy.name,
               "x-ctxproxy-gate": "refuse",
               "x-ctxproxy-tokens-before": str(refusal.extra.get("estimated_tokens", "")),
               "x-ctxproxy-tokens-after": "0"} | overhead(started, 0.0)
    return Response(wire.error_body(refusal), status_code=refusal.status, headers=headers,
                    media_type="application/json")


def upstreams(config: Config) -> dict[str, Upstream]:
    """One upstream per provider; chat completions and Responses share OpenAI's."""
    openai = Upstream(config.upstream, config.upstream_api_key())
    anthropic = Upstream(config.upstream, config.upstream_api_key(anthropic=True), anthropic=True)
    return {CHAT.name: openai, RESPONSES.name: openai, MESSAGES.name: anthropic}


def build_app(config: Config, *, settle_collector: bool = False) -> Starlette:
    """Create the ASGI app (tests put a scripted upstream on a loopback socket behind upstream.base_url).
    `settle_collector` only from `ctxproxy serve`, whose process it is (proxy/collector.py)."""
    policies = PolicyStore(config.policies_dir, recheck_s=config.server.reload_check_s)
    resent.BODIES.limit_bytes = config.server.resent_cache_bytes
    problems = policies.check_all()
    if problems:
        raise CtxProxyError("invalid policies:\n" + "\n".join(problems))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        metrics = Metrics()
        tokens = server_counter(config.data_dir / "cache", on_restored=metrics.counts_restored.inc,
                                loop=asyncio.get_running_loop())
        await anyio.to_thread.run_sync(warm_up, tokens, policies)
        storage = await anyio.to_thread.run_sync(lambda: open_storage(
            config, tokens, pricing=Pricing(config.prices()), on_exchange=on_archived(metrics)))
        archive, reader = storage.writer, storage.reader
        app.state.proxy = ProxyState(
            config=config, policies=policies,
            upstreams=upstreams(config),
            archive=archive, tokens=tokens, metrics=metrics,
            # (with a ledger, decisions are committed in line: nothing to wait for before a rebuild)
            store=StateStore(persist=archive.submit, lookup=reader,
                             barrier=None if storage.ledger else archive.flush,
                             budget_bytes=config.server.state_cache_bytes, ledger=storage.ledger),
            reader=reader,
            pins=storage.pins, storage=storage)
        app.state.telemetry = telemetry.start(config.telemetry)  # None unless telemetry.otlp_endpoint
        pauses = collector.start(metrics.gc_pause_seconds, settle_process=settle_collector)
        try:
            yield
        finally:
            pauses.remove()
            for task in list(app.state.proxy.tasks):
                task.cancel()
            for upstream in {id(u): u for u in app.state.proxy.upstreams.values()}.values():
                await upstream.aclose()
            await telemetry.stop(app.state.telemetry)  # flushes the spans not exported yet
            heavy.shutdown()
            await anyio.to_thread.run_sync(keep_at_shutdown, tokens.kept, app.state.proxy.store)
            storage.close()

    chat_methods = ["POST"]
    any_method = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
    routes = [  # matched in order: the model routes first, they are nearly every request
        Route("/v1/chat/completions", chat_completions, methods=chat_methods),
        Route("/v1/messages", messages, methods=chat_methods),
        Route("/v1/responses", responses, methods=chat_methods),
        Route("/p/{policy}/v1/chat/completions", chat_completions, methods=chat_methods),
        Route("/p/{policy}/v1/messages", messages, methods=chat_methods),
        Route("/p/{policy}/v1/responses", responses, methods=chat_methods),
        Route("/v1/{path:path}", passthrough, methods=any_method),
        Route("/p/{policy}/v1/{path:path}", passthrough, methods=any_method),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/ctxproxy/search", admin_search, methods=["GET"]),
        Route("/ctxproxy/pins", admin_pins, methods=["GET", "POST"]),
        Route("/ctxproxy/pins/{pin_id}", admin_pins, methods=["DELETE"]),
        *ui_routes(),  # the dashboard, /ctxproxy/ui
    ]
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers={
        CtxProxyError: handle_proxy_error,
        ClientDisconnect: handle_client_disconnect,
        HTTPException: handle_http_exception,  # Starlette's 404/405
        Exception: handle_unexpected,
    })
