"""A small fake provider with fault modes on all three wire formats, for bench/faults.py's truncation and
kill -9 parts (bench/fake_upstream.py, the overhead benchmark's upstream, is left as it is).

Run: `python bench/fault_upstream.py [--port 0]`: binds 127.0.0.1, prints `PORT <n>` once listening.
POST /v1/chat/completions, /v1/messages and /v1/responses answer a fixed text (in each API's shape; the
Anthropic and Responses shapes come from the tests' fake provider, tests/anthropic_upstream.py and
tests/responses_upstream.py), or a stream of it (20 pieces) when the body asks for `"stream": true`.
The client's `x-fake-mode` header (relayed upstream by the proxy) picks a fault, streams only:

- cut: the first events of the stream (the answer started, not finished), then the connection drops
  without ending the chunked body;
- stall: the same events, then silence (until the proxy's read timeout);
- short: the same events, then a clean end of the HTTP body without the stream's last event (no `[DONE]`
  / `message_stop` / `response.completed`): a provider that just stops.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests import anthropic_upstream as anthropic_shapes
from tests import responses_upstream as responses_shapes

PIECES = 20
TEXT = "".join(f"tok{i} " for i in range(PIECES))
FIRST = 5  # events a faulty stream sends before it breaks
_STREAM_TRUE = re.compile(rb'"stream"\s*:\s*true')
_CHAT_BASE: dict[str, Any] = {"id": "chatcmpl-fault", "created": 1700000000, "model": "gpt-4o"}


def _chat_chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = _CHAT_BASE | {"object": "chat.completion.chunk",
                         "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
    return b"data: " + orjson.dumps(body) + b"\n\n"


CHAT = orjson.dumps(_CHAT_BASE | {
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": TEXT}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 11, "completion_tokens": PIECES, "total_tokens": 11 + PIECES}})
CHAT_EVENTS = ([_chat_chunk({"role": "assistant", "content": ""})]
               + [_chat_chunk({"content": f"tok{i} "}) for i in range(PIECES)]
               + [_chat_chunk({}, finish="stop"), b"data: [DONE]\n\n"])
MESSAGE = orjson.dumps(anthropic_shapes.message([anthropic_shapes.text(TEXT)], message_id="msg_fault"))
MESSAGE_EVENTS = anthropic_shapes.message_stream([anthropic_shapes.text(TEXT)], message_id="msg_fault",
                                                 pieces=PIECES)
_ITEM = responses_shapes.message_item(TEXT, id="msg_fault")
RESPONSE = orjson.dumps(responses_shapes.response([_ITEM], response_id="resp_fault"))
RESPONSE_EVENTS = responses_shapes.response_stream([_ITEM], response_id="resp_fault", pieces=PIECES)

ROUTES = {  # path suffix: (whole answer, stream events)
    "/v1/chat/completions": (CHAT, CHAT_EVENTS),
    "/v1/messages": (MESSAGE, MESSAGE_EVENTS),
    "/v1/responses": (RESPONSE, RESPONSE_EVENTS),
}
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
NOT_FOUND = b'{"error":{"message":"not found","type":"invalid_request_error"}}'


async def _read_body(receive: Any) -> bytes:
    parts: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(parts)


async def _send(send: Any, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    body = await _read_body(receive)
    if scope["method"] == "GET" and scope["path"] == "/healthz":
        await _send(send, 200, b'{"ok":true}')
        return
    route = next((r for r in ROUTES if scope["path"].endswith(r)), None)
    if scope["method"] != "POST" or route is None:
        await _send(send, 404, NOT_FOUND)
        return
    whole, events = ROUTES[route]
    if not _STREAM_TRUE.search(body):
        await _send(send, 200, whole)
        return
    mode = dict(scope["headers"]).get(b"x-fake-mode", b"")
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    for event in events[:FIRST] if mode else events:  # one ASGI message (one HTTP chunk) an event
        await send({"type": "http.response.body", "body": event, "more_body": True})
    if mode == b"stall":
        await asyncio.sleep(3600)
    if mode == b"cut":
        await asyncio.sleep(0.02)  # what was written reaches the proxy before the connection goes
        raise ConnectionResetError("fault upstream: cut mid-stream")  # uvicorn drops the connection
    await send({"type": "http.response.body", "body": b""})


def start(workdir: Path) -> Any:
    """Run this module as a subprocess (its own GIL) and wait until it answers: a bench.services.Service."""
    from bench.services import Service, ServiceError, _spawn, wait_ready

    proc, log = _spawn("fault_upstream", [sys.executable, str(Path(__file__).resolve()), "--port", "0"],
                       workdir, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode().strip()  # blocks until "PORT n" or EOF
    if not line.startswith("PORT "):
        proc.kill()
        raise ServiceError(f"fault upstream did not report a port ({line!r}):\n{log.read_text()}")
    service = Service("fault upstream", proc, f"http://127.0.0.1:{int(line.split()[1])}", log)
    wait_ready(service, "/healthz", 20)
    return service


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on stdout)")
    args = parser.parse_args()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    config = uvicorn.Config(app, loop="uvloop", http="httptools", lifespan="on", log_level="warning",
                            access_log=False, backlog=1024)
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    uvicorn.Server(config).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
