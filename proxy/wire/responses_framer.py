"""OpenAI Responses streams across internal rounds: the `round_stream.Framer` of this format.

The client sees one response: round 0's response.created, output items numbered 0..n-1 across rounds,
sequence numbers 0..N-1, none of the proxy's function_call items, one response.completed whose output is
what the client was shown (usage summed over rounds). A round that breaks off or stops short ends the
stream with an `error` event, which the openai SDK raises.
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
from proxy.wire.responses import neutral_call
from proxy.wire.responses_stream import ResponsesRound, add_usage, error_event, final_events, is_whole


def is_internal(name: str) -> bool:
    return name in INTERNAL_NAMES


class ResponsesFramer:
    def __init__(self, decoded: Decoded) -> None:
        self.decoded = decoded
        self.round = ResponsesRound(0, 0, is_internal)
        self.items_sent = 0
        self.shown: list[dict[str, Any]] = []  # every item the client got, in its order
        self.usage: dict[str, Any] | None = None
        self.cut_tail = False

    async def relay(self, response: httpx.Response, record: ExchangeRecord, round_no: int,
                    cap: int) -> AsyncIterator[bytes]:
        previous = self.round
        self.round = ResponsesRound(round_no, self.items_sent, is_internal, sequence=previous.sequence,
                                    response_id=_id(previous.response) if round_no else None)
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
        if faults.complete_tail(tail):
            out = self.round.feed(tail.rstrip(b"\r\n"))
            if out:
                yield out
        elif tail.strip():
            self.cut_tail = True

    def end(self, broke: httpx.HTTPError | None, record: ExchangeRecord) -> bytes | None:
        state = self.round
        if state.malformed:
            record.error = f"malformed upstream event relayed untouched: {state.malformed}"
        if state.error is not None:
            record.error = f"upstream sent an error in the stream: {faults.error_message(state.error)}"
            return b""
        if broke is not None:
            message = faults.stream_failure(broke)[1]
            if state.done:
                record.error = f"{message} (after response.completed)"
                self._whole()
                return None
        elif is_whole(state):
            self._whole()
            return None
        else:
            message = "upstream stream ended without response.completed"
        if self.cut_tail:
            message += " (mid-event)"
        record.error = message
        return error_event(message, faults.STREAM_BROKEN, sequence=state.sequence)

    def _whole(self) -> None:
        self.usage = add_usage(self.usage, self.round.usage)
        self.items_sent = self.round.items_sent_after
        self.shown.extend(self.round.sent_items)

    def calls(self) -> list[dict[str, Any]]:
        return [c for c in (neutral_call(i) for i in self.round.items) if c is not None]

    def turn(self) -> Turn:
        text, calls = self.round.text or None, self.calls()
        assistant: dict[str, Any] = {"role": "assistant", "content": text, "tool_calls": calls}
        self.decoded.register(assistant, self.round.items)
        return Turn(text, calls, assistant)

    def finish(self, client_calls: list[dict[str, Any]], dropped_internal: bool, limit: int) -> list[bytes]:
        out: list[bytes] = []
        if client_calls:
            out.extend(self.round.release([str(c.get("id")) for c in client_calls], self.items_sent))
            self.shown.extend(_released(self.round, client_calls))
        return [*out, *final_events(self.round.response, self.shown, self.usage, self.round.sequence,
                                    is_internal=is_internal)]

    def failed_round(self, body: bytes, status: int) -> tuple[bytes, str]:
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            parsed = None
        error = parsed.get("error") if isinstance(parsed, dict) else None
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            message, code = error["message"], str(error.get("code") or "upstream_http_error")
        else:
            message = f"upstream answered HTTP {status}: {body.decode('utf-8', 'replace')[:2000]}"
            code = "upstream_http_error"
        return error_event(message, code, sequence=self.round.sequence), message

    def refusal(self, error: CtxProxyError) -> bytes:
        return error_event(error.message, str(error.code or "context_length_exceeded"), error.type,
                           sequence=self.round.sequence)


def _id(response: dict[str, Any] | None) -> str | None:
    return response.get("id") if isinstance(response, dict) and isinstance(response.get("id"), str) else None


def _released(state: ResponsesRound, client_calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    ids = {c.get("id") for c in client_calls}
    return [i for i in state.items if i.get("call_id") in ids and i.get("type") != "function_call_output"]
