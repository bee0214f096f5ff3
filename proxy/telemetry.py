"""OpenTelemetry traces of exchanges, exported over OTLP/HTTP (config `telemetry.otlp_endpoint`).

    chat gpt-4o                         SERVER: the client's request, to the end of its answer
    ├── ctxproxy.pipeline               the layers (worker thread): ctxproxy.tool_results, .window,
    │                                   .blocks, .budget
    ├── chat gpt-4o                     CLIENT: each upstream call, the first and every internal round
    └── execute_tool read_tool_result   each internal call the proxy answers (recall too)

GenAI semantic-convention attributes plus ctxproxy.* (session, policy, gate, tokens before/after, route):
names, models, counts, statuses and ids, never message content, keys or headers. Unset, the SDK is never
imported and a hook costs one ContextVar read. Set, each app has its own TracerProvider (not the global
one) and BatchSpanProcessor, flushed at shutdown. A client's W3C `traceparent` becomes the exchange's
parent. Usage is read from the archive records after the exchange, on a telemetry thread.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar
from urllib.parse import urlsplit

import anyio
from starlette.requests import ClientDisconnect
from starlette.responses import StreamingResponse

from proxy import __version__
from proxy.internal_tools import INTERNAL_NAMES
from proxy.telemetry_records import CACHE, USAGE, answer_attributes, present, record_problem

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span
    from starlette.requests import Request
    from starlette.responses import Response

    from proxy.archive import ExchangeRecord
    from proxy.config import TelemetryConfig
    from proxy.rounds import RoundsContext
    from proxy.upstream_response import UpstreamResponse

log = logging.getLogger("ctxproxy")
P = ParamSpec("P")
T = TypeVar("T")
Handler = Callable[["Request", Any], Awaitable["Response"]]

_exchange: ContextVar[Exchange | None] = ContextVar("ctxproxy_exchange", default=None)
_parent: ContextVar[Context | None] = ContextVar("ctxproxy_span_parent", default=None)  # inside a child span


class Telemetry:
    """One app's tracer provider, span processor and exporter, and the thread that completes spans."""

    def __init__(self, config: TelemetryConfig, exporter: SpanExporter | None = None) -> None:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter(endpoint=traces_url(str(config.otlp_endpoint)),
                                        headers=dict(config.headers) or None, timeout=config.timeout_s)
        self.provider = TracerProvider(resource=Resource.create({"service.name": config.service_name}),
                                       shutdown_on_exit=False)  # the app's lifespan shuts it down
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("ctxproxy", __version__)
        self.api = trace
        self.propagator = TraceContextTextMapPropagator()
        self._completing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ctxproxy-telemetry")

    def complete(self, work: Callable[[], None]) -> None:
        """Finish spans off the event loop (reading token usage parses the answer), in order."""
        def run() -> None:
            try:
                work()
            except Exception:  # a bug here must not go unnoticed, nor reach a request
                log.exception("telemetry: completing the spans of an exchange failed")

        with suppress(RuntimeError):  # after shutdown: nothing is exported any more
            self._completing.submit(run)

    def _settle(self, timeout_s: float) -> None:
        """Wait for the spans of every exchange ended so far (one worker: they run in order)."""
        self._completing.submit(lambda: None).result(timeout=timeout_s)

    def force_flush(self, timeout_s: float = 30.0) -> bool:
        """Export every span of the exchanges ended so far (blocking; any thread)."""
        self._settle(timeout_s)
        return self.provider.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        self._completing.shutdown(wait=True)
        self.provider.shutdown()  # flushes the batch processor


def start(config: TelemetryConfig) -> Telemetry | None:
    """Tracing for one app, or None (nothing imported, nothing exported) without an endpoint."""
    return Telemetry(config) if config.otlp_endpoint else None


async def stop(telemetry: Telemetry | None) -> None:
    if telemetry is not None:
        await anyio.to_thread.run_sync(telemetry.shutdown)


def traces_url(endpoint: str) -> str:
    """A collector's base URL gets /v1/traces (as OTEL_EXPORTER_OTLP_ENDPOINT); a URL naming it is kept."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith("/v1/traces") else endpoint + "/v1/traces"


# ------------------------------------------------------------------------------ the exchange span

@dataclass
class UpstreamCall:
    span: Span
    end_ns: int | None = None
    record: ExchangeRecord | None = None  # the round's archive record, taken when its response closes


class Exchange:
    """One client request's SERVER span and the CLIENT spans of its upstream calls."""

    def __init__(self, telemetry: Telemetry, request: Request, wire: Any) -> None:
        self.telemetry = telemetry
        self.provider = "anthropic" if wire.name == "messages" else "openai"
        attributes = present({
            "gen_ai.operation.name": "chat", "gen_ai.provider.name": self.provider,
            "gen_ai.system": self.provider, "ctxproxy.route": wire.route,
            "http.request.method": request.method, "url.path": request.url.path,
            "server.address": request.url.hostname, "server.port": request.url.port})
        self.span = telemetry.tracer.start_span(
            "chat", context=telemetry.propagator.extract(request.headers),
            kind=telemetry.api.SpanKind.SERVER, attributes=attributes)
        self.context = telemetry.api.set_span_in_context(self.span)
        self.calls: list[UpstreamCall] = []
        self.records: list[ExchangeRecord] = []
        self.status = 0
        self.streaming = False  # the answer is a stream: it ends with `finish` (see records_done)
        self.ended = False

    def child(self, name: str, kind: Any = None, attributes: dict[str, Any] | None = None) -> Span:
        return self.telemetry.tracer.start_span(
            name, context=_parent.get() or self.context, kind=kind or self.telemetry.api.SpanKind.INTERNAL,
            attributes=present(attributes or {}))

    def responded(self, response: Response) -> None:
        """What the response headers say the proxy did (the refused and error answers included)."""
        self.status, headers = response.status_code, response.headers
        for name in ("session", "policy", "gate", "tokens_before", "tokens_after"):
            value, count = headers.get("x-ctxproxy-" + name.replace("_", "-")), name.startswith("tokens")
            if value and (value.isdigit() or not count):
                self.span.set_attribute(f"ctxproxy.{name}", int(value) if count else value)

    def end(self, status: int | None = None, error: str | None = None) -> None:
        """The end of the exchange (event loop). Spans are completed on the telemetry thread."""
        if self.ended:
            return
        self.ended = True
        now = time.time_ns()
        for call in self.calls:
            call.end_ns = call.end_ns or now  # a response never closed ends with the exchange
        calls, records = list(self.calls), list(self.records)
        self.telemetry.complete(functools.partial(
            self._complete, now, self.status if status is None else status, error, calls, records))

    def _complete(self, end_ns: int, status: int, error: str | None, calls: list[UpstreamCall],
                  records: list[ExchangeRecord]) -> None:
        answers = {id(record): answer_attributes(record) for record in records}
        for call in calls:
            if call.record is not None:
                call.span.set_attributes(answers.get(id(call.record)) or answer_attributes(call.record))
                if problem := record_problem(call.record):
                    _failed(call.span, problem)
            call.span.end(end_time=call.end_ns)
        model = records[0].model if records else None
        if model:
            self.span.update_name(f"chat {model}")
            self.span.set_attribute("gen_ai.request.model", model)
        last = answers.get(id(records[-1]), {}) if records else {}
        self.span.set_attributes({k: v for k, v in last.items()  # (the client sees the first round's id)
                                  if not k.startswith("gen_ai.usage.") and k != "gen_ai.response.id"})
        for key in (*USAGE, *CACHE):
            counts = [a[key] for a in answers.values() if key in a]
            if counts:
                self.span.set_attribute(key, sum(counts))  # every round's tokens: what the client is billed
        self.span.set_attributes({"http.response.status_code": status, "ctxproxy.upstream_calls": len(calls)})
        gone = status == 499 or any(record_problem(r) == "client_disconnected" for r in records)
        if status >= 500:  # a server span's 4xx is the client's error, not ours
            _failed(self.span, error or str(status))
        elif error or gone:
            self.span.set_attribute("error.type", error or "client_disconnected")
        self.span.end(end_time=end_ns)

    async def until_end(self, body: AsyncIterable[Any]) -> AsyncIterator[Any]:
        """A streamed answer's body: the exchange is current while it is relayed, and ends with it."""
        token = _exchange.set(self)
        self.streaming = True
        try:
            async for chunk in body:
                yield chunk
        finally:
            self.end()  # usually done already, by `finish` before the stream's last event
            with suppress(ValueError, RuntimeError):  # an abandoned stream, finalized in another context
                _exchange.reset(token)


def exchange(handler: Handler) -> Handler:
    """Decorates the app's `converse`: one SERVER span per client request (no-op without telemetry)."""
    @functools.wraps(handler)
    async def traced(request: Request, wire: Any) -> Response:
        telemetry: Telemetry | None = getattr(request.app.state, "telemetry", None)
        if telemetry is None:
            return await handler(request, wire)
        current = Exchange(telemetry, request, wire)
        token = _exchange.set(current)
        try:
            response = await handler(request, wire)
        except BaseException as exc:  # answered by the app's exception handlers, or the client left
            status = getattr(exc, "status", None)
            gone = isinstance(exc, ClientDisconnect | anyio.get_cancelled_exc_class())
            current.end(499 if gone else status if isinstance(status, int) else 500, type(exc).__name__)
            raise
        finally:
            _exchange.reset(token)
        current.responded(response)
        if isinstance(response, StreamingResponse):
            response.body_iterator = current.until_end(response.body_iterator)
        else:
            current.end()
        return response
    return traced


def records_done(records: list[ExchangeRecord]) -> None:
    """Called by `finish` with the exchange's archive records; a stream's exchange ends here, before its
    last event reaches the client (as the archive does), so a client that saw the end can flush."""
    current = _exchange.get()
    if current is None or current.ended:
        return
    current.records = records
    if current.streaming:
        current.end()


# ------------------------------------------------------------------------------ upstream calls

async def upstream_call(rc: RoundsContext, opening: Awaitable[UpstreamResponse]) -> UpstreamResponse:
    """A CLIENT span around one upstream call (`opening`: the awaitable of Upstream.open), to the close of
    its response; usage and response model are added from its archive record when the exchange ends."""
    current = _exchange.get()
    if current is None:
        return await opening
    base = urlsplit(rc.upstream.base_url)
    model = rc.decoded.model
    kind = current.telemetry.api.SpanKind.CLIENT
    call = UpstreamCall(current.child(f"chat {model}" if model else "chat", kind, {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": current.provider,
        "gen_ai.system": current.provider, "gen_ai.request.model": model or None,
        "server.address": base.hostname, "server.port": base.port or (443 if base.scheme == "https" else 80),
        "http.request.method": "POST", "ctxproxy.round": len(current.calls)}))
    current.calls.append(call)
    try:
        response = await opening
    except BaseException as exc:
        call.end_ns = time.time_ns()
        cancelled = isinstance(exc, anyio.get_cancelled_exc_class())
        _failed(call.span, "cancelled" if cancelled else type(exc).__name__)
        raise
    call.span.set_attribute("http.response.status_code", response.status_code)
    if response.status_code >= 400:
        _failed(call.span, str(response.status_code))

    def closed() -> None:
        if not current.ended and call.end_ns is None:
            call.end_ns = time.time_ns()
            call.record = rc.records[-1] if rc.records else None  # each round's record is made by then

    response.on_close(closed)  # however its body was read
    return response


# ------------------------------------------------------------------------------ spans inside an exchange

_NO_SPAN: AbstractContextManager[None] = nullcontext()  # (reusable: it holds nothing)


def span(name: str, attributes: dict[str, Any] | None = None) -> AbstractContextManager[Span | None]:
    """A child span of the exchange (or of the span this one is inside); None outside an exchange."""
    current = _exchange.get()
    return _NO_SPAN if current is None else _child_span(current, name, attributes)


@contextmanager
def _child_span(current: Exchange, name: str, attributes: dict[str, Any] | None) -> Iterator[Span | None]:
    child = current.child(name, attributes=attributes)
    token = _parent.set(current.telemetry.api.set_span_in_context(child))
    try:
        yield child
    except BaseException as exc:
        _failed(child, type(exc).__name__)
        raise
    finally:
        _parent.reset(token)
        child.end()


def traced(name: str, describe: Callable[[Any], dict[str, Any]] | None = None
           ) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """A function as a child span (the pipeline and its layers); `describe` its result as attributes."""
    def decorate(function: Callable[P, T]) -> Callable[P, T]:
        @functools.wraps(function)
        def call(*args: P.args, **kwargs: P.kwargs) -> T:
            if _exchange.get() is None:
                return function(*args, **kwargs)
            with span(name) as child:
                result = function(*args, **kwargs)
                if describe is not None and child is not None:
                    child.set_attributes(present(describe(result)))
                return result
        return call
    return decorate


def tool_call(call: dict[str, Any]) -> AbstractContextManager[Span | None]:
    """An internal call the proxy answers (the arguments are the model's: not recorded)."""
    function = call.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    name = name if name in INTERNAL_NAMES else "unknown"
    return span(f"execute_tool {name}", {
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name, "gen_ai.tool.type": "function",
        "gen_ai.tool.call.id": call.get("id") if isinstance(call.get("id"), str) else None})


def outcome_attributes(outcome: Any) -> dict[str, Any]:
    """The pipeline's decision (proxy.pipeline.Outcome)."""
    return {"ctxproxy.gate": outcome.gate, "ctxproxy.tokens_before": outcome.tokens_before,
            "ctxproxy.tokens_after": outcome.tokens_after, "ctxproxy.changed": outcome.changed,
            "ctxproxy.evicted_exchanges": len(outcome.evicted),
            "ctxproxy.internal_tools": outcome.internal_tools}


def _failed(span: Span, error_type: str) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("error.type", error_type)
    span.set_status(Status(StatusCode.ERROR))
