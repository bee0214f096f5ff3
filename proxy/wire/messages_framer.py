"""Anthropic Messages streams across internal rounds: the `round_stream.Framer` of this format.

The client sees one message: round 0's message_start, content blocks numbered 0..n-1 across rounds,
none of the proxy's tool_use blocks, one message_delta (usage summed over rounds) and one message_stop.
A round that breaks off or stops short ends the stream with an Anthropic `error` event, which the SDK
raises.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson

from proxy.archive import ExchangeRecord
from proxy.archive_parse import ParsedResponse
from proxy.archive_traffic import INTERNAL_NAMES
from proxy.errors import CtxProxyError
from proxy.upstream_response import UpstreamResponse
from proxy.wire import Decoded, Turn
from proxy.wire.framing import EventFramer
from proxy.wire.messages_archive import round_answer
from proxy.wire.messages_format import error_object, error_type, sse_event
from proxy.wire.messages_stream import MessagesRound, add_usage, error_event, final_events, is_whole


def is_internal(name: str) -> bool:
    return name in INTERNAL_NAMES


class MessagesFramer(EventFramer):
    round: MessagesRound
    end_name = "a stop_reason or message_stop"

    def __init__(self, decoded: Decoded) -> None:
        super().__init__()
        self.decoded = decoded
        self.round = MessagesRound(0, 0, is_internal)
        self.blocks_sent = 0
        self.usage: dict[str, Any] | None = None

    async def relay(self, response: UpstreamResponse, record: ExchangeRecord, round_no: int,
                    cap: int) -> AsyncIterator[bytes]:
        self.round = MessagesRound(round_no, self.blocks_sent, is_internal)
        async for out in self.events(response, record, cap):
            yield out

    def is_whole(self) -> bool:
        return is_whole(self.round)

    def whole(self) -> None:
        self.usage = add_usage(self.usage, self.round.usage)
        self.blocks_sent = self.round.blocks_sent_after

    def answer(self) -> ParsedResponse:
        return round_answer(self.round)

    def broken(self, message: str) -> bytes:
        return error_event(message)

    def calls(self) -> list[dict[str, Any]]:
        return self.round.calls

    def turn(self) -> Turn:
        text, calls = self.round.text or None, self.round.calls
        assistant: dict[str, Any] = {"role": "assistant", "content": text, "tool_calls": calls}
        self.decoded.register(assistant, {"role": "assistant", "content": self.round.blocks})
        return Turn(text, calls, assistant)

    def finish(self, client_calls: list[dict[str, Any]], dropped_internal: bool, limit: int) -> list[bytes]:
        out: list[bytes] = []
        if client_calls:
            out.extend(self.round.release([str(c.get("id")) for c in client_calls], self.blocks_sent))
        elif dropped_internal and not self.blocks_sent:
            note = f"(ctxproxy: stopped after {limit} read_tool_result rounds without an answer)"
            index = self.blocks_sent
            out += [sse_event("content_block_start", {"type": "content_block_start", "index": index,
                                                      "content_block": {"type": "text", "text": ""}}),
                    sse_event("content_block_delta", {"type": "content_block_delta", "index": index,
                                                      "delta": {"type": "text_delta", "text": note}}),
                    sse_event("content_block_stop", {"type": "content_block_stop", "index": index})]
        stop = "tool_use" if client_calls else "end_turn" if dropped_internal else self.round.stop_reason
        return [*out, *final_events(stop, self.usage, self.round.delta_template)]

    def failed_round(self, body: bytes, status: int) -> tuple[bytes, str]:
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            parsed = None
        error = parsed.get("error") if isinstance(parsed, dict) else None
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            message = error["message"]
            kind = str(error.get("type") or error_type(status))
        else:
            message = f"upstream answered HTTP {status}: {body.decode('utf-8', 'replace')[:2000]}"
            kind = error_type(status)
        return error_event(message, kind), message

    def refusal(self, error: CtxProxyError) -> bytes:
        return sse_event("error", {"type": "error", "error": error_object(error)})
