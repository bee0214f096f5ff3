"""Real uvicorn servers on loopback sockets for the tests, plus a scripted fake provider.

The fake upstream stands in for the provider we cannot reach. It records every request it gets
(raw bytes and headers) and answers from a script of steps, defaulting to a short echo reply. It speaks
OpenAI chat completions on `/v1/chat/completions`, Anthropic Messages on `/v1/messages` (shapes in
`tests.anthropic_upstream`) and OpenAI Responses on `/v1/responses` (shapes in `tests.responses_upstream`);
the routes share one script.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from tests.anthropic_upstream import last_user_text, message, message_stream
from tests.anthropic_upstream import text as text_block
from tests.responses_upstream import last_user_text as responses_last_user_text
from tests.responses_upstream import message_item, response, response_stream


class ServerThread:
    """Run an ASGI app with uvicorn on 127.0.0.1:<free port> in a background thread."""

    def __init__(self, app: Any, *, certfile: str | None = None, keyfile: str | None = None) -> None:
        self.scheme = "https" if certfile else "http"
        # With the protocol given, asyncio sets TCP_NODELAY (else ~40 ms of delayed ACK per request).
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        # A long keep-alive: a loaded test machine can leave a pooled connection idle past uvicorn's 5 s,
        # and a request sent as the server closes it fails with a ReadError that is no test's subject.
        config = uvicorn.Config(app, log_level="warning", lifespan="on", loop="asyncio", http="httptools",
                                timeout_graceful_shutdown=5, timeout_keep_alive=120,
                                ssl_certfile=certfile, ssl_keyfile=keyfile)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:  # readiness poll, not synchronization of behaviour under test
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.005)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)
        self.sock.close()


@dataclass
class Seen:
    path: str
    method: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


RESET = "reset"  # abort the connection with a TCP RST (the client reads ECONNRESET)
CLOSE = "close"  # close the connection without ending the chunked body (an incomplete chunked read)
FAULTS = frozenset({RESET, CLOSE})


@dataclass
class Step:
    """One scripted answer. `kind`: reply | stream | error | hang | raw.

    A reply answers `payload` verbatim when given, else on the chat route a completion of `content` /
    `tool_calls`, on the messages route a Message of `blocks` (else of one text block `content`), on the
    responses route a Response of `items` (else of one message item `content`); there a stream step without
    `chunks` streams those items (`tests.responses_upstream.response_stream`).
    `fault` (reset | close) breaks a stream or raw answer off after its chunks / first `cut_after`
    body bytes; `hang_after_chunks` stalls a stream after its chunks until the client goes away.
    """

    kind: str = "reply"
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    status: int = 200
    body: bytes = b""
    chunks: list[bytes] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)
    hang_after_chunks: bool = False
    hold_after_first: threading.Event | None = None  # send the rest only once the test saw chunk one
    fault: str | None = None  # RESET | CLOSE, after the chunks (stream) or `cut_after` bytes (raw)
    cut_after: int = 0  # raw answers with a fault: how many body bytes go out first
    blocks: list[dict[str, Any]] | None = None  # messages route: the reply's content blocks
    payload: dict[str, Any] | None = None  # reply: this JSON object as the whole answer (any route)
    items: list[dict[str, Any]] | None = None  # responses route: the reply's output items


def huge_stream(size: int, *, piece: int = 1 << 16, response_id: str = "chatcmpl-huge") -> list[bytes]:
    """A valid stream whose one content delta is `size` characters, sent in `piece`-byte network writes."""
    body = b"".join(stream_chunks(["x" * size], response_id=response_id))
    return [body[i:i + piece] for i in range(0, len(body), piece)]


def completion(content: str | None, tool_calls: list[dict[str, Any]] | None = None, *,
               model: str = "gpt-4o", response_id: str = "chatcmpl-fake") -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": response_id, "object": "chat.completion", "created": 1700000000, "model": model,
        "choices": [{"index": 0, "message": message,
                     "finish_reason": "tool_calls" if tool_calls else "stop"}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14,
                  "prompt_tokens_details": {"cached_tokens": 5}},
    }


def sse(chunk: dict[str, Any] | str) -> bytes:
    data = chunk if isinstance(chunk, str) else orjson.dumps(chunk).decode()
    return f"data: {data}\n\n".encode()


def stream_chunks(text_pieces: list[str], *, response_id: str = "chatcmpl-stream",
                  tool_calls: list[dict[str, Any]] | None = None) -> list[bytes]:
    base = {"id": response_id, "object": "chat.completion.chunk", "created": 1700000000, "model": "gpt-4o"}
    out = [sse(base | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                    "finish_reason": None}]})]
    for piece in text_pieces:
        delta = {"content": piece}
        out.append(sse(base | {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}))
    for index, call in enumerate(tool_calls or ()):
        out.append(sse(base | {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": index, "id": call["id"], "type": "function",
             "function": {"name": call["function"]["name"], "arguments": ""}}]}, "finish_reason": None}]}))
        out.append(sse(base | {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": index, "function": {"arguments": call["function"]["arguments"]}}]},
            "finish_reason": None}]}))
    out.append(sse(base | {"choices": [{"index": 0, "delta": {},
                                        "finish_reason": "tool_calls" if tool_calls else "stop"}]}))
    out.append(sse("[DONE]"))
    return out


class WithTransport:
    """ASGI middleware: put uvicorn's transport in the scope (its `send` is bound to the request cycle,
    which holds it), so a fault step can close or reset the connection itself."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            scope["fake.transport"] = getattr(getattr(send, "__self__", None), "transport", None)
        await self.app(scope, receive, send)


class FakeUpstream:
    """A scripted OpenAI-like provider. Thread-safe enough for the tests: one request at a time."""

    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self.script: deque[Step | Callable[[Seen], Step]] = deque()
        self.by_model: dict[str, Callable[[Seen], Step]] = {}  # answers for a model, outside the script
        self.got_request = threading.Event()
        self.saw_disconnect = threading.Event()
        self.routes = Starlette(routes=[
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/messages", self.messages, methods=["POST"]),
            Route("/v1/responses", self.responses, methods=["POST"]),
            Route("/v1/{path:path}", self.other, methods=["GET", "POST", "DELETE", "PUT", "PATCH"]),
        ])
        self.app = WithTransport(self.routes)

    def reset(self) -> None:
        self.seen.clear()
        self.script.clear()
        self.by_model.clear()
        self.got_request.clear()
        self.saw_disconnect.clear()

    def then(self, *steps: Step | Callable[[Seen], Step]) -> FakeUpstream:
        self.script.extend(steps)
        return self

    @property
    def chat_requests(self) -> list[Seen]:
        return [s for s in self.seen if s.path.endswith("/chat/completions")]

    @property
    def messages_requests(self) -> list[Seen]:
        return [s for s in self.seen if s.path.split("?")[0] == "/v1/messages"]

    @property
    def responses_requests(self) -> list[Seen]:
        return [s for s in self.seen if s.path.split("?")[0] == "/v1/responses"]

    async def _record(self, request: Request) -> Seen:
        seen = Seen(request.url.path + (f"?{request.url.query}" if request.url.query else ""),
                    request.method, dict(request.headers), await request.body())
        self.seen.append(seen)
        self.got_request.set()
        return seen

    async def _wait_for_disconnect(self, request: Request) -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                self.saw_disconnect.set()
                return

    def _next_step(self, seen: Seen) -> Step | None:
        model = orjson.loads(seen.body).get("model") if seen.body.startswith(b"{") else None
        if model in self.by_model:
            step = self.by_model[model](seen)
        else:
            step = self.script.popleft() if self.script else None
        if callable(step):
            step = step(seen)
        return step

    async def chat(self, request: Request) -> Response:
        seen = await self._record(request)
        step = self._next_step(seen)
        if step is None:
            body = seen.json()
            last = body["messages"][-1].get("content")
            step = Step(content=f"echo: {last}" if isinstance(last, str) else "echo")
            if body.get("stream"):
                step = Step(kind="stream", chunks=stream_chunks([step.content or ""]))
        return await self._answer(request, step, lambda: completion(step.content, step.tool_calls))

    async def messages(self, request: Request) -> Response:
        seen = await self._record(request)
        step = self._next_step(seen)
        if step is None:
            body = seen.json()
            last = last_user_text(body)
            blocks = [text_block(f"echo: {last}" if last is not None else "echo")]
            step = Step(kind="stream", chunks=message_stream(blocks)) if body.get("stream") \
                else Step(blocks=blocks)
        blocks = step.blocks if step.blocks is not None else [text_block(step.content or "")]
        return await self._answer(request, step, lambda: message(blocks),
                                  extra_headers={"request-id": "req_fake"})

    async def responses(self, request: Request) -> Response:
        seen = await self._record(request)
        step = self._next_step(seen)
        body = orjson.loads(seen.body) if seen.body.startswith(b"{") else {}
        model = body.get("model") or "gpt-5"
        if step is None:
            last = responses_last_user_text(body)
            step = Step(kind="stream" if body.get("stream") else "reply",
                        items=[message_item(f"echo: {last}" if last is not None else "echo")])
        items = step.items if step.items is not None else [message_item(step.content or "")]
        if step.kind == "stream" and not step.chunks:
            step = dataclasses.replace(step, chunks=response_stream(items, model=model))
        return await self._answer(request, step, lambda: response(items, model=model),
                                  extra_headers={"x-request-id": "req_fake"})

    async def _answer(self, request: Request, step: Step, reply: Callable[[], dict[str, Any]],
                      extra_headers: dict[str, str] | None = None) -> Response:
        extra = extra_headers or {}
        if step.kind == "hang":
            await self._wait_for_disconnect(request)
            return Response(b"", status_code=599)
        if step.kind == "error":
            return Response(step.body, status_code=step.status, headers=step.headers,
                            media_type="application/json")
        if step.kind == "raw" and step.fault in FAULTS:
            async def cut_body():
                yield step.body[:step.cut_after]
                await self._break(request, step.fault)

            return StreamingResponse(cut_body(), status_code=step.status,
                                     headers={"content-length": str(len(step.body)), **step.headers})
        if step.kind == "raw":
            return Response(step.body, status_code=step.status, headers=step.headers)
        if step.kind == "stream":
            async def generate():
                for index, chunk in enumerate(step.chunks):
                    yield chunk
                    await asyncio.sleep(0)
                    if index == 0 and step.hold_after_first is not None:
                        await anyio.to_thread.run_sync(step.hold_after_first.wait, 30)
                if step.fault in FAULTS:
                    await self._break(request, step.fault)
                if step.hang_after_chunks:
                    await self._wait_for_disconnect(request)

            return StreamingResponse(generate(), status_code=step.status,
                                     headers={"x-upstream": "fake", **extra, **step.headers},
                                     media_type="text/event-stream")
        payload = orjson.dumps(step.payload if step.payload is not None else reply())
        return Response(payload, status_code=step.status, media_type="application/json",
                        headers={"x-upstream": "fake", **extra, **step.headers})

    async def _break(self, request: Request, fault: str) -> None:
        """End the connection mid-answer: FIN without the last chunk (CLOSE) or an RST (RESET)."""
        transport = request.scope.get("fake.transport")
        assert transport is not None, "uvicorn's transport is not reachable from the app"
        await asyncio.sleep(0.05)  # let what was written reach the peer before the connection goes
        if fault == RESET:
            sock = transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            transport.abort()
        else:
            transport.close()
        await self._wait_for_disconnect(request)  # uvicorn sends nothing more once it saw the loss

    async def other(self, request: Request) -> Response:
        seen = await self._record(request)
        if seen.path.startswith("/v1/models"):
            return Response(b'{"object":"list","data":[{"id":"gpt-4o","object":"model","created":1,'
                            b'"owned_by":"fake"}]}', media_type="application/json")
        # Echo: status 200, body = the request bytes, so byte identity can be checked both ways.
        return Response(seen.body, media_type=request.headers.get("content-type", "application/octet-stream"),
                        headers={"x-echo-method": request.method})
