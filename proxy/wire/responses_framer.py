"""OpenAI Responses streams across internal rounds: the `round_stream.Framer` of this format.

The client sees one response: round 0's response.created, output items numbered 0..n-1 across rounds,
sequence numbers 0..N-1, none of the proxy's function_call items, one response.completed whose output is
what the client was shown (usage summed over rounds). A round that breaks off or stops short ends the
stream with an `error` event, which the openai SDK raises.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson

from proxy import faults
from proxy.archive import ExchangeRecord
from proxy.archive_parse import ParsedResponse
from proxy.archive_traffic import INTERNAL_NAMES
from proxy.errors import CtxProxyError
from proxy.rounds import stopped_note
from proxy.upstream_response import UpstreamResponse
from proxy.wire import Decoded, Turn
from proxy.wire.framing import EventFramer
from proxy.wire.responses import neutral_call
from proxy.wire.responses_archive import response_answer
from proxy.wire.responses_format import message_item, text_item_events
from proxy.wire.responses_stream import ResponsesRound, add_usage, error_event, final_events, is_whole, sse


def is_internal(name: str) -> bool:
    return name in INTERNAL_NAMES


class ResponsesFramer(EventFramer):
    round: ResponsesRound
    end_name = "response.completed"

    def __init__(self, decoded: Decoded) -> None:
        super().__init__()
        self.decoded = decoded
        self.round = ResponsesRound(0, 0, is_internal)
        self.items_sent = 0
        self.shown: list[dict[str, Any]] = []  # every item the client got, in its order
        self.usage: dict[str, Any] | None = None

    async def relay(self, response: UpstreamResponse, record: ExchangeRecord, round_no: int,
                    cap: int) -> AsyncIterator[bytes]:
        previous = self.round
        self.round = ResponsesRound(round_no, self.items_sent, is_internal, sequence=previous.sequence,
                                    response_id=_id(previous.response) if round_no else None)
        async for out in self.events(response, record, cap):
            yield out

    def is_whole(self) -> bool:
        return is_whole(self.round)

    def whole(self) -> None:
        self.usage = add_usage(self.usage, self.round.usage)
        self.items_sent = self.round.items_sent_after
        self.shown.extend(self.round.sent_items)

    def answer(self) -> ParsedResponse | None:
        final = self.round.final  # (response.completed's object, untouched)
        return None if final is None else response_answer(final)

    def broken(self, message: str) -> bytes:
        return error_event(message, faults.STREAM_BROKEN, sequence=self.round.sequence)

    def calls(self) -> list[dict[str, Any]]:
        return [c for c in (neutral_call(i) for i in self.round.items) if c is not None]

    def turn(self) -> Turn:
        text, calls = self.round.text or None, self.calls()
        assistant: dict[str, Any] = {"role": "assistant", "content": text, "tool_calls": calls}
        self.decoded.register(assistant, self.round.items)
        return Turn(text, calls, assistant)

    def finish(self, client_calls: list[dict[str, Any]], dropped_internal: bool, limit: int) -> list[bytes]:
        out: list[bytes] = []
        sequence = self.round.sequence
        if client_calls:
            out.extend(self.round.release([str(c.get("id")) for c in client_calls], self.items_sent))
            self.shown.extend(_released(self.round, client_calls))
            sequence = self.round.sequence
        elif dropped_internal and not any(i.get("type") == "message" for i in self.shown):
            item = message_item(stopped_note(limit))
            events = text_item_events(item, self.items_sent)
            out += [sse(event | {"sequence_number": sequence + n}) for n, event in enumerate(events)]
            sequence += len(events)
            self.shown.append(item)
        return [*out, *final_events(self.round.response, self.shown, self.usage, sequence,
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
