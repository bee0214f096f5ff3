"""A fast fake OpenAI-compatible upstream for the overhead benchmark (raw ASGI, uvloop + httptools).

Run: `python bench/fake_upstream.py [--port 0]`. It binds 127.0.0.1, prints `PORT <n>` on stdout once
listening, and answers POST /v1/chat/completions with a fixed completion, or with a 20-chunk SSE
stream ending in `data: [DONE]` when the body asks for `"stream": true`; POST /v1/messages the same in
Anthropic's shape (a fixed message, or a stream of 20 content deltas ending in `message_stop`); POST
/v1/responses the same in OpenAI Responses' shape (a Response object with one assistant message, or its
stream: response.created, in_progress, the message's item and part events with 18 `output_text.delta`
events, then `response.completed` carrying the whole Response; shapes as tests/responses_upstream.py).
Bodies are read, never parsed.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import socket
import sys
from typing import Any

import orjson
import uvicorn

STREAM_CHUNKS = 20
# JSON escapes quotes inside strings, so this cannot match text inside a message's content.
_STREAM_TRUE = re.compile(rb'"stream"\s*:\s*true')

_BASE: dict[str, Any] = {"id": "chatcmpl-bench", "created": 1700000000, "model": "gpt-4o"}
_USAGE = {"prompt_tokens": 11, "completion_tokens": 18, "total_tokens": 29}

COMPLETION = orjson.dumps(_BASE | {
    "object": "chat.completion", "system_fingerprint": "fp_bench",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello from the fake upstream."},
                 "logprobs": None, "finish_reason": "stop"}],
    "usage": _USAGE,
})


def _chunk(delta: dict[str, Any], finish: str | None = None, usage: dict[str, Any] | None = None) -> bytes:
    body = _BASE | {"object": "chat.completion.chunk",
                    "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
    if usage is not None:
        body["usage"] = usage
    return b"data: " + orjson.dumps(body) + b"\n\n"


# 20 chunk events: role, 18 content pieces, finish (with usage); then the [DONE] sentinel.
SSE_EVENTS: list[bytes] = (
    [_chunk({"role": "assistant", "content": ""})]
    + [_chunk({"content": f"tok{i} "}) for i in range(STREAM_CHUNKS - 2)]
    + [_chunk({}, finish="stop", usage=_USAGE), b"data: [DONE]\n\n"]
)

_ANTHROPIC_USAGE = {"input_tokens": 11, "output_tokens": 18}
MESSAGE = orjson.dumps({
    "id": "msg_bench", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
    "content": [{"type": "text", "text": "Hello from the fake upstream."}],
    "stop_reason": "end_turn", "stop_sequence": None, "usage": _ANTHROPIC_USAGE,
})


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) + b"\n\n"


# The same 20 content pieces in Anthropic's events: start, block start, 18 deltas, block stop, delta, stop.
MESSAGE_EVENTS: list[bytes] = (
    [_event("message_start", {"message": {**orjson.loads(MESSAGE), "content": [], "stop_reason": None,
                                          "usage": {"input_tokens": 11, "output_tokens": 1}}}),
     _event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})]
    + [_event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": f"tok{i} "}})
       for i in range(STREAM_CHUNKS - 2)]
    + [_event("content_block_stop", {"index": 0}),
       _event("message_delta", {"delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                "usage": {"output_tokens": 18}}),
       _event("message_stop", {})]
)

# OpenAI Responses: the Response object (tests/responses_upstream.py `response`) and its stream.
_TEXT = "Hello from the fake upstream."
_STREAMED = "".join(f"tok{i} " for i in range(STREAM_CHUNKS - 2))


def _response(text: str, status: str = "completed") -> dict[str, Any]:
    done = status == "completed"
    item = {"id": "msg_bench", "type": "message", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": text}]}
    usage = {"input_tokens": 11, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 18,
             "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 29}
    return {"id": "resp_bench", "object": "response", "created_at": 1700000000, "status": status,
            "background": False, "error": None, "incomplete_details": None, "instructions": None,
            "max_output_tokens": None, "max_tool_calls": None, "model": "gpt-4o",
            "output": [item] if done else [], "parallel_tool_calls": True, "previous_response_id": None,
            "prompt_cache_key": None, "reasoning": {"effort": None, "summary": None},
            "safety_identifier": None, "service_tier": "default", "store": False, "temperature": 1.0,
            "text": {"format": {"type": "text"}, "verbosity": "medium"}, "tool_choice": "auto", "tools": [],
            "top_logprobs": 0, "top_p": 1.0, "truncation": "disabled", "usage": usage if done else None,
            "user": None, "metadata": {}}


RESPONSE = orjson.dumps(_response(_TEXT))


def _response_events() -> list[bytes]:
    start = _response("", status="in_progress")
    final = _response(_STREAMED)
    item = final["output"][0]
    at = {"item_id": item["id"], "output_index": 0}
    part = {**at, "content_index": 0}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": start}, {"type": "response.in_progress", "response": start},
        {"type": "response.output_item.added", "output_index": 0,
         "item": item | {"status": "in_progress", "content": []}},
        {"type": "response.content_part.added", **part, "part": item["content"][0] | {"text": ""}}]
    events += [{"type": "response.output_text.delta", **part, "logprobs": [], "delta": f"tok{i} ",
                "obfuscation": "Qx7mZp"} for i in range(STREAM_CHUNKS - 2)]
    events += [{"type": "response.output_text.done", **part, "text": _STREAMED, "logprobs": []},
               {"type": "response.content_part.done", **part, "part": item["content"][0]},
               {"type": "response.output_item.done", "output_index": 0, "item": item},
               {"type": "response.completed", "response": final}]
    return [_event(e["type"], {k: v for k, v in e.items() if k != "type"} | {"sequence_number": n})
            for n, e in enumerate(events)]


RESPONSE_EVENTS = _response_events()

JSON_HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(COMPLETION)).encode())]
MESSAGE_HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(MESSAGE)).encode())]
RESPONSE_HEADERS = [(b"content-type", b"application/json"),
                    (b"content-length", str(len(RESPONSE)).encode())]
ANSWERS = {"chat": (COMPLETION, JSON_HEADERS, SSE_EVENTS),
           "messages": (MESSAGE, MESSAGE_HEADERS, MESSAGE_EVENTS),
           "responses": (RESPONSE, RESPONSE_HEADERS, RESPONSE_EVENTS)}
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


async def _send_simple(send: Any, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Raw ASGI: no framework between uvicorn and the answer."""
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
    path = scope["path"]
    if scope["method"] == "GET" and path in ("/healthz", "/v1/models"):
        await _send_simple(send, 200, b'{"object":"list","data":[{"id":"gpt-4o","object":"model"}]}',
                           [(b"content-type", b"application/json")])
        return
    route = "messages" if path.endswith("/v1/messages") else "responses" if path.endswith("/v1/responses") \
        else "chat" if path.endswith("/chat/completions") else None
    if scope["method"] != "POST" or route is None:
        await _send_simple(send, 404, NOT_FOUND, [(b"content-type", b"application/json")])
        return
    mode = dict(scope["headers"]).get(b"x-fake-mode", b"")
    if mode:
        await _fault(mode, dict(scope["headers"]), send)
        return
    answer, headers, events = ANSWERS[route]
    if not _STREAM_TRUE.search(body):
        await _send_simple(send, 200, answer, headers)
        return
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    for event in events:  # one ASGI message (one HTTP chunk) an event
        await send({"type": "http.response.body", "body": event, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def _fault(mode: bytes, headers: dict[bytes, bytes], send: Any) -> None:
    """Fault modes for bench/faults.py, chosen by the client's `x-fake-mode` header (relayed upstream).

    cut: five stream events, then the connection drops (no terminating chunk); stall: five events,
    then silence until the proxy's read timeout; huge: a valid JSON completion of `x-fake-size` bytes.
    """
    if mode == b"huge":
        size = int(headers.get(b"x-fake-size", b"1000000"))
        head = COMPLETION[:COMPLETION.index(b"Hello from")]
        tail = COMPLETION[COMPLETION.index(b"Hello from") + len(b"Hello from the fake upstream."):]
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(head) + size + len(tail)).encode())]})
        await send({"type": "http.response.body", "body": head, "more_body": True})
        piece = b"x" * (1 << 20)
        for start in range(0, size, len(piece)):
            await send({"type": "http.response.body", "body": piece[:size - start], "more_body": True})
        await send({"type": "http.response.body", "body": tail})
        return
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    for event in SSE_EVENTS[:5]:
        await send({"type": "http.response.body", "body": event, "more_body": True})
    if mode == b"stall":
        await asyncio.sleep(3600)
    raise ConnectionResetError("fake upstream: cut mid-stream")  # uvicorn drops the connection


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on stdout)")
    args = parser.parse_args()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    config = uvicorn.Config(app, loop="uvloop", http="httptools", lifespan="on", log_level="warning",
                            access_log=False, backlog=1024)
    server = uvicorn.Server(config)
    print(f"PORT {sock.getsockname()[1]}", flush=True)  # the parent waits for /healthz before use
    server.run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
