"""Internal tool rounds: when the model calls a proxy tool, answer it and ask the model again.

The client sees one response: no internal call, no internal result, one response id, one [DONE].
Every upstream call (round) is archived as its own exchange, internal messages included.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import orjson

from proxy.archive import ExchangeRecord
from proxy.budget import GateResult, padded
from proxy.errors import CtxProxyError
from proxy.internal_tools import ToolContext, execute, is_internal_call
from proxy.sse import DONE, EventSplitter, event_data
from proxy.upstream import Upstream

CHARS_PER_TOKEN = 3  # conservative: a page must fit the room left in the window


@dataclass
class RoundsContext:
    upstream: Upstream
    path: str
    query: bytes
    headers: dict[str, str]
    body: dict[str, Any]  # the client's request body (params reused every round)
    original: list[dict[str, Any]]  # client messages
    forwarded: list[dict[str, Any]]  # after the pipeline
    tools: list[Any] | None
    first_content: bytes  # the exact bytes of round 1
    tool_context: ToolContext
    max_rounds: int
    window: int
    pad_pct: float
    gate: Callable[[list[dict[str, Any]], list[dict[str, Any]], frozenset[str]], GateResult]
    count: Callable[[list[dict[str, Any]], list[Any] | None], int]
    new_record: Callable[[list[dict[str, Any]], GateResult | None], ExchangeRecord]
    records: list[ExchangeRecord] = field(default_factory=list)


class Conversation:
    """The growing forwarded conversation of one client request across internal rounds."""

    def __init__(self, rc: RoundsContext) -> None:
        self.rc = rc
        self.original = list(rc.original)
        self.forwarded = list(rc.forwarded)
        self.internal_ids: set[str] = set()
        self.round = 0

    def content(self) -> bytes:
        if self.round == 0:
            return self.rc.first_content
        body = dict(self.rc.body)
        body["messages"] = self.forwarded
        if self.rc.tools is not None:
            body["tools"] = self.rc.tools
        return orjson.dumps(body)

    async def answer(self, content: str | None, calls: list[dict[str, Any]]) -> GateResult:
        """Append the internal calls and their results, then gate the next round."""
        assistant: dict[str, Any] = {"role": "assistant", "content": content or None, "tool_calls": calls}
        self.original.append(assistant)
        self.forwarded.append(assistant)
        for call in calls:
            room = self.rc.window - padded(self.rc.count(self.forwarded, self.rc.tools), self.rc.pad_pct)
            page = min(self.rc.tool_context.page_chars, int(room * 0.8) * CHARS_PER_TOKEN)
            if page < 400:
                text = "error: no room left in the context window for more retrieved text"
            else:
                # Archive searches and lookups touch SQLite: keep them off the event loop.
                context = dataclasses.replace(self.rc.tool_context, page_chars=page)
                text = await anyio.to_thread.run_sync(execute, call, context)
            result = {"role": "tool", "tool_call_id": call.get("id"), "content": text}
            self.original.append(result)
            self.forwarded.append(result)
            self.internal_ids.add(str(call.get("id")))
        gated = self.rc.gate(self.original, self.forwarded, frozenset(self.internal_ids))
        self.forwarded = gated.messages
        self.round += 1
        return gated


def split_calls(calls: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    internal = [c for c in calls if is_internal_call(c)]
    return internal, [c for c in calls if not is_internal_call(c)]


def add_usage(total: dict[str, Any] | None, usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """Sum token usage over rounds, so the client sees what the whole answer cost."""
    if not usage:
        return total
    if total is None:
        return copy.deepcopy(usage)
    for key, value in usage.items():
        if isinstance(value, int) and isinstance(total.get(key), int):
            total[key] += value
        elif isinstance(value, dict) and isinstance(total.get(key), dict):
            add_usage(total[key], value)
    return total


async def complete(rc: RoundsContext) -> tuple[httpx.Response, bytes]:
    """Non-streaming: loop until the model answers without internal calls (or rounds run out)."""
    conversation = Conversation(rc)
    usage: dict[str, Any] | None = None
    while True:
        record = rc.new_record(conversation.forwarded, None)
        started = time.perf_counter()
        try:
            response = await rc.upstream.open("POST", rc.path, rc.query, rc.headers, conversation.content())
            payload = await Upstream.read(response, rc.upstream.base_url)
        finally:
            record.upstream_ms = (time.perf_counter() - started) * 1000
            rc.records.append(record)
        record.status, record.response_body = response.status_code, payload
        if response.status_code != 200:
            return response, payload
        try:
            data = orjson.loads(payload)
            message = data["choices"][0]["message"]
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
            return response, payload
        usage = add_usage(usage, data.get("usage"))
        internal, client_calls = split_calls(message.get("tool_calls") or [])
        if not internal:
            break
        if conversation.round >= rc.max_rounds:
            _strip_internal(data, message, client_calls, rc.max_rounds)
            break
        await conversation.answer(message.get("content"), internal)
    if conversation.round:
        if usage is not None:
            data["usage"] = usage
        payload = orjson.dumps(data)
    return response, payload


def _strip_internal(data: dict[str, Any], message: dict[str, Any], client_calls: list[dict[str, Any]],
                    limit: int) -> None:
    if client_calls:
        message["tool_calls"] = client_calls
    else:
        message.pop("tool_calls", None)
        message["content"] = (message.get("content") or "") or \
            f"(ctxproxy: stopped after {limit} read_tool_result rounds without an answer)"
        data["choices"][0]["finish_reason"] = "stop"


# ------------------------------------------------------------------------------------- streaming

@dataclass
class RoundState:
    """What one streamed round left behind once its events were relayed or held back."""

    content: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    response_id: str | None = None


def sse_bytes(obj: Any) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else orjson.dumps(obj)) + b"\n\n"


async def open_stream(rc: RoundsContext, content: bytes) -> httpx.Response:
    return await rc.upstream.open("POST", rc.path, rc.query, rc.headers, content)


async def stream(rc: RoundsContext, first: httpx.Response) -> AsyncIterator[bytes]:
    """Streaming: relay content as it comes; hold tool-call deltas until the round's end decides.

    Tool-call deltas are buffered (the client cannot act on a half call anyway); if the round called
    only client tools they are released, renumbered, after the content. Internal calls are answered
    and the next round's content continues the same stream under the first response id.
    """
    conversation = Conversation(rc)
    response, response_id, usage = first, None, None
    try:
        while True:
            record = rc.new_record(conversation.forwarded, None)
            record.status = response.status_code
            rc.records.append(record)
            state = RoundState()
            async for out in _relay_round(response, record, state, conversation.round, response_id):
                yield out
            response_id = response_id or state.response_id
            usage = add_usage(usage, state.usage)
            calls = [state.calls[i] for i in sorted(state.calls)]
            internal, client_calls = split_calls(calls)
            if internal and conversation.round < rc.max_rounds:
                await conversation.answer("".join(state.content), internal)
                await response.aclose()
                response = await open_stream(rc, conversation.content())
                if response.status_code != 200:
                    body = await Upstream.read(response, rc.upstream.base_url)
                    yield sse_bytes({"error": _error_of(body, response.status_code)})
                    yield sse_bytes(DONE)
                    return
                continue
            for out in _finish_round(state, client_calls, bool(internal), response_id, usage, rc.max_rounds):
                yield out
            return
    except CtxProxyError as exc:
        yield sse_bytes(exc.body())
        yield sse_bytes(DONE)
    finally:
        with anyio.CancelScope(shield=True):
            await response.aclose()


async def _relay_round(response: httpx.Response, record: ExchangeRecord, state: RoundState, round_no: int,
                       response_id: str | None) -> AsyncIterator[bytes]:
    splitter = EventSplitter()
    async for chunk in response.aiter_raw():
        record.response_chunks.append(chunk)
        for event in splitter.feed(chunk):
            data = event_data(event)
            if data is None:
                yield event + b"\n\n"  # comments / keep-alives
                continue
            if data.strip() == DONE:
                continue  # one [DONE] at the very end
            try:
                obj = orjson.loads(data)
            except orjson.JSONDecodeError:
                yield event + b"\n\n"
                continue
            state.response_id = state.response_id or obj.get("id")
            if _hold(obj, state):
                continue
            if round_no and response_id:
                obj["id"] = response_id
                yield sse_bytes(obj)
            else:
                yield event + b"\n\n"  # untouched bytes


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
        slot = state.calls.setdefault(call.get("index", 0), {
            "id": None, "type": "function", "function": {"name": "", "arguments": ""}})
        slot["id"] = call.get("id") or slot["id"]
        function = call.get("function") or {}
        slot["function"]["name"] += function.get("name") or ""
        slot["function"]["arguments"] += function.get("arguments") or ""
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


def _error_of(body: bytes, status: int) -> Any:
    try:
        parsed = orjson.loads(body)
        return parsed.get("error", parsed) if isinstance(parsed, dict) else parsed
    except orjson.JSONDecodeError:
        return {"message": body.decode("utf-8", "replace")[:2000], "code": status}
