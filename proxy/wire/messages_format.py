"""Anthropic Messages: the stateless half of the codec — answers read for internal rounds, errors in
Anthropic's shape, slash-command answers, how a relayed stream ends."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

import orjson

from proxy import faults, round_stream
from proxy.errors import ContextLengthExceeded, CtxProxyError
from proxy.upstream_response import UpstreamResponse
from proxy.wire import Decoded, Turn
from proxy.wire.framing import NamedEventWatch
from proxy.wire.messages import block_text, decode, neutral_call
from proxy.wire.messages_check import SCOPE
from proxy.wire.resent import BODIES

if TYPE_CHECKING:
    from proxy.rounds import RoundsContext

LONG_CONTEXT = 1_000_000  # anthropic-beta: context-1m-…
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 408: "timeout_error", 413: "request_too_large",
               429: "rate_limit_error", 504: "timeout_error", 529: "overloaded_error"}


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_object(error: CtxProxyError) -> dict[str, Any]:
    message = error.message
    if isinstance(error, ContextLengthExceeded):  # the provider's words, which Claude Code acts on
        extra = error.extra
        message = (f"prompt is too long: {extra.get('estimated_tokens')} tokens > "
                   f"{extra.get('max_input_tokens')} maximum (ctxproxy: {error.message})")
    found: dict[str, Any] = {"type": error_type(error.status), "message": message}
    return found | {k: v for k, v in error.extra.items() if k == "checkpoint_id"}


def sse_event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def stop_reason_given(event: dict[str, Any]) -> bool:
    delta = event.get("delta")
    return isinstance(delta, dict) and bool(delta.get("stop_reason"))


class MessagesFormat:
    name = "messages"
    route = "messages"
    upstream_path = "/v1/messages"
    answer_kind = "Messages API message"
    done_markers = (b"event: message_stop", b"event: error")

    def fresh_bytes(self, raw: bytes) -> int:
        # Past what an earlier body repeats: its prefix was decoded then (wire/decoded_prefix.py).
        return BODIES.fresh_bytes(raw, "messages", SCOPE)

    def decode(self, raw: bytes) -> Decoded:
        return decode(raw)

    def window(self, headers: Mapping[str, str]) -> int | None:
        """Anthropic's 1M-token context is a beta the client opts into per request."""
        return LONG_CONTEXT if "context-1m" in headers.get("anthropic-beta", "") else None

    def watch(self) -> faults.StreamWatch:
        # message_stop (done), a message_delta with a stop_reason (finished), an error
        return NamedEventWatch(frozenset({"message_stop"}), "message_delta", stop_reason_given)

    def stream_rounds(self, rc: RoundsContext, first: UpstreamResponse) -> AsyncIterator[bytes]:
        from proxy.wire.messages_framer import MessagesFramer

        return round_stream.stream(rc, first, MessagesFramer(rc.decoded))

    def read_answer(self, payload: bytes) -> tuple[dict[str, Any] | None, str]:
        data, problem = faults.answer_object(payload)
        if data is None:
            return None, problem
        content = data.get("content")
        if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
            return None, "content is not a list of blocks"
        if any(b.get("type") == "tool_use" and not isinstance(b.get("id"), str) for b in content):
            return None, "a tool_use block has no id"
        return data, ""

    def turn(self, data: dict[str, Any], decoded: Decoded) -> Turn:
        content = data["content"]
        calls = [neutral_call(b) for b in content if b.get("type") == "tool_use"]
        text = block_text([b for b in content if b.get("type") == "text"]) or None
        assistant: dict[str, Any] = {"role": "assistant", "content": text, "tool_calls": calls}
        decoded.register(assistant, {"role": "assistant", "content": content})
        return Turn(text, calls, assistant)

    def keep_calls(self, data: dict[str, Any], client_calls: list[dict[str, Any]], note: str | None) -> None:
        keep = {c.get("id") for c in client_calls}
        data["content"] = [b for b in data["content"] if b.get("type") != "tool_use" or b.get("id") in keep]
        if client_calls:
            data["stop_reason"] = "tool_use"
            return
        if note and not any(b.get("type") == "text" and b.get("text") for b in data["content"]):
            data["content"].append({"type": "text", "text": note})
        data["stop_reason"] = "end_turn"

    def usage(self, data: dict[str, Any]) -> dict[str, Any] | None:
        usage = data.get("usage")
        return usage if isinstance(usage, dict) else None

    def set_usage(self, data: dict[str, Any], usage: dict[str, Any]) -> None:
        data["usage"] = usage

    def merge_rounds(self, data: dict[str, Any], earlier: list[dict[str, Any]]) -> None:
        """The blocks earlier rounds showed (thinking, text; never our tool_use) lead the answer, as
        they do in a stream: one message, whether streamed or not."""
        shown = [b for answer in earlier for b in answer["content"] if b.get("type") != "tool_use"]
        if shown:
            data["content"] = [*shown, *data["content"]]

    def error_body(self, error: CtxProxyError) -> bytes:
        return orjson.dumps({"type": "error", "error": error_object(error)})

    def error_event(self, message: str, code: str, kind: str = "upstream_error") -> bytes:
        error_kind = "overloaded_error" if code == "upstream_overloaded" else "api_error"
        return sse_event("error", {"type": "error", "error": {"type": error_kind, "message": message}})

    def command_answer(self, text: str, model: str) -> bytes:
        return orjson.dumps(_message(text, model))

    def command_stream(self, text: str, model: str) -> list[bytes]:
        message = _message("", model) | {"content": [], "stop_reason": None}
        return [sse_event("message_start", {"type": "message_start", "message": message}),
                sse_event("content_block_start", {"type": "content_block_start", "index": 0,
                                                  "content_block": {"type": "text", "text": ""}}),
                sse_event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                  "delta": {"type": "text_delta", "text": text}}),
                sse_event("content_block_stop", {"type": "content_block_stop", "index": 0}),
                sse_event("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn",
                                                                               "stop_sequence": None},
                                            "usage": {"output_tokens": 0}}),
                sse_event("message_stop", {"type": "message_stop"})]


def _message(text: str, model: str) -> dict[str, Any]:
    return {"id": f"msg_ctxproxy_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant",
            "model": model, "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
            "stop_sequence": None, "usage": {"input_tokens": 0, "output_tokens": 0}}


MESSAGES = MessagesFormat()
