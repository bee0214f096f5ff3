"""OpenAI chat completions: the neutral conversation is this format's own messages, so decoding is the
identity and encoding re-serializes the body with the new messages/tools (key order and unknown fields
kept; an unchanged request goes upstream byte for byte)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from proxy import commands, faults, round_stream, validate
from proxy.errors import CtxProxyError
from proxy.upstream_response import UpstreamResponse
from proxy.wire import Decoded, Message, Turn
from proxy.wire.resent import BODIES
from proxy.wire.splice import spliced_body

if TYPE_CHECKING:
    from proxy.rounds import RoundsContext


class ChatFormat:
    name = "chat"
    route = "chat/completions"
    upstream_path = "/chat/completions"
    answer_kind = "chat completion"
    done_markers = (b"data: [DONE]", b'data: {"error"')

    def fresh_bytes(self, raw: bytes) -> int:
        return BODIES.fresh_bytes(raw, "messages")  # (a resent history: only what is new is parsed)

    def decode(self, raw: bytes) -> Decoded:
        body, spans = validate.parse_chat_body(raw)
        messages = body["messages"]

        def encode(forwarded: list[Message], original: list[Message], tools: list[Any] | None) -> bytes:
            if forwarded is messages and tools is body.get("tools"):
                return raw
            updated = body if tools is None else {**body, "tools": tools}
            return spliced_body(updated, "messages", forwarded, spans, messages)  # (unchanged ones copied)

        return Decoded(body=body, model=str(body.get("model") or ""), stream=body.get("stream") is True,
                       messages=messages, tools=body.get("tools"), session_body=body, encode=encode, raw=raw)

    def read_answer(self, payload: bytes) -> tuple[dict[str, Any] | None, str]:
        """The answer as a chat completion whose first message the proxy can act on, or why not."""
        data, problem = faults.answer_object(payload)
        if data is None:
            return None, problem
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices:
            return None, "no choices list"
        if not isinstance(choices[0], dict) or not isinstance(choices[0].get("message"), dict):
            return None, "choices[0].message is not an object"
        calls = choices[0]["message"].get("tool_calls")
        if calls is not None and (not isinstance(calls, list) or not all(_is_call(c) for c in calls)):
            return None, "tool_calls is not a list of calls"
        return data, ""

    def turn(self, data: dict[str, Any], decoded: Decoded) -> Turn:
        message = data["choices"][0]["message"]
        calls = list(message.get("tool_calls") or [])
        text = message.get("content")
        assistant: Message = {"role": "assistant", "content": text or None, "tool_calls": calls}
        return Turn(text if isinstance(text, str) else None, calls, assistant)

    def keep_calls(self, data: dict[str, Any], client_calls: list[dict[str, Any]], note: str | None) -> None:
        """The answer with only the client's calls (ours were answered or dropped)."""
        choice = data["choices"][0]
        message = choice["message"]
        if client_calls:
            message["tool_calls"] = client_calls
            choice["finish_reason"] = "tool_calls"
            return
        message.pop("tool_calls", None)
        message["content"] = (message.get("content") or "") or note
        choice["finish_reason"] = "stop"

    def usage(self, data: dict[str, Any]) -> dict[str, Any] | None:
        usage = data.get("usage")
        return usage if isinstance(usage, dict) else None

    def set_usage(self, data: dict[str, Any], usage: dict[str, Any]) -> None:
        data["usage"] = usage

    def merge_rounds(self, data: dict[str, Any], earlier: list[dict[str, Any]]) -> None:
        """A chat answer is its last round's message (what earlier rounds said went to our tools)."""

    def error_body(self, error: CtxProxyError) -> bytes:
        return error.body_bytes()

    def error_event(self, message: str, code: str, kind: str = "upstream_error") -> bytes:
        return faults.error_event(message, code, kind)

    def command_answer(self, text: str, model: str) -> bytes:
        return commands.completion(text, model)

    def command_stream(self, text: str, model: str) -> list[bytes]:
        return commands.completion_chunks(text, model)

    def window(self, headers: Mapping[str, str]) -> int | None:
        return None

    def watch(self) -> faults.StreamWatch:
        return faults.StreamWatch()

    def stream_rounds(self, rc: RoundsContext, first: UpstreamResponse) -> AsyncIterator[bytes]:
        return round_stream.stream(rc, first, round_stream.ChatFramer())


def _is_call(call: Any) -> bool:
    return isinstance(call, dict) and isinstance(call.get("function"), dict)


CHAT = ChatFormat()
