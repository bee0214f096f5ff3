"""Anthropic Messages streams across internal rounds: the `round_stream.Framer` of this format.

The client sees one message: round 0's message_start, content blocks numbered 0..n-1 across rounds,
none of the proxy's tool_use blocks, one message_delta (usage summed over rounds) and one message_stop.
A round that breaks off or stops short ends the stream with an Anthropic `error` event, which the SDK
raises.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson

from proxy import faults
from proxy.archive import ExchangeRecord
from proxy.archive_traffic import INTERNAL_NAMES
from proxy.errors import CtxProxyError
from proxy.sse import EventSplitter
from proxy.wire import Decoded, Turn
from proxy.wire.messages_format import error_object, error_type, sse_event
from proxy.wire.messages_stream import MessagesRound, add_usage, error_event, final_events, is_whole


def is_internal(name: str) -> bool:
    return name in INTERNAL_NAMES


class MessagesFramer:
    def __init__(self, decoded: Decoded) -> None:
        self.decoded = decoded
        self.round = MessagesRound(0, 0, is_internal)
        self.blocks_sent = 0
        self.usage: dict[str, Any] | None = None
        self.cut_tail = False

    async def relay(self, response: httpx.Response, record: ExchangeRecord, round_no: int,
                    cap: int) -> AsyncIterator[bytes]:
        self.round = MessagesRound(round_no, self.blocks_sent, is_internal)
        splitter = EventSplitter()
        async for chunk in response.aiter_raw():
            record.keep_chunk(chunk, cap)
            for event in splitter.feed(chunk):
                out = self.round.feed(event)
                if out:
                    yield out
                if self.round.error is not None:
                    return
        tail = splitter.rest()
        if faults.complete_tail(tail):  # the last event came without its blank line
            out = self.round.feed(tail.rstrip(b"\r\n"))
            if out:
                yield out
        elif tail.strip():
            self.cut_tail = True

    def end(self, broke: httpx.HTTPError | None, record: ExchangeRecord) -> bytes | None:
        """None when the round is whole; else b"" (the upstream's error event was relayed) or ours."""
        state = self.round
        if state.malformed:
            record.error = f"malformed upstream event relayed untouched: {state.malformed}"
        if state.error is not None:
            record.error = f"upstream sent an error in the stream: {faults.error_message(state.error)}"
            return b""
        if broke is not None:
            message = faults.stream_failure(broke)[1]
            if state.done:
                record.error = f"{message} (after message_stop)"
                self._whole()
                return None
        elif is_whole(state):
            self._whole()
            return None
        else:
            message = "upstream stream ended without a stop_reason or message_stop"
        if self.cut_tail:
            message += " (mid-event)"
        record.error = message
        return error_event(message)

    def _whole(self) -> None:
        self.usage = add_usage(self.usage, self.round.usage)
        self.blocks_sent = self.round.blocks_sent_after

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
