"""OpenAI Responses: the stateless half of the codec — answers read for internal rounds, errors in
OpenAI's shape (a refusal names `input`), slash-command answers, how a relayed stream ends."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

import orjson

from proxy import faults, round_stream
from proxy.archive_traffic import INTERNAL_NAMES
from proxy.errors import ContextLengthExceeded, CtxProxyError
from proxy.upstream_response import UpstreamResponse
from proxy.wire import Decoded, Turn
from proxy.wire.framing import NamedEventWatch
from proxy.wire.resent import BODIES
from proxy.wire.responses import decode, neutral_call, text_of

if TYPE_CHECKING:
    from proxy.rounds import RoundsContext

ENDS = frozenset({"response.completed", "response.incomplete", "response.failed"})


def is_internal_item(item: dict[str, Any]) -> bool:
    return item.get("type") == "function_call" and item.get("name") in INTERNAL_NAMES


def visible(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the client may see of a round's output: not our calls, nor the reasoning that led to them."""
    out: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        if is_internal_item(item):
            continue
        following = items[index + 1] if index + 1 < len(items) else None
        if item.get("type") == "reasoning" and following is not None and is_internal_item(following):
            continue
        out.append(item)
    return out


def sse_event(data: dict[str, Any]) -> bytes:
    return b"event: " + str(data["type"]).encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


class ResponsesFormat:
    name = "responses"
    route = "responses"
    upstream_path = "/responses"
    answer_kind = "Responses API response"
    done_markers = (b"event: response.completed", b"event: response.incomplete", b"event: response.failed",
                    b"event: error")

    def fresh_bytes(self, raw: bytes) -> int:
        # Past what an earlier body repeats: its prefix was decoded then (wire/decoded_prefix.py).
        return BODIES.fresh_bytes(raw, "input")

    def decode(self, raw: bytes) -> Decoded:
        return decode(raw)

    def window(self, headers: Mapping[str, str]) -> int | None:
        return None

    def watch(self) -> faults.StreamWatch:
        return NamedEventWatch(ENDS)  # response.completed / incomplete / failed, or an error

    def stream_rounds(self, rc: RoundsContext, first: UpstreamResponse) -> AsyncIterator[bytes]:
        from proxy.wire.responses_framer import ResponsesFramer

        return round_stream.stream(rc, first, ResponsesFramer(rc.decoded))

    def read_answer(self, payload: bytes) -> tuple[dict[str, Any] | None, str]:
        data, problem = faults.answer_object(payload)
        if data is None:
            return None, problem
        output = data.get("output")
        if not isinstance(output, list) or not all(isinstance(i, dict) for i in output):
            return None, "output is not a list of items"
        if any(i.get("type") == "function_call" and not isinstance(i.get("call_id"), str) for i in output):
            return None, "a function_call has no call_id"
        return data, ""

    def turn(self, data: dict[str, Any], decoded: Decoded) -> Turn:
        items = data["output"]
        calls = [c for c in (neutral_call(i) for i in items) if c is not None]
        text = "\n".join(text_of(i.get("content")) for i in items if i.get("type") == "message") or None
        assistant: dict[str, Any] = {"role": "assistant", "content": text, "tool_calls": calls}
        decoded.register(assistant, items)
        return Turn(text, calls, assistant)

    def keep_calls(self, data: dict[str, Any], client_calls: list[dict[str, Any]], note: str | None) -> None:
        data["output"] = visible(data["output"])
        if not client_calls and note and not any(i.get("type") == "message" for i in data["output"]):
            data["output"].append(message_item(note))

    def usage(self, data: dict[str, Any]) -> dict[str, Any] | None:
        usage = data.get("usage")
        return usage if isinstance(usage, dict) else None

    def set_usage(self, data: dict[str, Any], usage: dict[str, Any]) -> None:
        data["usage"] = usage

    def merge_rounds(self, data: dict[str, Any], earlier: list[dict[str, Any]]) -> None:
        """Earlier rounds' output the client may see leads the answer, as it does in a stream."""
        shown = [item for answer in earlier for item in visible(answer["output"])]
        data["output"] = [*shown, *visible(data["output"])] if earlier else data["output"]

    def error_body(self, error: CtxProxyError) -> bytes:
        if isinstance(error, ContextLengthExceeded):
            error.param = "input"
        return error.body_bytes()

    def error_event(self, message: str, code: str, kind: str = "upstream_error") -> bytes:
        # The openai SDK raises on an `error` event whose data holds an `error` object.
        error = {"type": kind, "code": code, "message": message, "param": None}
        return sse_event({"type": "error", "code": code, "message": message, "param": None, "error": error})

    def command_answer(self, text: str, model: str) -> bytes:
        return orjson.dumps(_response(text, model))

    def command_stream(self, text: str, model: str) -> list[bytes]:
        final = _response(text, model)
        started = {**final, "status": "in_progress", "output": []}
        events = [{"type": "response.created", "response": started},
                  *text_item_events(final["output"][0], 0), {"type": "response.completed", "response": final}]
        return [sse_event(event | {"sequence_number": n}) for n, event in enumerate(events)]


def text_item_events(item: dict[str, Any], index: int) -> list[dict[str, Any]]:
    """The events that stream one message item of one output_text part (no sequence numbers)."""
    part = item["content"][0]
    text = part["text"]
    at = {"item_id": item["id"], "output_index": index, "content_index": 0}
    return [{"type": "response.output_item.added", "output_index": index, "item": {**item, "content": []}},
            {"type": "response.content_part.added", **at, "part": {**part, "text": ""}},
            {"type": "response.output_text.delta", **at, "delta": text},
            {"type": "response.output_text.done", **at, "text": text},
            {"type": "response.content_part.done", **at, "part": part},
            {"type": "response.output_item.done", "output_index": index, "item": item}]


def message_item(text: str) -> dict[str, Any]:
    return {"type": "message", "id": f"msg_ctxproxy_{uuid.uuid4().hex[:24]}", "role": "assistant",
            "status": "completed", "content": [{"type": "output_text", "text": text, "annotations": []}]}


def _response(text: str, model: str) -> dict[str, Any]:
    return {"id": f"resp_ctxproxy_{uuid.uuid4().hex[:24]}", "object": "response",
            "created_at": int(time.time()), "status": "completed", "model": model,
            "output": [message_item(text)], "usage": {"input_tokens": 0, "output_tokens": 0,
                                                       "total_tokens": 0}}


RESPONSES = ResponsesFormat()
