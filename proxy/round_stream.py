"""Internal tool rounds, streaming: relay content as it comes, hold tool-call deltas until a round's
end decides, answer internal calls and continue the same stream under one response id.

A round that breaks off, stops short, sends malformed events or fails to open is handled here too:
the client's stream ends with an OpenAI-shaped error event (no `[DONE]`) and the record names why.
"""

from __future__ import annotations

import copy
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from proxy import faults, telemetry
from proxy.archive import ExchangeRecord
from proxy.errors import CtxProxyError
from proxy.rounds import Conversation, RoundsContext, add_usage, begin_round, new_round, split_calls
from proxy.sse import DONE, EventSplitter, event_data, joined_calls
from proxy.upstream import Upstream
from proxy.upstream_response import TransportError, UpstreamResponse
from proxy.wire import Turn


@dataclass
class RoundState:
    """What one streamed round left behind once its events were relayed or held back."""

    content: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)  # (name and arguments: see `pieces`)
    # each call's name and arguments deltas, joined when the calls are read (sse.joined_calls)
    pieces: dict[int, tuple[list[str], list[str]]] = field(default_factory=dict)
    finish: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    response_id: str | None = None
    done: bool = False  # [DONE] seen
    error: Any = None  # an `error` object the upstream put in the stream (relayed; the stream ends)
    malformed: str | None = None  # the first event the proxy could not read (relayed untouched)
    cut_tail: bool = False  # the upstream stopped mid-event


def sse_bytes(obj: Any) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else orjson.dumps(obj)) + b"\n\n"


async def open_stream(rc: RoundsContext, content: bytes) -> UpstreamResponse:
    return await telemetry.upstream_call(rc, rc.upstream.open("POST", rc.path, rc.query, rc.headers, content))


class Framer(Protocol):
    """One client stream's event handling in its wire format, round after round (see ChatFramer)."""

    def relay(self, response: UpstreamResponse, record: ExchangeRecord, round_no: int,
              cap: int) -> AsyncIterator[bytes]: ...

    def end(self, broke: TransportError | None, record: ExchangeRecord) -> bytes | None: ...

    def calls(self) -> list[dict[str, Any]]: ...

    def turn(self) -> Turn: ...

    def finish(self, client_calls: list[dict[str, Any]], dropped_internal: bool,
               limit: int) -> list[bytes]: ...

    def failed_round(self, body: bytes, status: int) -> tuple[bytes, str]: ...

    def refusal(self, error: CtxProxyError) -> bytes: ...


async def stream(rc: RoundsContext, first: UpstreamResponse, framer: Framer) -> AsyncIterator[bytes]:
    """Streaming: relay content as it comes; hold tool calls until the round's end decides.

    Tool calls are held (the client cannot act on a half call anyway); if the round called only client
    tools they are released, renumbered, after the content. Internal calls are answered and the next
    round's content continues the same client stream. A round that breaks off, stops short or fails to
    open ends the client's stream with an error event in its format; its record names the cause.
    """
    conversation = Conversation(rc)
    response = first
    record = new_round(rc, conversation)
    between_rounds = False  # internal calls answered, the next round's record not made yet
    record.status, record.upstream_headers_ms = response.status_code, rc.first_headers_ms
    try:
        while True:
            broke: TransportError | None = None
            try:
                async for out in framer.relay(response, record, conversation.round,
                                              rc.upstream.max_response_bytes):
                    yield out
            except TransportError as exc:
                broke = exc
            finally:
                await faults.close_timed(response, record)
            end = framer.end(broke, record)
            if end is not None:
                if end:
                    yield end
                return
            calls = framer.calls()
            internal, client_calls = split_calls(calls)
            if internal and client_calls:
                await conversation.splice(framer.turn().text, calls)
            elif internal and conversation.round < rc.max_rounds:
                between_rounds = True
                await conversation.answer(framer.turn())
                record, content = await begin_round(rc, conversation)
                between_rounds = False
                started = time.perf_counter()
                try:
                    response = await open_stream(rc, content)
                    record.status = response.status_code
                    record.upstream_headers_ms = response.headers_ms
                    body = None if response.status_code == 200 else \
                        await _error_body(response, rc.upstream)
                finally:
                    record.upstream_ms = (time.perf_counter() - started) * 1000  # a 200: at its end
                if body is not None:
                    record.response_body = body
                    event, message = framer.failed_round(body, response.status_code)
                    record.error = (f"upstream answered HTTP {response.status_code} to internal round "
                                    f"{conversation.round}: {message}")
                    yield event
                    return
                continue
            for out in framer.finish(client_calls, bool(internal), rc.max_rounds):
                yield out
            return
    except CtxProxyError as exc:
        if between_rounds:  # refused before the next round was sent
            record = new_round(rc, conversation)
        record.status, record.error = exc.status, exc.message
        yield framer.refusal(exc)
    finally:
        await response.aclose()  # (never suspends: no cancellation can cut it short)


class ChatFramer:
    """Chat completions chunks: content relayed, tool-call deltas held, one response id and one [DONE]."""

    def __init__(self) -> None:
        self.state = RoundState()
        self.response_id: str | None = None
        self.usage: dict[str, Any] | None = None

    async def relay(self, response: UpstreamResponse, record: ExchangeRecord, round_no: int,
                    cap: int) -> AsyncIterator[bytes]:
        self.state = RoundState()
        async for out in _relay_round(response, record, self.state, round_no, self.response_id, cap):
            yield out

    def end(self, broke: TransportError | None, record: ExchangeRecord) -> bytes | None:
        end = _round_end(self.state, broke, record)
        if end is None:
            self.response_id = self.response_id or self.state.response_id
            self.usage = add_usage(self.usage, self.state.usage)
        return end

    def calls(self) -> list[dict[str, Any]]:
        return joined_calls(self.state.calls, self.state.pieces)

    def turn(self) -> Turn:
        text, calls = "".join(self.state.content) or None, self.calls()
        return Turn(text, calls, {"role": "assistant", "content": text, "tool_calls": calls})

    def finish(self, client_calls: list[dict[str, Any]], dropped_internal: bool, limit: int) -> list[bytes]:
        return _finish_round(self.state, client_calls, dropped_internal, self.response_id, self.usage, limit)

    def failed_round(self, body: bytes, status: int) -> tuple[bytes, str]:
        error = _error_of(body, status)
        return sse_bytes({"error": error}), str(error["message"])

    def refusal(self, error: CtxProxyError) -> bytes:
        return sse_bytes(error.body())


def _round_end(state: RoundState, broke: TransportError | None, record: ExchangeRecord) -> bytes | None:
    """None when the round is whole; otherwise how the client's stream ends: b"" (the upstream's own
    error event was relayed) or our error event. Sets the record's error either way."""
    if state.malformed:
        record.error = f"malformed upstream event relayed untouched: {state.malformed}"
    if state.error is not None:
        record.error = f"upstream sent an error in the stream: {faults.error_message(state.error)}"
        return b""
    if broke is not None:
        code, message = faults.stream_failure(broke)
        if state.done:
            record.error = f"{message} (after [DONE])"
            return None
    elif state.done or state.finish is not None:
        return None
    else:
        code, message = faults.STREAM_BROKEN, faults.CUT_SHORT
    if state.cut_tail:
        message += " (mid-event)"
    record.error = message
    return faults.error_event(message, code)


async def _relay_round(response: UpstreamResponse, record: ExchangeRecord, state: RoundState, round_no: int,
                       response_id: str | None, cap: int) -> AsyncIterator[bytes]:
    splitter = EventSplitter()
    async for chunk in response.aiter_raw():
        record.keep_chunk(chunk, cap)
        for event in splitter.feed(chunk):
            out = _event(event, state, round_no, response_id)
            if out:
                yield out
            if state.error is not None:
                return
    tail = splitter.rest()
    if faults.complete_tail(tail):  # the last event came without its blank line
        out = _event(tail.rstrip(b"\r\n"), state, round_no, response_id)
        if out:
            yield out
    elif tail.strip():
        state.cut_tail = True


def _event(event: bytes, state: RoundState, round_no: int, response_id: str | None) -> bytes | None:
    """What one upstream event becomes for the client: itself, a rewritten copy, or nothing (held)."""
    data = event_data(event)
    if data is None:
        return event + b"\n\n"  # comments / keep-alives
    if data.strip() == DONE:
        state.done = True
        return None  # one [DONE] at the very end
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        state.malformed = state.malformed or f"data is not JSON: {data[:120]!r}"
        return event + b"\n\n"
    if isinstance(obj, dict) and obj.get("error"):
        state.error = obj["error"]
        return event + b"\n\n"
    problem = _chunk_problem(obj)
    if problem:
        state.malformed = state.malformed or f"{problem}: {data[:120]!r}"
        return event + b"\n\n"
    if isinstance(obj.get("id"), str):
        state.response_id = state.response_id or obj["id"]
    if _hold(obj, state):
        return None
    if round_no and response_id:
        obj["id"] = response_id
        return sse_bytes(obj)
    return event + b"\n\n"  # untouched bytes


def _chunk_problem(obj: Any) -> str | None:
    """Why a parsed event is not a chat.completion.chunk the proxy can read, or None."""
    if not isinstance(obj, dict):
        return f"a JSON {type(obj).__name__}, not an object"
    if obj.get("usage") is not None and not isinstance(obj["usage"], dict):
        return "usage is not an object"
    choices = obj.get("choices")
    if choices is None or choices == []:
        return None
    if not isinstance(choices, list):
        return "choices is not a list"
    choice = choices[0]
    if not isinstance(choice, dict):
        return "choices[0] is not an object"
    delta = choice.get("delta")
    if delta is None:
        return None
    if not isinstance(delta, dict):
        return "delta is not an object"
    calls = delta.get("tool_calls")
    if calls is None:
        return None
    if not isinstance(calls, list):
        return "tool_calls is not a list"
    for call in calls:
        if not isinstance(call, dict):
            return "a tool call is not an object"
        index = call.get("index", 0)
        if isinstance(index, bool) or not isinstance(index, int):
            return "a tool call index is not an integer"
        function = call.get("function")
        if call.get("id") is not None and not isinstance(call["id"], str):
            return "a tool call id is not a string"
        if function is None:
            continue
        if not isinstance(function, dict) or any(
                function.get(key) is not None and not isinstance(function[key], str)
                for key in ("name", "arguments")):
            return "a tool call function is not {name, arguments} strings"
    return None


def _hold(obj: dict[str, Any], state: RoundState) -> bool:
    """Keep tool-call deltas, the finish chunk and the usage chunk back; let content through."""
    if obj.get("usage") and not obj.get("choices"):
        state.usage = obj["usage"]
        return True
    choices = obj.get("choices") or []
    if not choices:
        return False
    choice = choices[0]
    delta = choice.get("delta") or {}
    if isinstance(delta.get("content"), str):
        state.content.append(delta["content"])
    held = False
    for call in delta.get("tool_calls") or ():
        index = call.get("index", 0)
        slot = state.calls.setdefault(index, {
            "id": None, "type": "function", "function": {"name": "", "arguments": ""}})
        slot["id"] = call.get("id") or slot["id"]
        function = call.get("function") or {}
        names, arguments = state.pieces.setdefault(index, ([], []))
        names.append(function.get("name") or "")
        arguments.append(function.get("arguments") or "")
        held = True
    if obj.get("usage"):
        state.usage = obj["usage"]
    if choice.get("finish_reason"):
        state.finish = obj
        return True
    if held and isinstance(delta.get("content"), str) and delta["content"]:
        return False  # rare: text and call deltas in one chunk; the text must still reach the client
    return held


def _finish_round(state: RoundState, client_calls: list[dict[str, Any]], dropped_internal: bool,
                  response_id: str | None, usage: dict[str, Any] | None, limit: int) -> list[bytes]:
    out: list[bytes] = []
    template = state.finish or {"object": "chat.completion.chunk", "choices": [{"index": 0}]}
    base = {k: v for k, v in template.items() if k not in ("choices", "usage")}
    if response_id:
        base["id"] = response_id
    for index, call in enumerate(client_calls):
        delta = {"tool_calls": [{"index": index, "id": call["id"], "type": call.get("type", "function"),
                                 "function": call["function"]}]}
        out.append(sse_bytes(base | {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}))
    if dropped_internal and not client_calls and not state.content:
        note = f"(ctxproxy: stopped after {limit} read_tool_result rounds without an answer)"
        out.append(sse_bytes(base | {"choices": [{"index": 0, "delta": {"content": note},
                                                  "finish_reason": None}]}))
    finish = copy.deepcopy(template)
    finish.update(base)
    choices = finish.get("choices") or [{"index": 0}]
    choices[0].setdefault("delta", {})
    if dropped_internal:
        choices[0]["delta"] = {}
        choices[0]["finish_reason"] = "tool_calls" if client_calls else "stop"
    finish["choices"] = choices
    if finish.get("usage") and usage:
        finish["usage"] = usage
    out.append(sse_bytes(finish))
    if usage and not (state.finish or {}).get("usage"):
        out.append(sse_bytes(base | {"choices": [], "usage": usage}))
    out.append(sse_bytes(DONE))
    return out


def _error_of(body: bytes, status: int) -> dict[str, Any]:
    """An OpenAI-shaped error object for an upstream error answer: the upstream's own when it has one."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed = None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return {"type": "upstream_error", "code": None, "param": None} | error
    text = error if isinstance(error, str) else body.decode("utf-8", "replace")[:2000]
    return {"message": f"upstream answered HTTP {status}: {text}", "type": "upstream_error",
            "code": "upstream_http_error", "param": None}


async def _error_body(response: UpstreamResponse, upstream: Upstream) -> bytes:
    """The body of a failed later round (capped: only its start is shown to the client and kept)."""
    body, rest = await faults.read_answer(response, upstream.base_url, upstream.max_response_bytes)
    if rest is not None:
        await rest.aclose()  # type: ignore[attr-defined]  # an async generator
    return body
